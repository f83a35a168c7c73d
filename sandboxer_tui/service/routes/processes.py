"""A sandbox's background processes: start, list, show, wait, signal, write to and close
their stdin, and their output as server-sent events, resumable from an offset of each
stream (the event id is `STDOUT_OFFSET,STDERR_OFFSET` after the event's chunk)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, Response

from sandboxer.core.rules.errors import BadInput, TimedOut
from sandboxer.service import Scope, output_doc
from sandboxer_tui.service import schemas as s
from sandboxer_tui.service import sse
from sandboxer_tui.service.deps import ERRORS, Metrics, Read, Write

router = APIRouter(tags=["processes"])
PID = "/v1/sandboxes/{ref}/processes/{pid}"


async def _process(who, ref: str, pid: int):
    box = await who.client.get(ref)
    return await box.processes.get(pid)


@router.post("/v1/sandboxes/{ref}/processes", status_code=201,
             summary="Start a command in the background", response_model=s.ProcessView,
             responses=ERRORS)
async def start(who: Write, metrics: Metrics, ref: str, body: s.StartProcess) -> JSONResponse:
    box = await who.client.get(ref)
    proc = await metrics.timed("process_start", box.processes.start(
        body.argv, env=body.env, cwd=body.cwd, user=body.user, stdin=body.stdin),
        backend=box.backend)
    return JSONResponse(proc.to_dict(), status_code=201)


@router.get("/v1/sandboxes/{ref}/processes", summary="A sandbox's background processes",
            response_model=list[s.ProcessView], responses=ERRORS)
async def list_processes(who: Read, ref: str) -> JSONResponse:
    box = await who.client.get(ref)
    return JSONResponse([p.to_dict() for p in await box.processes.list()])


@router.get(PID, summary="One background process", response_model=s.ProcessView,
            responses=ERRORS)
async def show(who: Read, ref: str, pid: int) -> JSONResponse:
    return JSONResponse((await _process(who, ref, pid)).to_dict())


@router.post(PID + "/wait", summary="Wait for a process to end (at most `timeout`)",
             response_model=s.ProcessView, responses=ERRORS)
async def wait(who: Write, ref: str, pid: int,
               timeout: Annotated[str | None, Query(
                   description="the longest to wait (30s, or seconds); then its view as "
                               "it is, still running")] = None) -> JSONResponse:
    limit = _duration(timeout)
    proc = await _process(who, ref, pid)
    try:
        await proc.wait(timeout=limit)
    except TimedOut:
        pass  # the view says it still runs
    return JSONResponse(proc.to_dict())


@router.post(PID + "/signal", summary="Send a signal (SIGKILL unless told)",
             response_model=s.ProcessView, responses=ERRORS)
async def signal(who: Write, ref: str, pid: int, body: s.Signal) -> JSONResponse:
    proc = await _process(who, ref, pid)
    await proc.kill(body.signal)
    return JSONResponse(proc.to_dict())


@router.post(PID + "/stdin", status_code=204, summary="Write the body to its stdin",
             response_class=Response, responses=ERRORS, openapi_extra={"requestBody": {
                 "required": True, "content": {"application/octet-stream": {
                     "schema": {"type": "string", "format": "binary"}}}}})
async def write_stdin(who: Write, request: Request, ref: str, pid: int) -> Response:
    proc = await _process(who, ref, pid)
    await proc.write(await request.body())  # SBX_SERVE_MAX_INPUT caps it
    return Response(status_code=204)


@router.delete(PID + "/stdin", status_code=204, summary="Close its stdin",
               response_class=Response, responses=ERRORS)
async def close_stdin(who: Write, ref: str, pid: int) -> Response:
    proc = await _process(who, ref, pid)
    await proc.close_stdin()
    return Response(status_code=204)


@router.get(PID + "/output", summary="Its output, from an offset of each stream",
            response_class=Response, responses={**ERRORS, 200: {
                "description": "`stdout` and `stderr` events (`{\"offset\", \"data\"}`, "
                               "id `STDOUT_OFFSET,STDERR_OFFSET` after the chunk), then "
                               "`exit` (its view) once it ended and all was sent; without "
                               "`follow` the stream ends when caught up",
                "content": {sse.MEDIA: {}}}})
async def output(who: Read, ref: str, pid: int,
                 stdout_offset: Annotated[int, Query(ge=0)] = 0,
                 stderr_offset: Annotated[int, Query(ge=0)] = 0, follow: bool = False,
                 last_event_id: Annotated[str | None, Header()] = None) -> Response:
    if follow:
        who.require(Scope.WRITE, "following a process's output (it counts as activity)")
    if last_event_id is not None:
        stdout_offset, stderr_offset = _offsets(last_event_id)
    proc = await _process(who, ref, pid)
    items = await sse.primed(proc.output(stdout_offset=stdout_offset,
                                         stderr_offset=stderr_offset, follow=follow))
    return sse.stream(_frames(items, proc, {"stdout": stdout_offset,
                                            "stderr": stderr_offset}))


def _duration(text: str | None) -> float | str | None:
    """A duration (`30s`) or seconds (`30`, `2.5`)."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return text


def _offsets(text: str) -> tuple[int, int]:
    """A Last-Event-ID: `STDOUT_OFFSET,STDERR_OFFSET`."""
    out, comma, err = text.partition(",")
    if comma and out.isdigit() and err.isdigit():
        return int(out), int(err)
    raise BadInput(f"bad Last-Event-ID {text[:40]!r}: STDOUT_OFFSET,STDERR_OFFSET")


async def _frames(items: AsyncIterator[Any], proc: Any,
                  offsets: dict[str, int]) -> AsyncIterator[bytes]:
    async for item in items:
        stream = getattr(item, "stream", None)
        if stream in ("stdout", "stderr"):
            offsets[stream] = item.offset + len(item.data)
            yield sse.frame(stream, {"offset": item.offset, "data": output_doc(item.data)},
                            f"{offsets['stdout']},{offsets['stderr']}")
    if not proc.running:
        yield sse.frame("exit", proc.to_dict(), f"{offsets['stdout']},{offsets['stderr']}")
