"""A sandbox's files: a file or a whole tree (a tar stream) in and out, streamed both ways, and
list, stat, remove, mkdir and rename. A body in is handed to the library chunk by chunk as
it comes; a body out leaves as the library gives it: neither is ever held whole here. Every
route needs a write key: each runs in the sandbox and counts as its activity."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from sandboxer.core.rules.errors import BadInput
from sandboxer_tui.service import schemas as s
from sandboxer_tui.service import sse
from sandboxer_tui.service.deps import ERRORS, Metrics, Write

OCTETS = "application/octet-stream"
TAR = "application/x-tar"
PATH = Annotated[str, Query(description="an absolute path in the sandbox")]

router = APIRouter(tags=["files"])


def _body(kind: str) -> dict:
    return {"requestBody": {"required": True, "content": {
        kind: {"schema": {"type": "string", "format": "binary"}}}}}


def _mode(mode: str | None) -> int | None:
    """`0644` (octal digits) as permission bits."""
    if mode is None:
        return None
    try:
        bits = int(mode, 8)
    except ValueError:
        bits = -1
    if not 0 <= bits <= 0o7777:
        raise BadInput(f"bad mode {mode[:20]!r}: octal permission bits, e.g. 0644")
    return bits


class _Incoming:
    """The request's body as an async iterator of chunks, read as the library asks for
    them. An error of the body itself (too large: 413; the client gone) is kept, so the
    route answers with it whatever the library made of it."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.error: Exception | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        from starlette.requests import ClientDisconnect

        try:
            async for chunk in self.request.stream():
                if chunk:
                    yield chunk
        except HTTPException as exc:
            self.error = exc
            raise
        except ClientDisconnect:  # nobody to answer: no traceback in the log for it
            self.error = BadInput("the client went away before it sent the whole body")
            raise self.error from None

    async def run(self, work):
        try:
            return await work
        except Exception:
            if self.error is not None:
                raise self.error from None
            raise


@router.put("/v1/sandboxes/{ref}/files", summary="Write a file (the body is its bytes)",
            response_model=s.FileTransfer, openapi_extra=_body(OCTETS), responses=ERRORS)
async def write_file(who: Write, metrics: Metrics, request: Request, ref: str, path: PATH,
                     mode: Annotated[str | None, Query(
                         description="octal permission bits, e.g. 0644")] = None,
                     ) -> JSONResponse:
    bits = _mode(mode)
    box = await who.client.get(ref)
    body = _Incoming(request)
    done = await body.run(metrics.timed("file_write", box.files.write(
        path, body.chunks(), mode=bits), backend=box.backend))
    return JSONResponse(done.to_dict())


@router.get("/v1/sandboxes/{ref}/files", summary="Read a file (streamed)",
            response_class=Response, responses={
                **ERRORS, 200: {"description": "the file's bytes",
                                "content": {OCTETS: {}}}})
async def read_file(who: Write, ref: str, path: PATH) -> Response:
    box = await who.client.get(ref)
    chunks = await sse.primed(box.files.stream(path))
    return StreamingResponse(chunks, media_type=OCTETS)


@router.put("/v1/sandboxes/{ref}/files/tree",
            summary="Unpack a tar stream into a folder (made if missing)",
            response_model=s.FileTransfer, openapi_extra=_body(TAR), responses=ERRORS)
async def put_tree(who: Write, metrics: Metrics, request: Request, ref: str,
                   path: PATH) -> JSONResponse:
    box = await who.client.get(ref)
    body = _Incoming(request)
    done = await body.run(metrics.timed("tree_put", box.files.put_tree(
        path, body.chunks()), backend=box.backend))
    return JSONResponse(done.to_dict())


@router.get("/v1/sandboxes/{ref}/files/tree",
            summary="A file or a folder as a tar stream (one top entry, its base name)",
            response_class=Response, responses={
                **ERRORS, 200: {"description": "a tar stream", "content": {TAR: {}}}})
async def get_tree(who: Write, ref: str, path: PATH) -> Response:
    box = await who.client.get(ref)
    chunks = await sse.primed(box.files.get_tree(path))
    return StreamingResponse(chunks, media_type=TAR)


@router.get("/v1/sandboxes/{ref}/files/list", summary="A folder's entries",
            response_model=list[s.FileInfo], responses=ERRORS)
async def list_files(who: Write, ref: str, path: PATH,
                     depth: Annotated[int, Query(ge=1, le=64)] = 1) -> JSONResponse:
    box = await who.client.get(ref)
    return JSONResponse([f.to_dict() for f in await box.files.list(path, depth=depth)])


@router.get("/v1/sandboxes/{ref}/files/stat", summary="One path's type, size, mode and time",
            response_model=s.FileInfo, responses=ERRORS)
async def stat_file(who: Write, ref: str, path: PATH) -> JSONResponse:
    box = await who.client.get(ref)
    return JSONResponse((await box.files.stat(path)).to_dict())


@router.delete("/v1/sandboxes/{ref}/files", status_code=204,
               summary="Remove a file (a folder with recursive)", response_class=Response,
               responses=ERRORS)
async def remove_file(who: Write, ref: str, path: PATH, recursive: bool = False) -> Response:
    box = await who.client.get(ref)
    await box.files.remove(path, recursive=recursive)
    return Response(status_code=204)


@router.post("/v1/sandboxes/{ref}/files/mkdir", status_code=204, summary="Make a folder",
             response_class=Response, responses=ERRORS)
async def make_dir(who: Write, ref: str, body: s.MakeDir) -> Response:
    box = await who.client.get(ref)
    await box.files.mkdir(body.path, parents=body.parents)
    return Response(status_code=204)


@router.post("/v1/sandboxes/{ref}/files/rename", status_code=204,
             summary="Rename or move a path", response_class=Response, responses=ERRORS)
async def rename_file(who: Write, ref: str, body: s.Rename) -> Response:
    box = await who.client.get(ref)
    await box.files.rename(body.src, body.dst)
    return Response(status_code=204)
