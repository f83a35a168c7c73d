"""A sandbox's TCP ports (docs/terminals-and-ports.md): where each published port is reached
from the service's host, and exposing one while the sandbox runs, where its backend can.

`.../ports/{port}/...` below the list is the service's proxy to a port (its own section)."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, Field
from starlette.requests import HTTPConnection

from sandboxer_tui.service.deps import ERRORS, Read, Write

router = APIRouter(tags=["ports"])
PORTS = "/v1/sandboxes/{ref}/ports"
PortNumber = Annotated[int, Path(ge=1, le=65535, description="a TCP port in the sandbox")]


class PortView(BaseModel):
    """One published port of a sandbox."""

    port: int = Field(description="the TCP port inside the sandbox")
    url: str = Field(description="where it is reached from the service's host, e.g. "
                                 "http://127.0.0.1:49153 (Docker), https://... (E2B, Modal)")


# -- where a sandbox's ports are reached ---------------------------------------------------


@router.get(PORTS, summary="A sandbox's published ports and their URLs",
            response_model=list[PortView], responses=ERRORS)
async def list_ports(who: Read, ref: str, port: Annotated[int | None, Query(
        ge=1, le=65535, description="only this port (404 when it is not published)")] = None,
        ) -> JSONResponse:
    box = await who.client.get(ref)
    if port is not None:
        return JSONResponse([{"port": port, "url": await box.url(port)}])
    return JSONResponse([{"port": p, "url": url} for p, url in (await box.ports()).items()])


@router.post(PORTS + "/{port}", summary="Expose a port while the sandbox runs (where the "
             "backend can: E2B, Modal; Docker publishes only the profile's `ports:`)",
             response_model=PortView, responses=ERRORS)
async def expose(who: Write, ref: str, port: PortNumber) -> JSONResponse:
    box = await who.client.get(ref)
    return JSONResponse({"port": port, "url": await box.expose(port)})


# -- the proxy to a port and preview links (docs/terminals-and-ports.md, "The proxy and
# preview links") ------------------------------------------------------------------------
#
# Every method of `.../ports/{port}/{path}` is passed on to the port (bodies streamed both
# ways, never gathered), and a WebSocket on the same path is relayed both ways; a key with
# the write scope is needed (it is activity, and it reaches whatever the port serves). A
# signed link (`POST .../links`) opens `/v1/previews/{token}/{path}` without a key, for one
# sandbox and port until it expires or the sandbox is destroyed. What crosses, the link's
# signature and the activity throttle are in service/proxy.py.

PROXIED = PORTS + "/{port}/{path:path}"
PREVIEW = "/v1/previews/{token}"
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
_PROXIED_DOC = {**ERRORS, 502: {"description": "nothing answers on the port"}, 200: {
    "description": "whatever the sandbox's port answers, as it answers it"}}


class LinkRequest(BaseModel):
    expires_in: str | float = Field("1h", description=(
        "how long the link lasts: a duration (15m, 1h) or seconds; at most "
        "SBX_SERVE_MAX_LINK_TTL (24h)"))


class LinkView(BaseModel):
    """A signed preview link: a credential for one sandbox's port until it expires."""

    url: str = Field(description="the link, on the address the request came to")
    path: str = Field(description="the link's path on this service: /v1/previews/TOKEN/")
    sandbox: str
    port: int
    expires_at: str


def _proxy(conn: HTTPConnection) -> Any:
    """The app's proxy state (made on first use; build_app's lifespan closes it)."""
    state = conn.app.state
    if getattr(state, "proxy", None) is None:
        from sandboxer.core.rules import settings
        from sandboxer_tui.service.proxy import Proxy

        state.proxy = Proxy.made(settings.sbx_home() / "preview-links.key",
                                 conn.app.state.service.client.mark_traffic)
    return state.proxy


def _tail(conn: HTTPConnection, segments: int) -> str:
    """The path past the proxy's prefix (`segments` of them), as the caller wrote it
    (percent-escapes kept), with the query."""
    raw = conn.scope.get("raw_path") or conn.url.path.encode()
    tail = "/".join(raw.decode("latin-1").split("/")[segments:])
    query = conn.scope.get("query_string", b"").decode("latin-1")
    return "/" + tail + (f"?{query}" if query else "")


@router.post(PORTS + "/{port}/links", status_code=201, response_model=LinkView,
             summary="A signed preview link to a port: no key needed, until it expires or "
                     "the sandbox is destroyed", responses=ERRORS)
async def make_link(who: Write, request: Request, ref: str, port: PortNumber,
                    body: LinkRequest) -> JSONResponse:
    from datetime import UTC, datetime

    lasting = _lasting(body.expires_in)
    box = await who.client.get(ref)
    await box.url(port)  # published (NotFound naming the ports that are, else)
    expires = int(time.time() + lasting)
    token = _proxy(request).links.make(box.id, port, expires)
    at = datetime.fromtimestamp(expires, UTC)
    await who.client.record_port_link(box.id, port, at)
    path = f"/v1/previews/{token}/"
    return JSONResponse({"url": str(request.base_url).rstrip("/") + path, "path": path,
                         "sandbox": box.id, "port": port,
                         "expires_at": at.isoformat().replace("+00:00", "Z")},
                        status_code=201)


def _lasting(given: str | float) -> float:
    """Seconds a link lasts: above 0, at most SBX_SERVE_MAX_LINK_TTL (BadInput, 400)."""
    from sandboxer.core.rules import settings
    from sandboxer.core.rules.durations import format_duration, parse_duration
    from sandboxer.core.rules.errors import BadInput

    try:
        seconds = (float(given) if not isinstance(given, str) or given.strip().replace(
            ".", "", 1).isdigit() else parse_duration(given, "expires_in").total_seconds())
    except (ValueError, OverflowError):
        raise BadInput(f"expires_in: bad duration {str(given)[:40]!r}: e.g. 15m, 1h, or "
                       "seconds") from None
    longest = settings.serve_max_link_ttl()
    if not seconds > 0 or seconds > longest.total_seconds():
        raise BadInput(f"expires_in: a link lasts more than 0s and at most "
                       f"{format_duration(longest)} (SBX_SERVE_MAX_LINK_TTL)")
    return seconds


async def _forward(request: Request, box: Any, port: int, tail: str, prefix: str,
                   via: str) -> Response:
    """The request passed on to the sandbox's port, and its answer streamed back."""
    import httpx

    from sandboxer_tui.service.proxy import TIMEOUTS, request_headers, response_headers

    proxy = _proxy(request)
    metrics = request.app.state.service.metrics
    base = await proxy.upstreams.url(box, port)
    headers = request_headers(
        [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.scope["headers"]],
        via_link=via == "link", client=request.client.host if request.client else None,
        proto=request.url.scheme, host=request.headers.get("host"))
    labels = (box.id, str(port))
    sent = [0]

    async def body() -> AsyncIterator[bytes]:
        async for chunk in request.stream():
            if chunk:
                sent[0] += len(chunk)
                yield chunk

    has_body = ("transfer-encoding" in request.headers
                or request.headers.get("content-length", "0") not in ("", "0"))
    http = proxy.upstreams.http()
    try:
        upstream = httpx.Request(request.method, base + tail, headers=headers,
                                 content=body() if has_body else None,
                                 extensions={"timeout": TIMEOUTS})
    except (httpx.InvalidURL, ValueError):
        from sandboxer.core.rules.errors import BadInput
        from sandboxer_tui.service.errors import error_response

        return error_response(BadInput("the path or query cannot be passed on to the port: "
                                       "it is not a valid URL"))
    try:
        answer = await http.handle_async_request(upstream)
    except httpx.TimeoutException:
        return _unreachable(box.id, port, 504, "did not answer in time")
    except httpx.TransportError:
        proxy.upstreams.forget(box.id, port)
        return _unreachable(box.id, port, 502, "does not answer: nothing listens there, "
                                               "or it closed the connection")
    proxy.activity.seen(box.id)
    metrics.proxy_requests.labels(*labels, via).inc()

    length = answer.headers.get("content-length", "")
    bounded = length.isdigit() and int(length) <= 1024**2

    def counted(received: int) -> None:
        metrics.proxy_bytes.labels(*labels, "in").inc(sent[0])
        metrics.proxy_bytes.labels(*labels, "out").inc(received)

    response = _Relayed(relay_answer(answer, bounded, counted), status_code=answer.status_code,
                        bounded=bounded)
    response.raw_headers = response_headers(answer.headers.multi_items(), prefix=prefix,
                                            via_link=via == "link")
    return response


# a bounded answer (below) whose body stops coming for this long is cut, closing its
# connection to the sandbox: nothing else would notice that its caller left, and each one
# held one of the pool's connections (shared by every sandbox) for good
BOUNDED_STALL_S = 60.0


async def relay_answer(answer: Any, bounded: bool,
                       counted: Callable[[int], None]) -> AsyncIterator[bytes]:
    """The upstream answer's body as it comes (this route's and service/proxy_asgi.py's): a
    bounded answer's body that stalls for BOUNDED_STALL_S ends it (TimeoutError). At the end
    the answer is closed and `counted` gets the bytes received."""
    import asyncio

    received = 0
    chunks = answer.aiter_raw()
    try:
        while True:
            try:  # a bounded answer has no watch on its caller: a stall ends it
                async with asyncio.timeout(BOUNDED_STALL_S if bounded else None):
                    chunk = await anext(chunks)
            except StopAsyncIteration:
                break
            received += len(chunk)
            yield chunk
    finally:
        await answer.aclose()
        counted(received)


class _Relayed(StreamingResponse):
    """The port's answer, streamed. One that ends on its own (a Content-Length up to 1 MiB)
    is sent without Starlette's second task watching for the caller to leave, which costs
    more than a small answer itself; any other (a stream, a long poll) keeps it, so that a
    caller who leaves ends it."""

    def __init__(self, content: AsyncIterator[bytes], *, status_code: int,
                 bounded: bool) -> None:
        super().__init__(content, status_code=status_code)
        self.bounded = bounded

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if not self.bounded:
            await super().__call__(scope, receive, send)
            return
        try:
            await self.stream_response(send)
        except TimeoutError:  # its body stalled (BOUNDED_STALL_S): left unfinished, closed
            return


def _unreachable(sandbox_id: str, port: int, status: int, why: str) -> JSONResponse:
    from sandboxer.core.rules.errors import Unavailable
    from sandboxer_tui.service.errors import error_body

    return JSONResponse(error_body(Unavailable(f"port {port} of sandbox {sandbox_id} {why}")),
                        status_code=status)


async def _keyed(conn: HTTPConnection, ref: str) -> Any:
    """The sandbox `ref` names for this request's key (write scope; another tenant's: not
    found), looked up at most once a second per key and sandbox (proxy.Found)."""
    from sandboxer.service import Scope
    from sandboxer_tui.service.auth import caller

    found = _proxy(conn).found
    key = getattr(conn.state, "api_key", None)
    if key is not None and (box := found.get(key["id"], ref)) is not None:
        return box
    who = await caller(conn, Scope.WRITE)  # type: ignore[arg-type]
    box = await who.client.get(ref)
    found.put(who.principal, ref, box)
    return box


async def proxy_http(request: Request, ref: str, port: PortNumber, path: str) -> Response:
    box = await _keyed(request, ref)
    return await _forward(request, box, port, _tail(request, 6),
                          f"/v1/sandboxes/{ref}/ports/{port}", "key")


class _LinkRefused(Exception):
    """A preview link that opens nothing: its status and one line of plain text."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def _linked(conn: HTTPConnection, token: str) -> tuple[Any, int]:
    """The sandbox and port a link opens, checked on every request: the signature, the
    expiry, and that the sandbox still runs (destroying it revokes its links)."""
    from sandboxer.core.rules.errors import NotFound
    from sandboxer_tui.service.proxy import LinkRefused

    try:
        link = _proxy(conn).links.check(token)
    except LinkRefused as exc:
        raise _LinkRefused(403, str(exc)) from None
    try:
        box = await conn.app.state.service.client.get(link.sandbox_id)
    except NotFound:
        box = None
    if box is None or box.state in ("destroyed", "destroying"):
        raise _LinkRefused(404, "the sandbox this preview link opened is gone")
    if box.state != "running":
        raise _LinkRefused(409, f"the sandbox this preview link opens is {box.state}")
    return box, link.port


async def preview_http(request: Request, token: str, path: str) -> Response:
    try:
        box, port = await _linked(request, token)
    except _LinkRefused as exc:
        return PlainTextResponse(f"{exc}\n", status_code=exc.status)
    return await _forward(request, box, port, _tail(request, 4), f"/v1/previews/{token}",
                          "link")


for _method in METHODS:
    router.add_api_route(
        PROXIED, proxy_http, methods=[_method], name=f"proxy_{_method.lower()}",
        summary="Pass a request on to the sandbox's port (a WebSocket too)",
        response_class=Response, responses=_PROXIED_DOC)
    router.add_api_route(
        PREVIEW + "/{path:path}", preview_http, methods=[_method],
        name=f"preview_{_method.lower()}",
        summary="Pass a request on through a signed preview link (no key; a WebSocket too)",
        response_class=Response, openapi_extra={"security": []},
        responses={422: ERRORS[422],
                   403: {"description": "the link is altered or expired (one line)"},
                   404: {"description": "its sandbox is gone"},
                   200: {"description": "whatever the sandbox's port answers"}})


@router.get(PREVIEW, include_in_schema=False)
async def preview_root(token: str) -> Response:
    """`/v1/previews/TOKEN` is the page at its `/`: links relative to it resolve under it."""
    from fastapi.responses import RedirectResponse

    return RedirectResponse(f"{token}/", status_code=307)


async def _deny(websocket: WebSocket, status: int, message: str) -> None:
    """Refuse a WebSocket before it opens: the HTTP status and a one-line body where the
    server can send one, else a close (1008: policy)."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(PlainTextResponse(f"{message}\n",
                                                               status_code=status))
    else:
        await websocket.close(code=1008, reason=message[:120])


@router.websocket(PROXIED)
async def proxy_websocket(websocket: WebSocket, ref: str, port: int, path: str) -> None:
    from sandboxer.core.rules.errors import SbxError, one_line
    from sandboxer_tui.service.auth import Refused
    from sandboxer_tui.service.errors import status_of

    try:
        box = await _keyed(websocket, ref)
    except Refused as exc:
        await _deny(websocket, exc.status, str(exc))
        return
    except SbxError as exc:
        await _deny(websocket, status_of(exc), one_line(exc))
        return
    await _until_revoked(websocket, _relay(websocket, box, port, _tail(websocket, 6), "key"))


async def _until_revoked(websocket: WebSocket, relay: Any) -> None:
    """The relay, ended (a close 1008) once the key it was opened with is revoked."""
    import asyncio
    import contextlib

    from sandboxer_tui.service.auth import LOCAL, until_revoked

    key = getattr(websocket.state, "api_key", None)
    running = asyncio.ensure_future(relay)
    watch = asyncio.ensure_future(until_revoked(websocket, key["id"] if key else LOCAL))
    try:
        await asyncio.wait({running, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (running, watch):
            task.cancel()
        await asyncio.gather(running, watch, return_exceptions=True)
    if not watch.cancelled() and watch.exception() is not None:
        with contextlib.suppress(Exception):
            await websocket.close(code=1008, reason="the API key was revoked")


@router.websocket(PREVIEW + "/{path:path}")
async def preview_websocket(websocket: WebSocket, token: str, path: str) -> None:
    try:
        box, port = await _linked(websocket, token)
    except _LinkRefused as exc:
        await _deny(websocket, exc.status, str(exc))
        return
    await _relay(websocket, box, port, _tail(websocket, 4), "link")


async def _relay(websocket: WebSocket, box: Any, port: int, tail: str, via: str) -> None:
    """A WebSocket to the sandbox's port, opened with the caller's subprotocols, then every
    message relayed both ways until either side closes (its close code passed on)."""

    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidHandshake, InvalidURI

    from sandboxer.core.rules.errors import SbxError, one_line
    from sandboxer_tui.service.errors import status_of
    from sandboxer_tui.service.proxy import request_headers

    proxy = _proxy(websocket)
    metrics = websocket.app.state.service.metrics
    try:
        base = await proxy.upstreams.url(box, port)
    except SbxError as exc:
        await _deny(websocket, status_of(exc), one_line(exc))
        return
    headers = request_headers(
        [(k.decode("latin-1"), v.decode("latin-1")) for k, v in websocket.scope["headers"]],
        via_link=via == "link", client=websocket.client.host if websocket.client else None,
        proto="ws", host=websocket.headers.get("host"), websocket=True)
    offered = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",")
               if p.strip()]
    try:
        upstream = await connect("ws" + base.removeprefix("http") + tail,
                                 additional_headers=headers, subprotocols=offered or None,
                                 open_timeout=10, max_size=16 * 1024**2, compression=None,
                                 user_agent_header=None, **_no_proxy())
    except (OSError, TimeoutError, InvalidHandshake, InvalidURI):
        proxy.upstreams.forget(box.id, port)
        await _deny(websocket, 502, f"port {port} of sandbox {box.id} does not answer a "
                                    "WebSocket there")
        return
    labels = (box.id, str(port))
    metrics.proxy_requests.labels(*labels, via).inc()
    proxy.activity.seen(box.id)
    try:
        await websocket.accept(subprotocol=upstream.subprotocol)
        await _both_ways(websocket, upstream, proxy, box.id, labels, metrics)
    finally:  # whatever ended it (the caller gone before it opened, say)
        await upstream.close()


async def _both_ways(websocket: WebSocket, upstream: Any, proxy: Any, sandbox_id: str,
                     labels: tuple[str, str], metrics: Any) -> None:
    """Every message relayed both ways until one side closes; its close code passed on."""
    import asyncio

    from websockets.exceptions import ConnectionClosed

    async def to_caller() -> None:
        async for message in upstream:
            size = len(message.encode() if isinstance(message, str) else message)
            metrics.proxy_bytes.labels(*labels, "out").inc(size)
            proxy.activity.seen(sandbox_id)
            if isinstance(message, str):
                await websocket.send_text(message)
            else:
                await websocket.send_bytes(message)

    async def to_sandbox() -> int:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return int(message.get("code") or 1000)
            data = message.get("text")
            data = data if data is not None else message.get("bytes") or b""
            metrics.proxy_bytes.labels(*labels, "in").inc(
                len(data.encode() if isinstance(data, str) else data))
            proxy.activity.seen(sandbox_id)
            await upstream.send(data)

    down, up = asyncio.ensure_future(to_caller()), asyncio.ensure_future(to_sandbox())
    try:
        await asyncio.wait((down, up), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (down, up):
            task.cancel()
        await asyncio.gather(down, up, return_exceptions=True)
    if up.done() and not up.cancelled() and up.exception() is None:  # the caller left
        await upstream.close(code=_sendable(up.result()))
        return
    await upstream.close()
    try:
        await websocket.close(code=_sendable(upstream.close_code))
    except (RuntimeError, ConnectionClosed):
        pass  # the caller is gone too


@functools.cache
def _no_proxy() -> dict[str, Any]:
    """websockets 15 and later reach a URL through the environment's proxy unless told:
    the port is on this host, never behind a proxy."""
    import inspect

    from websockets.asyncio.client import connect

    return {"proxy": None} if "proxy" in inspect.signature(connect).parameters else {}


def _sendable(code: int | None) -> int:
    """A close code one may send (1005, 1006 and 1015 only describe a close)."""
    return 1000 if code in (None, 1005, 1006, 1015) else int(code)
