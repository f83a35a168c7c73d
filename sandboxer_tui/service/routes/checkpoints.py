"""Checkpoints: snapshot a sandbox, list, prune, import and export archives, show, remove,
and restore or fork new sandboxes from one."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from sandboxer_tui.service import schemas as s
from sandboxer_tui.service.deps import ERRORS, Admin, Metrics, Read, Write

ARCHIVE = "application/gzip"
EXPORT_CHUNK = 1024**2  # an exported archive leaves in pieces this big

router = APIRouter(tags=["checkpoints"])


@router.post("/v1/sandboxes/{ref}/snapshot", status_code=201,
             summary="Save a sandbox's filesystem as a checkpoint",
             response_model=s.CheckpointRecord, responses=ERRORS)
async def snapshot(who: Write, metrics: Metrics, ref: str,
                   body: Annotated[s.Snapshot | None, Body()] = None) -> JSONResponse:
    box = await who.client.get(ref)
    ckpt = await metrics.timed("snapshot", box.snapshot(body.name if body else None),
                               backend=box.backend)
    return JSONResponse(ckpt.to_dict(), status_code=201)


@router.get("/v1/checkpoints", summary="Checkpoints, oldest first",
            response_model=list[s.CheckpointRecord], responses=ERRORS)
async def checkpoints(who: Read, sandbox: str | None = None) -> JSONResponse:
    ref = (await who.client.get(sandbox)).id if sandbox else None
    return JSONResponse([c.to_dict() for c in await who.client.checkpoints(ref)])


@router.post("/v1/checkpoints/prune", summary="Remove expired checkpoints", responses=ERRORS)
async def prune(who: Admin, metrics: Metrics) -> dict[str, list[str]]:
    return {"removed": await metrics.timed("prune", who.client.prune_checkpoints(),
                                           backend="many")}


@router.post("/v1/checkpoints/import", status_code=201,
             summary="Bring in an archive made by export", response_model=s.CheckpointRecord,
             openapi_extra={"requestBody": {"required": True, "content": {
                 ARCHIVE: {"schema": {"type": "string", "format": "binary"}}}}},
             responses=ERRORS)
async def import_checkpoint(who: Write, metrics: Metrics, request: Request,
                            name: str | None = None) -> JSONResponse:
    folder = tempfile.mkdtemp(prefix="sbx-import-")
    path = os.path.join(folder, "checkpoint.tar.gz")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:  # capped as it comes (limits.py: 413)
            async for piece in request.stream():
                out.write(piece)
        ckpt = await metrics.timed("import", who.client.import_checkpoint(path, name=name))
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(folder)
    return JSONResponse(ckpt.to_dict(), status_code=201)


@router.get("/v1/checkpoints/{ref}", summary="One checkpoint",
            response_model=s.CheckpointRecord, responses=ERRORS)
async def checkpoint(who: Read, ref: str) -> JSONResponse:
    return JSONResponse((await who.client.checkpoint(ref)).to_dict())


@router.delete("/v1/checkpoints/{ref}", summary="Remove a checkpoint and its artifact",
               response_model=s.CheckpointRecord, responses=ERRORS)
async def remove_checkpoint(who: Write, metrics: Metrics, ref: str) -> JSONResponse:
    ckpt = await who.client.checkpoint(ref)
    await metrics.timed("remove-checkpoint", ckpt.remove(), backend=ckpt.backend)
    return JSONResponse(ckpt.to_dict())


@router.post("/v1/checkpoints/{ref}/restore", status_code=201,
             summary="A new sandbox from a checkpoint", response_model=s.SandboxRecord,
             responses=ERRORS)
async def restore(who: Write, metrics: Metrics, ref: str,
                  body: Annotated[s.Restore | None, Body()] = None) -> JSONResponse:
    body = body or s.Restore()
    who.may_own(body.owner)
    ckpt = await who.client.checkpoint(ref)
    box = await metrics.timed("restore", ckpt.restore(
        ttl=body.ttl, name=body.name, labels=body.labels, owner=body.owner,
        task=body.task, profile=body.profile))
    return JSONResponse(box.to_dict(), status_code=201)


@router.post("/v1/checkpoints/{ref}/fork", status_code=201,
             summary="n sandboxes from a checkpoint", response_model=list[s.SandboxRecord],
             responses=ERRORS)
async def fork(who: Write, metrics: Metrics, ref: str, body: s.Fork) -> JSONResponse:
    who.may_own(body.owner)
    ckpt = await who.client.checkpoint(ref)
    boxes = await metrics.timed("fork", ckpt.fork(body.n, ttl=body.ttl, labels=body.labels,
                                                   owner=body.owner, task=body.task))
    return JSONResponse([b.to_dict() for b in boxes], status_code=201)


@router.get("/v1/checkpoints/{ref}/archive",
            summary="Export: the checkpoint as a portable .tar.gz", response_class=Response,
            responses={**ERRORS, 200: {"content": {ARCHIVE: {}}}})
async def export(who: Write, metrics: Metrics, ref: str) -> Response:
    ckpt = await who.client.checkpoint(ref)
    folder = tempfile.mkdtemp(prefix="sbx-export-")
    path = os.path.join(folder, "checkpoint.tar.gz")
    try:
        await metrics.timed("export", ckpt.export(path), backend=ckpt.backend)
        archive = open(path, "rb")  # noqa: ASYNC230, SIM115 (a local file, read below)
    finally:  # gone from the disk at once; the open file reads on until it is closed
        with contextlib.suppress(OSError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(folder)
    size = os.fstat(archive.fileno()).st_size

    async def pieces() -> AsyncIterator[bytes]:
        """The archive a piece at a time: a 158 MB export once held it all in memory."""
        with archive:
            while piece := await asyncio.to_thread(archive.read, EXPORT_CHUNK):
                yield piece

    return StreamingResponse(pieces(), media_type=ARCHIVE, headers={
        "Content-Length": str(size),
        "Content-Disposition": f'attachment; filename="{ckpt.id}.tar.gz"'})

