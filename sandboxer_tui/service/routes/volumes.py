"""Volumes (docs/volumes.md): create, list, show, remove, and a tree into or out of a volume
without a sandbox. A tenant's key sees only its own volumes: another tenant's is 404."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from sandboxer_tui.service import schemas as s
from sandboxer_tui.service import sse
from sandboxer_tui.service.deps import ERRORS, Metrics, Read, Write
from sandboxer_tui.service.routes.files import TAR, _body, _Incoming

PATH = Annotated[str, Query(description="an absolute path in the volume (/ is its root)")]

router = APIRouter(tags=["volumes"])


@router.post("/v1/volumes", status_code=201, summary="Make an empty volume",
             response_model=s.VolumeRecord, responses=ERRORS)
async def create_volume(who: Write, metrics: Metrics, body: s.CreateVolume) -> JSONResponse:
    who.may_own(body.owner)
    made = await metrics.timed("volume_create", who.client.create_volume(
        body.name, backend=body.backend, labels=body.labels, ttl=body.ttl,
        shared=body.shared, owner=body.owner), backend=body.backend or "docker")
    return JSONResponse(made.to_dict(), status_code=201)


@router.get("/v1/volumes", summary="Volumes, oldest first",
            response_model=list[s.VolumeRecord], responses=ERRORS)
async def volumes(who: Read) -> JSONResponse:
    return JSONResponse([v.to_dict() for v in await who.client.volumes()])


@router.get("/v1/volumes/{ref}", summary="One volume, its size asked of the backend now",
            response_model=s.VolumeRecord, responses=ERRORS)
async def volume(who: Read, ref: str) -> JSONResponse:
    return JSONResponse((await who.client.volume(ref)).to_dict())


@router.delete("/v1/volumes/{ref}", summary="Remove a volume no live sandbox mounts",
               response_model=s.VolumeRecord, responses=ERRORS)
async def remove_volume(who: Write, metrics: Metrics, ref: str) -> JSONResponse:
    found = await who.client.volume(ref)
    gone = await metrics.timed("volume_remove", who.client.remove_volume(found.id),
                               backend=found.backend)
    return JSONResponse(gone.to_dict())


@router.put("/v1/volumes/{ref}/files/tree",
            summary="Unpack a tar stream into a folder of a volume (made if missing)",
            response_model=s.FileTransfer, openapi_extra=_body(TAR), responses=ERRORS)
async def put_tree(who: Write, metrics: Metrics, request: Request, ref: str,
                   path: PATH) -> JSONResponse:
    body = _Incoming(request)
    done = await body.run(metrics.timed("volume_tree_put", who.client.put_volume_tree(
        ref, path, body.chunks())))
    return JSONResponse(done.to_dict())


@router.get("/v1/volumes/{ref}/files/tree",
            summary="A file or folder of a volume as a tar stream (one top entry)",
            response_class=Response, responses={
                **ERRORS, 200: {"description": "a tar stream", "content": {TAR: {}}}})
async def get_tree(who: Write, ref: str, path: PATH) -> Response:
    chunks = await sse.primed(who.client.get_volume_tree(ref, path))
    return StreamingResponse(chunks, media_type=TAR)
