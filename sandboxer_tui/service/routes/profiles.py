"""Profiles: those on the service's search path, one resolved, and a document checked."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from sandboxer.core.rules.profiles import dump, refuse_host_files
from sandboxer_tui.service import schemas as s
from sandboxer_tui.service.deps import ERRORS, Read

router = APIRouter(tags=["profiles"])


@router.get("/v1/profiles", summary="The profiles on the search path",
            response_model=list[s.ProfileInfo], responses=ERRORS)
async def profiles(who: Read) -> JSONResponse:
    return JSONResponse([p.to_dict() for p in await who.client.profiles()])


@router.post("/v1/profiles/validate",
             summary="Check a profile document (nothing is written)", responses=ERRORS)
async def validate(who: Read, body: dict[str, Any]) -> dict[str, Any]:
    refuse_host_files(body)
    return {"ok": True, "profile": dump(await who.client.check_profile(body))}


@router.get("/v1/profiles/{name}", summary="A profile, resolved (secrets as references)",
            responses=ERRORS)
async def profile(who: Read, name: str) -> dict[str, Any]:
    resolved = await who.client.profile(name)
    source = next((p.source for p in await who.client.profiles() if p.name == name), None)
    return {**dump(resolved), "source": source}
