"""Warm pools (docs/pools.md): list them, set a size, drain one."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from sandboxer_tui.service import schemas as s
from sandboxer_tui.service.deps import ERRORS, Admin, Metrics, Read

router = APIRouter(tags=["pools"])


@router.get("/v1/pools", summary="The warm pools", response_model=list[s.PoolRecord],
            responses=ERRORS)
async def pools(who: Read) -> JSONResponse:
    return JSONResponse([p.to_dict() for p in await who.client.pools()])


@router.put("/v1/pools/{profile}", summary="Set a pool's size (filled or shrunk before the "
                                           "answer)",
            response_model=s.PoolRecord, responses=ERRORS)
async def set_pool_size(who: Admin, profile: str, body: s.PoolSize) -> JSONResponse:
    return JSONResponse((await who.client.set_pool_size(profile, body.size)).to_dict())


@router.post("/v1/pools/{profile}/drain", summary="Destroy a pool's members and keep it empty",
             response_model=s.PoolDrained, responses=ERRORS)
async def drain_pool(who: Admin, metrics: Metrics, profile: str) -> dict[str, Any]:
    return await metrics.timed("drain", who.client.drain_pool(profile), backend="many")
