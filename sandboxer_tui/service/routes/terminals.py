"""A terminal in a sandbox over a WebSocket, `/v1/sandboxes/{ref}/pty`
(docs/terminals-and-ports.md, "Terminals"): binary frames are the terminal's bytes both
ways; text frames are JSON control messages.

Authenticated as every route (`Authorization: Bearer KEY`, a write key; over the service's
unix socket without one) and tenant-scoped: a refused key or another tenant's sandbox is
answered before the WebSocket is accepted, with the HTTP status and error body any route
would give (401, 403, 404).

A new session: the client's first message is `{"argv": [...] | null, "cols", "rows", "env",
"cwd"}`; the service opens the terminal and says `{"session": ID, "offset": 0, "terminal":
view}`. Reattach with `?session=ID&offset=N` (no first message; without `offset`: from now;
`&output=false`: a connection for input only).
Then the output as binary frames, `{"offset": n}` before any gap (output no longer kept),
and `{"exit": code}` once the program ended, then the close (1000). From the client:
keystrokes as binary frames, `{"resize": [cols, rows]}`, `{"close": true}` (ends the
program). A connection that drops leaves the session running: reattach. An error after
the accept is `{"error": {...}}` and a close with 4000 + its HTTP status."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse

from sandboxer.core.rules.errors import BadInput, SbxError, one_line
from sandboxer.service import Scope
from sandboxer_tui.service.auth import Refused, caller, until_revoked
from sandboxer_tui.service.errors import error_body, refusal, status_of

router = APIRouter(tags=["terminals"])
OPEN_WAIT_S = 30.0  # a new session's first message must come within this


@router.websocket("/v1/sandboxes/{ref}/pty")
async def pty(websocket: WebSocket, ref: str, session: str | None = None,
              offset: int | None = None, output: bool = True) -> None:
    try:
        who = await caller(websocket, Scope.WRITE)  # type: ignore[arg-type]
        box = await who.client.get(ref)  # another tenant's: NotFound, as a missing one
        if offset is not None and offset < 0:
            raise BadInput(f"bad offset {offset}: a whole number of bytes, 0 or more")
        if session is not None:
            term = await box.terminal(session, 0)
    except Refused as exc:
        await _deny(websocket, refusal(exc.status, "unauthorized" if exc.status == 401
                                       else "forbidden", str(exc)))
        return
    except SbxError as exc:
        await _deny(websocket, JSONResponse(error_body(exc), status_code=status_of(exc)))
        return
    await websocket.accept()
    try:
        if session is None:
            first = await asyncio.wait_for(websocket.receive(), OPEN_WAIT_S)
            if first["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(first.get("code", 1000))
            term = await box.pty(**_open_request(first.get("text") or ""))  # binary: refused
            term.offset = 0
        else:
            view = term.to_dict()
            term.offset = view["offset"] if offset is None else max(offset, view["kept_from"])
        await websocket.send_text(json.dumps({"session": term.id, "offset": term.offset,
                                              "terminal": term.to_dict()}))
    except (WebSocketDisconnect, TimeoutError):
        with contextlib.suppress(Exception):
            await websocket.close(1000)
        return
    except SbxError as exc:
        await _fail(websocket, exc)
        return
    await _relay(websocket, term, output, who)


async def _deny(websocket: WebSocket, response: JSONResponse) -> None:
    """The refusal as an HTTP answer to the upgrade (a client sees the status and body)."""
    try:
        await websocket.send_denial_response(response)
    except RuntimeError:  # a server without the denial extension: a bare close
        await websocket.close(4000 + response.status_code)


async def _fail(websocket: WebSocket, exc: BaseException) -> None:
    with contextlib.suppress(Exception):
        await websocket.send_text(json.dumps(error_body(exc)))
        await websocket.close(4000 + status_of(exc), one_line(exc)[:120])


def _json_object(text: str, shape: str) -> dict[str, Any]:
    """`text` as a JSON object; BadInput saying `shape` (what is expected) when it is not."""
    try:
        said = json.loads(text)
    except ValueError:
        said = None
    if not isinstance(said, dict):
        raise BadInput(shape)
    return said


def _open_request(text: str) -> dict[str, Any]:
    asked = _json_object(text, 'a new terminal\'s first message is a JSON object: {"argv": '
                               '[...] or null, "cols": 80, "rows": 24, "env": {}, "cwd": null}')
    unknown = set(asked) - {"argv", "cols", "rows", "env", "cwd"}
    if unknown:
        raise BadInput(f"unknown fields in the terminal's first message: {sorted(unknown)}")
    return {"argv": asked.get("argv"), "cols": asked.get("cols", 80),
            "rows": asked.get("rows", 24), "env": asked.get("env") or None,
            "cwd": asked.get("cwd")}


async def _relay(websocket: WebSocket, term: Any, output: bool, who: Any) -> None:
    """Output out (unless the client asked for none: a connection for input only) and input
    in until the program ends, the client leaves or its key is revoked (the session then
    runs on, for a reattach)."""
    out = asyncio.ensure_future(_output(websocket, term) if output else asyncio.Event().wait())
    into = asyncio.ensure_future(_input(websocket, term))
    watch = asyncio.ensure_future(until_revoked(websocket, who.principal))
    try:
        await asyncio.wait({out, into, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (out, into, watch):
            task.cancel()
        await asyncio.gather(out, into, watch, return_exceptions=True)
        with contextlib.suppress(Exception):
            await term._drop_stream()  # noqa: SLF001 (this route's own handle)
    failed = next((t.exception() for t in (out, into, watch)
                   if t.done() and not t.cancelled() and t.exception() is not None), None)
    if isinstance(failed, SbxError):
        await _fail(websocket, failed)


async def _output(websocket: WebSocket, term: Any) -> None:
    while True:
        before = term.offset
        data = await term.read()
        if not data:
            await websocket.send_text(json.dumps({"exit": term.exit_code}))
            await websocket.close(1000)
            return
        if term.offset - len(data) != before:  # older output is no longer kept
            await websocket.send_text(json.dumps({"offset": term.offset - len(data)}))
        await websocket.send_bytes(data)


async def _input(websocket: WebSocket, term: Any) -> None:
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        if message.get("bytes") is not None:
            await term.write(message["bytes"])
            continue
        said = _control(message.get("text") or "")
        if "resize" in said:
            size = said["resize"]
            if not (isinstance(size, list) and len(size) == 2):
                raise BadInput('resize is {"resize": [cols, rows]}')
            await term.resize(size[0], size[1])
        if said.get("close"):
            await term.close()


def _control(text: str) -> dict[str, Any]:
    return _json_object(text, 'a control message is a JSON object: {"resize": [cols, rows]} '
                              'or {"close": true}')
