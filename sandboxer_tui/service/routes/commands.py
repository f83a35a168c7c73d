"""A sandbox's processes: run a command (its result, or its output as it comes), and the
main process's output."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response, StreamingResponse

from sandboxer import ExecExit, OutputChunk
from sandboxer.core.rules.errors import BadInput, OperationFailed, classify
from sandboxer.service import Scope, output_doc
from sandboxer_tui.service import schemas as s
from sandboxer_tui.service import sse
from sandboxer_tui.service.deps import ERRORS, Accept, Read, Service, Write
from sandboxer_tui.service.metrics import ServiceMetrics

router = APIRouter(tags=["sandboxes"])


@router.post("/v1/sandboxes/{ref}/exec", summary="Run a command",
             response_model=s.ExecResult, responses={
                 **ERRORS, 200: {"description": "the result; with `Accept: text/event-stream`"
                                                ", `stdout` and `stderr` events as the output "
                                                "comes, then one `exit` event",
                                 "content": {"text/event-stream": {}}}})
async def exec_(who: Write, service: Service, ref: str, body: s.Exec,
                accept: Accept = None) -> Response:
    options = dict(timeout=body.timeout, env=body.env, cwd=body.cwd, user=body.user,
                   stdin=_stdin(body.stdin))
    box = await who.client.get(ref)
    if sse.wants_stream(accept):
        items = await sse.primed(box.exec_stream(body.argv, **options))
        return sse.stream(_exec_frames(items, service.metrics, box.backend))
    # the stream form, kept up to the cap: the whole output never sits in the service
    result = await service.metrics.timed("exec", _capped_exec(box.exec_stream(
        body.argv, **options), service.max_exec_output), backend=box.backend)
    return JSONResponse(result)


def _stdin(text: str | None) -> bytes | None:
    """The body's `stdin`, base64."""
    if text is None:
        return None
    import base64
    import binascii

    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise BadInput("bad stdin: base64 (RFC 4648) text") from None


@router.get("/v1/sandboxes/{ref}/logs", summary="The main process's output",
            response_class=Response, responses={
                **ERRORS, 200: {"description": "the output; with `follow` or `Accept: "
                                               "text/event-stream`, `log` events as it comes "
                                               "(`end` when it ends)",
                                "content": {"application/octet-stream": {},
                                            "text/event-stream": {}}}})
async def logs(who: Read, ref: str, follow: bool = False,
               tail: Annotated[int | None, Query(ge=0)] = None,
               accept: Accept = None) -> Response:
    if follow:
        who.require(Scope.WRITE, "following logs (it counts as activity)")
    box = await who.client.get(ref)
    chunks = await sse.primed(box.logs(follow=follow, tail=tail))
    if follow or sse.wants_stream(accept):
        return sse.stream(_log_frames(chunks))
    return StreamingResponse(chunks, media_type="application/octet-stream")


async def _exec_frames(items: AsyncIterator[OutputChunk | ExecExit], metrics: ServiceMetrics,
                       backend: str) -> AsyncIterator[bytes]:
    started, result = time.monotonic(), "ok"
    try:
        async for item in items:
            if isinstance(item, OutputChunk):
                yield sse.frame(item.stream, {"data": output_doc(item.data)})
            else:
                yield sse.frame("exit", item.to_dict())
    except Exception as exc:
        result = classify(exc)[1]
        raise
    finally:
        metrics.observe("exec", backend, result, time.monotonic() - started)


async def _capped_exec(items: AsyncIterator[OutputChunk | ExecExit],
                       cap: int) -> dict[str, Any]:
    """An exec's JSON reply: stdout and stderr each kept up to `cap` bytes, the rest counted
    but not kept (32 MiB of output once cost the service 610 MB), and whether each was cut."""
    kept = {"stdout": bytearray(), "stderr": bytearray()}
    sizes = {"stdout": 0, "stderr": 0}
    end: ExecExit | None = None
    async for item in items:
        if isinstance(item, OutputChunk):
            sizes[item.stream] += len(item.data)
            room = cap - len(kept[item.stream])
            if room > 0:
                kept[item.stream] += item.data[:room]
        else:
            end = item
    if end is None:
        raise OperationFailed("the command's output ended without its exit status")
    reply = end.to_dict()
    for name in ("stdout", "stderr"):
        data, cut = bytes(kept[name]), sizes[name] > len(kept[name])
        if cut:  # not a character split in two at the cut: that would make it all base64
            try:
                data.decode()
            except UnicodeDecodeError as exc:
                if exc.reason == "unexpected end of data":
                    data = data[:exc.start]
        reply.update({name: output_doc(data), f"{name}_bytes": sizes[name],
                      f"{name}_truncated": cut})
    return reply


async def _log_frames(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield sse.frame("log", {"data": output_doc(chunk)})
    yield sse.frame("end", {})
