"""Evidence: a sandbox's supervision bundle, signed by the service on request, and the
public key it signs with (docs/evidence.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from sandboxer.core.rules.errors import Conflict
from sandboxer.service import evidence_public_key
from sandboxer_tui.service.deps import ERRORS, Read, Service

router = APIRouter(tags=["sandboxes"])


@router.get("/v1/sandboxes/{ref}/evidence", summary="The supervision evidence bundle",
            responses=ERRORS)
async def evidence(who: Read, service: Service, ref: str,
                   signed: Annotated[bool, Query(description=(
                       "a DSSE envelope signed with the service's key (sbx serve "
                       "--evidence-key); 409 when it has none"))] = False) -> JSONResponse:
    box = await who.client.get(ref)
    key = service.evidence_key
    if signed and key is None:
        raise Conflict("this service signs no evidence: start it with sbx serve "
                       "--evidence-key PATH (or sign with your own key)")
    return JSONResponse(await box.evidence(sign=key if signed else None))


@router.get("/v1/evidence/key", summary="The public key the service signs evidence with",
            responses=ERRORS)
async def evidence_key(who: Read, service: Service) -> dict[str, str]:
    if service.evidence_key is None:
        raise Conflict("this service signs no evidence (sbx serve --evidence-key PATH)")
    return evidence_public_key(service.evidence_key)
