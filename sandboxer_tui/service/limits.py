"""What keeps `sbx serve` standing against a hostile client (docs/security.md, "The service's
limits"): the key is checked and the body's size judged before a byte of the body is read;
bodies, event streams (per key and in all) and connections are capped; a connection has a
deadline for its headers and a cap on their size. Refusals are the service's error body."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandboxer.core.rules.errors import SbxError, Unavailable
from sandboxer_tui.service import sse
from sandboxer_tui.service.errors import error_body, error_response, refusal

PUBLIC = frozenset({"/healthz", "/readyz", "/openapi.json"})  # no key, and served past the
# connection limit (the document is public: it says what the service is, not what it holds)
UPLOAD = ("POST", "/v1/checkpoints/import")  # an archive to import
STREAMED = re.compile(r"^/v1/sandboxes/[^/]+/files(/tree)?$")  # PUT: a file's or a tree's
# bytes, streamed on to the sandbox as they come: capped as an upload, not as a JSON body
# POST: a command's input (exec's stdin in its JSON, a process's stdin): capped on its own
INPUT = re.compile(r"^/v1/sandboxes/[^/]+/(exec|processes/[^/]+/stdin)$")
# any method: a body streamed on to a sandbox's port by the proxy, capped as an upload
PROXIED = re.compile(r"^/v1/(sandboxes/[^/]+/ports/[^/]+/(?!links$)|previews/)")
E2B_PREFIX = "/e2b/"  # the E2B API (service/e2b.py): its refusals in E2B's error body
E2B_UPLOAD = ("POST", "/e2b/files")  # a file's bytes through the E2B API
PREVIEWS = "/v1/previews/"  # a signed link is its own credential (routes/ports.py): no key
MAX_HEADER_BYTES = 64 * 1024  # a request line and headers larger than this: 431
KEEP_ALIVE_S = 5  # an idle connection between requests is closed after this
LINGER_S, LINGER_BYTES = 5.0, 64 * 1024**2  # what is read and dropped after an early answer
CONNECTIONS = "sbx.connections"  # scope key: connections open when this request began


def _size(n: int) -> str:
    for unit, step in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= step and n % step == 0:
            return f"{n // step} {unit}"
    return f"{n} bytes"


class Streams:
    """Open event streams, per key (a key's id; `local` over the unix socket) and in all."""

    def __init__(self, most: int, per_key: int) -> None:
        self.most, self.per_key = most, per_key
        self.open: Counter[str] = Counter()

    def claim(self, principal: str) -> str | None:
        """Take a slot for `principal`; None when taken, else why not."""
        if self.open[principal] >= self.per_key:
            return (f"this key has {self.per_key} event streams open, the most one key may "
                    "(SBX_SERVE_MAX_STREAMS_PER_KEY): close one first")
        if self.open.total() >= self.most:
            return (f"the service has {self.most} event streams open, the most it serves "
                    "(SBX_SERVE_MAX_STREAMS): try again later")
        self.open[principal] += 1
        return None

    def release(self, principal: str) -> None:
        self.open[principal] -= 1
        if self.open[principal] <= 0:
            del self.open[principal]


class Limits:
    """The pure ASGI middleware in front of every route (FastAPI would read and parse a body
    before its dependencies check the key: one unauthenticated 300 MiB POST cost 900 MB)."""

    def __init__(self, app: ASGIApp, *, max_body: int, max_upload: int, max_input: int,
                 streams: Streams, max_connections: int) -> None:
        self.app = app
        self.max_body, self.max_upload, self.max_input = max_body, max_upload, max_input
        self.streams = streams
        self.max_connections = max_connections

    websockets = 0  # WebSockets open now (this app's): at most half of max_connections

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        public = scope["path"] in PUBLIC
        body = _Body(scope, receive, send)
        if not public and scope.get(CONNECTIONS, 0) > self.max_connections:
            await body.answer(JSONResponse(error_body(Unavailable(
                f"the service has {self.max_connections} connections open, the most it serves "
                "(SBX_SERVE_MAX_CONNECTIONS): try again later")), status_code=503,
                headers={"Retry-After": "1"}))
            return
        principal = None
        if not public and not scope["path"].startswith(PREVIEWS):
            from sandboxer.service import Scope as KeyScope
            from sandboxer_tui.service.auth import Refused, caller

            try:  # the key is looked up once: caller() finds it in the request's state
                principal = (await caller(Request(scope), KeyScope.READ)).principal
            except Refused as exc:
                await body.answer(_e2b(scope, 401, str(exc)) or refusal(
                    401, "unauthorized", str(exc), **{"WWW-Authenticate": "Bearer"}))
                return
            except SbxError as exc:  # the database cannot be reached, say
                await body.answer(error_response(exc))
                return
        streamed = ((scope["method"] == "PUT" and STREAMED.match(scope["path"]) is not None)
                    or PROXIED.match(scope["path"]) is not None)
        upload = (scope["method"], scope["path"]) in (UPLOAD, E2B_UPLOAD) or streamed
        body.drain = streamed  # the caller's key was good: an early answer is worth reading
        command_input = scope["method"] == "POST" and INPUT.match(scope["path"]) is not None
        body.limit, body.setting = (
            (self.max_upload, "SBX_SERVE_MAX_UPLOAD") if upload else
            (self.max_input, "SBX_SERVE_MAX_INPUT") if command_input else
            (self.max_body, "SBX_SERVE_MAX_BODY"))
        if body.length is not None and body.length > body.limit:
            await body.answer(_e2b(scope, 413, body.too_large())
                              or refusal(413, "bad_input", body.too_large()))
            return
        if principal is None or not sse.asks_for_stream(scope):
            await self.app(scope, body.receive, body.send)
            return
        refused = self.streams.claim(principal)
        if refused is not None:
            await body.answer(JSONResponse(error_body(Unavailable(refused)), status_code=429,
                                           headers={"Retry-After": "1"}))
            return
        try:
            await self.app(scope, body.receive, body.send)
        finally:
            self.streams.release(principal)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket holds its connection as long as it lasts, and uvicorn counts it among
        the open connections the cap above judges plain requests by: past half of the cap,
        a new one is refused (503) before it opens, so WebSockets never take every slot."""
        most = max(1, self.max_connections // 2)
        if self.websockets >= most:
            await receive()  # websocket.connect
            message = (f"the service has {self.websockets} WebSockets open, the most it "
                       "serves (half of SBX_SERVE_MAX_CONNECTIONS): try again later")
            if "websocket.http.response" in scope.get("extensions", {}):
                await JSONResponse(error_body(Unavailable(message)), status_code=503,
                                   headers={"Retry-After": "1"})(scope, receive, send)
            else:
                await send({"type": "websocket.close", "code": 1013})
            return
        self.websockets += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.websockets -= 1


def _e2b(scope: Scope, status: int, message: str) -> JSONResponse | None:
    """A refusal of a call to the E2B API (service/e2b.py) in E2B's error body, which its
    SDK reads; None for the service's own routes."""
    if not scope["path"].startswith(E2B_PREFIX):
        return None
    return JSONResponse({"code": status, "message": message}, status_code=status)


class _Body:
    """A request's body as the app reads it: counted against its limit while it is read,
    and the connection closed after an answer given before all of it came."""

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        self.length = int(length) if length and length.isdigit() else None
        self.unread = bool(self.length) or b"chunked" in headers.get(b"transfer-encoding", b"")
        self._scope, self._receive, self._send = scope, receive, send
        self.limit, self.setting, self.read = 0, "", 0
        self.drain = False

    def too_large(self) -> str:
        return (f"the request's body is larger than {_size(self.limit)}, the most this route "
                f"takes ({self.setting})")

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self.read += len(message.get("body", b""))
            if self.read > self.limit:  # FastAPI passes an HTTPException on as it is
                raise HTTPException(413, self.too_large())
            if not message.get("more_body", False):
                self.unread = False
        else:
            self.unread = False
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start" and self.unread and self.drain:
            await self._discard()
        if message["type"] == "http.response.start" and self.unread:
            # the rest of the body is not wanted: close rather than read it to the end
            message = {**message, "headers": [*message.get("headers", []),
                                              (b"connection", b"close")]}
        await self._send(message)

    async def _discard(self) -> None:
        """Read the rest of a streamed upload answered early (an error), up to its cap: a
        client that sends its whole body before it reads the answer (httpx, curl) then gets
        the answer, not a connection closed under it."""
        try:
            while self.unread:
                await self.receive()
        except Exception:  # past the cap, or gone: the connection is closed instead
            return

    async def answer(self, response: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        await response(self._scope, self._receive, self.send)


def protocol(header_timeout_s: float, max_header_bytes: int = MAX_HEADER_BYTES) -> type:
    """uvicorn's httptools protocol, with a deadline for each request's headers (uvicorn has
    none: a connection that never finished its headers stayed open for good), a cap on their
    size (llhttp has none), and the count of open connections in each request's scope."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class Protocol(HttpToolsProtocol):
        _deadline: Any = None
        _awaiting = False
        _header_bytes = 0

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._await_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_waiting()
            super().connection_lost(exc)

        def _await_headers(self) -> None:
            self._stop_waiting()
            self._awaiting, self._header_bytes = True, 0
            self._deadline = self.loop.call_later(header_timeout_s, self._too_slow)

        def _stop_waiting(self) -> None:
            self._awaiting = False
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            if self._awaiting and not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._lingering:  # after an early answer: dropped (linger, below)
                self._linger_left -= len(data)
                if self._linger_left <= 0:
                    self.transport.close()
                return
            if self._awaiting:
                self._header_bytes += len(data)
            super().data_received(data)
            if (self._awaiting and self._header_bytes > max_header_bytes
                    and not self.transport.is_closing()):
                self._stop_waiting()
                text = json.dumps({"error": {"code": 2, "kind": "bad_input", "message": (
                    f"the request's line and headers are larger than {_size(max_header_bytes)}"
                )}}).encode()
                self.transport.write(
                    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: "
                    b"application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                    % (len(text), text))
                self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.scope[CONNECTIONS] = len(self.connections)  # type: ignore[literal-required]
            if not self._awaiting:  # pipelined behind a running request: its size is capped
                self._awaiting, self._header_bytes = True, 0

        def on_headers_complete(self) -> None:
            self._stop_waiting()
            super().on_headers_complete()
            if self.cycle is not None:  # its close lingers (below)
                self.cycle.transport = _Lingering(self, self.transport)

        _lingering = False
        _linger_left = 0

        def linger(self) -> None:
            """An answer went out before the request's whole body came, on a connection
            to close: half-close it, and read and drop what the client still sends (up to
            LINGER_BYTES, for LINGER_S), then close. Closed at once, the unread bytes make
            the kernel reset the connection, and a client that reads only once it has sent
            its body (httpx, curl) loses the answer: a 413 became "cannot reach"."""
            transport = self.transport
            if self._lingering or transport.is_closing():
                return
            if not transport.can_write_eof():
                transport.close()
                return
            self._lingering, self._linger_left = True, LINGER_BYTES
            transport.write_eof()
            transport.resume_reading()
            self.loop.call_later(LINGER_S, transport.close)

        def eof_received(self) -> bool | None:
            if self._lingering:
                self.transport.close()
            return None

        def on_response_complete(self) -> None:
            waiting = not self.pipeline  # a pipelined request's headers are all here
            super().on_response_complete()
            if waiting and not self.transport.is_closing():
                self._await_headers()

    return Protocol


class _Lingering:
    """The connection as a request's cycle sees it: its close, after an answer given before
    the whole body came, lingers (Protocol.linger) instead of resetting the connection."""

    def __init__(self, protocol: Any, transport: Any) -> None:
        self._protocol, self._transport = protocol, transport

    def close(self) -> None:
        cycle = self._protocol.cycle
        if cycle is not None and cycle.more_body and not cycle.disconnected:
            self._protocol.linger()
        else:
            self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
