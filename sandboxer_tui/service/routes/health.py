"""Health: the process answers, the database is ready, the backends as the service reaches
them, and `sbx doctor`'s report."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from sandboxer_tui.service import schemas as s
from sandboxer_tui.service.deps import ERRORS, Read, Service

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process answers")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="The database answers, schema current",
            responses={503: ERRORS[503]})
async def readyz(service: Service) -> dict[str, str]:
    await service.client.ready()
    return {"status": "ready"}


@router.get("/v1/doctor", summary="Backends, the database, versions", responses=ERRORS)
async def doctor(who: Read) -> dict[str, Any]:
    return await who.client.doctor()


@router.get("/v1/backends",
            summary="Each backend as the service reaches it: loaded, capabilities, health",
            response_model=list[s.BackendStatus], responses=ERRORS)
async def backends(who: Read,
                   name: Annotated[list[str], Query(
                       max_length=64, description="a backend; repeat for several "
                                                  "(default: every registered one)")] = [],  # noqa: B006
                   check: bool = True,
                   timeout: Annotated[float, Query(
                       gt=0, le=60, description="seconds a backend has to answer")] = 5.0,
                   ) -> JSONResponse:
    statuses = await who.client.backends(name or None, check=check, timeout=timeout)
    return JSONResponse([status.to_dict() for status in statuses])
