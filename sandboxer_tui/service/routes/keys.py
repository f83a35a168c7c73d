"""The service's API keys (admin only): list them (never the keys themselves), make one
(shown once), revoke one."""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from sandboxer_tui.service import schemas as s
from sandboxer_tui.service.deps import ERRORS, Admin

router = APIRouter(tags=["keys"])


@router.get("/v1/api-keys", summary="The service's keys (never the keys themselves)",
            response_model=list[s.ApiKey], responses=ERRORS)
async def api_keys(who: Admin) -> JSONResponse:
    return JSONResponse(await who.client.api_keys())


@router.post("/v1/api-keys", status_code=201, summary="A new key (shown once)",
             response_model=s.NewApiKey, responses=ERRORS)
async def create_api_key(who: Admin, body: s.CreateKey) -> JSONResponse:
    ttl = None if body.max_ttl_s is None else timedelta(seconds=body.max_ttl_s)
    key, token = await who.client.create_api_key(
        body.scope, owner=body.owner, max_sandboxes=body.max_sandboxes, max_ttl=ttl,
        max_execs=body.max_execs)
    return JSONResponse({"key": key, "token": token}, status_code=201)


@router.delete("/v1/api-keys/{key_id}", summary="Revoke a key", response_model=s.ApiKey,
               responses=ERRORS)
async def revoke_api_key(who: Admin, key_id: str) -> JSONResponse:
    return JSONResponse(await who.client.revoke_api_key(key_id))
