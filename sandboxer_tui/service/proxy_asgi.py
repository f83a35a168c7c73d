"""The proxy's fast path (docs/terminals-and-ports.md, "The proxy and preview links"): an
HTTP request to a sandbox's port served by plain ASGI code in front of FastAPI, which costs
more per request than a small answer itself (routing, dependencies, response classes).

Two pieces, both added in app.py around the limits middleware (limits.py), which still does
its part on every request (the connection cap, the key's check, the body's cap):

- `KeyCache`, outside it: a key that the database verified is kept for `TTL_S` (1 s) by its
  token's hash, for the proxy's key routes only; the limits middleware then finds it in the
  request's state (as it finds its own lookup) instead of asking the database each request.
  A revoked key still opens the proxy for at most that second.
- `FastProxy`, inside it: when every check passes (a key with the write scope and its
  tenant's sandbox, kept a second by routes/ports.py's `Found`; or a link's signature and
  expiry and its sandbox running, on every request), the request is passed on and its answer
  streamed back here, by the same rules (service/proxy.py's headers, activity and pool). Any
  other case (no key, a refusal, a bad port, a link that opens nothing, the unix socket) goes
  on to FastAPI's routes in routes/ports.py, which check it again and answer as they do.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from sandboxer_tui.service.upstream import LEAN_METHODS, Pool, Unanswered, head

TTL_S = 1.0  # a verified key is trusted this long without the database
KEYED = re.compile(r"^/v1/sandboxes/([^/]+)/ports/([1-9][0-9]{0,4})/")
LINKED = re.compile(r"^/v1/previews/([^/]+)/")
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _route(scope: Scope) -> tuple[str, str, int] | None:
    """("key", ref, port) or ("link", token, 0) for a request the proxy's routes serve; None
    for any other (or one the fast path leaves to them: a mounted app, `POST .../links`)."""
    if scope["type"] != "http" or scope.get("root_path") or scope["method"] not in METHODS:
        return None
    path = scope["path"]
    keyed = KEYED.match(path)
    if keyed is not None:
        port = int(keyed.group(2))
        if port > 65535 or (scope["method"] == "POST" and path == keyed.group(0) + "links"):
            return None
        return "key", keyed.group(1), port
    linked = LINKED.match(path)
    return ("link", linked.group(1), 0) if linked is not None else None


def _bearer(scope: Scope) -> str | None:
    """The `Authorization: Bearer` token, as auth.py reads it (None: none given)."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            kind, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if kind.lower() == "bearer" and token.strip() else None
    return None


class Keys:
    """Keys the database verified in the last TTL_S seconds, by their token's SHA-256."""

    def __init__(self, ttl: float = TTL_S) -> None:
        self.ttl = ttl
        self.found: dict[bytes, tuple[dict[str, Any], float]] = {}

    async def verified(self, client: Any, token: str) -> dict[str, Any] | None:
        digest = hashlib.sha256(token.encode()).digest()
        now = time.monotonic()
        hit = self.found.get(digest)
        if hit is not None and now - hit[1] < self.ttl:
            return hit[0]
        key = await client.authenticate(token)
        if key is None:
            self.found.pop(digest, None)
            return None
        if len(self.found) > 4096:
            self.found.clear()
        self.found[digest] = (key, now)
        return key


class KeyCache:
    """Outside the limits middleware: a proxied request's key, verified at most once every
    TTL_S, put where the limits middleware and auth.caller look first (the request's state).
    A key it cannot verify (unknown, revoked, the database down) is left to them."""

    def __init__(self, app: ASGIApp, keys: Keys) -> None:
        self.app, self.keys = app, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and KEYED.match(scope["path"]):
            token = _bearer(scope)
            if token:
                try:
                    key = await self.keys.verified(scope["app"].state.service.client, token)
                except Exception:  # noqa: BLE001 (the limits middleware asks and answers)
                    key = None
                if key is not None:
                    scope.setdefault("state", {})["api_key"] = key
        await self.app(scope, receive, send)


class FastProxy:
    """Inside the limits middleware: a proxied HTTP request whose checks pass is served
    here; anything else goes on to the app (FastAPI), unchanged."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.counters: dict[tuple[str, str, str], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = _route(scope)
        target = None
        if route is not None:
            try:
                target = await _target(scope, *route)
            except Exception:  # noqa: BLE001 (refused, not found...: the routes say so)
                target = None
        if target is None:
            await self.app(scope, receive, send)
            return
        await self.forward(scope, receive, send, *target)

    def counter(self, metrics: Any, family: str, *labels: str) -> Any:
        """A prometheus child (`labels()` costs a lookup and a lock each call), kept."""
        key = (family, *labels)
        child = self.counters.get(key)  # type: ignore[call-overload]
        if child is None:
            if len(self.counters) > 16384:
                self.counters.clear()
            child = self.counters[key] = getattr(metrics, family).labels(*labels)  # type: ignore[index]
        return child

    async def forward(self, scope: Scope, receive: Receive, send: Send, box: Any, port: int,
                      base: str, tail: str, prefix: str, via: str) -> None:
        """routes/ports.py's `_forward`, in ASGI terms: the request passed on (its body
        streamed), the answer streamed back."""
        import httpx
        from starlette.exceptions import HTTPException
        from starlette.requests import ClientDisconnect

        from sandboxer_tui.service.proxy import TIMEOUTS, request_headers, response_headers
        from sandboxer_tui.service.routes import ports

        app = scope["app"]
        proxy = _proxy_of(scope)
        metrics = app.state.service.metrics
        raw = scope["headers"]
        host = te = length = None
        for name, value in raw:
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"transfer-encoding":
                te = value
            elif name == b"content-length":
                length = value
        client = scope.get("client")
        headers = request_headers(
            [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw],
            via_link=via == "link", client=client[0] if client else None,
            proto=scope.get("scheme", "http"), host=host)
        sent = 0

        async def body() -> AsyncIterator[bytes]:
            nonlocal sent
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnect()
                chunk = message.get("body", b"")
                if chunk:
                    sent += len(chunk)
                    yield chunk
                if not message.get("more_body", False):
                    return

        has_body = te is not None or length not in (None, b"", b"0")
        if not has_body and scope["method"] in LEAN_METHODS and (
                address := _plain(base)) is not None:
            request = head(scope["method"], tail, address[2], headers)
            if request is not None:  # upstream.py's client; anything else: httpx's
                await self.forward_lean(scope, receive, send, proxy, box, port, address,
                                        request, prefix, via)
                return
        try:
            upstream = httpx.Request(scope["method"], base + tail, headers=headers,
                                     content=body() if has_body else None,
                                     extensions={"timeout": TIMEOUTS})
        except (httpx.InvalidURL, ValueError):
            await self.app(scope, receive, send)  # the route's 400 (nothing was read)
            return
        try:
            answer = await proxy.upstreams.http().handle_async_request(upstream)
        except httpx.TimeoutException:
            await ports._unreachable(box.id, port, 504, "did not answer in time")(
                scope, receive, send)
            return
        except httpx.TransportError:
            proxy.upstreams.forget(box.id, port)
            await ports._unreachable(box.id, port, 502, "does not answer: nothing listens "
                                     "there, or it closed the connection")(scope, receive, send)
            return
        except HTTPException as exc:  # the body's cap (limits.py), as errors.py answers it
            from fastapi.responses import JSONResponse

            from sandboxer.core.rules.errors import ExitCode

            await JSONResponse({"error": {"code": int(ExitCode.BAD_INPUT), "kind": "bad_input",
                                          "message": str(exc.detail)}},
                               status_code=exc.status_code, headers=exc.headers)(
                scope, receive, send)
            return
        proxy.activity.seen(box.id)
        labels = (box.id, str(port))
        self.counter(metrics, "proxy_requests", *labels, via).inc()
        out_headers = response_headers(answer.headers.multi_items(), prefix=prefix,
                                       via_link=via == "link")
        content_length = answer.headers.get("content-length", "")
        bounded = content_length.isdigit() and int(content_length) <= 1024**2

        def counted(received: int) -> None:
            self.counter(metrics, "proxy_bytes", *labels, "in").inc(sent)
            self.counter(metrics, "proxy_bytes", *labels, "out").inc(received)

        if not bounded:  # a stream or a long poll: Starlette's watch for the caller leaving
            response = ports._Relayed(ports.relay_answer(answer, False, counted),
                                      status_code=answer.status_code, bounded=False)
            response.raw_headers = out_headers
            await response(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": answer.status_code,
                    "headers": out_headers})
        chunks, left, ended = ports.relay_answer(answer, True, counted), int(content_length), False
        try:
            async for chunk in chunks:
                left -= len(chunk)
                await send({"type": "http.response.body", "body": chunk,
                            "more_body": left > 0})  # the last one ends it: one send less
                ended = left <= 0  # (the loop goes on to the answer's end: kept alive)
        except TimeoutError:  # its body stalled (BOUNDED_STALL_S): left unfinished, closed
            return
        finally:
            await chunks.aclose()
        if not ended:  # an empty body, or one that ended short of its length
            await send({"type": "http.response.body", "body": b"", "more_body": False})


    async def forward_lean(self, scope: Scope, receive: Receive, send: Send, proxy: Any,
                           box: Any, port: int, address: tuple[str, int, str], request: bytes,
                           prefix: str, via: str) -> None:
        """`forward` for a request without a body, on upstream.py's client: the same
        answers (502, 504), headers, activity, metrics and streaming."""
        from sandboxer_tui.service.proxy import TIMEOUTS, response_headers
        from sandboxer_tui.service.routes import ports

        pool = proxy.pool
        try:
            conn = await pool.request(address[0], address[1], request,
                                      connect_timeout=TIMEOUTS["connect"],
                                      read_timeout=TIMEOUTS["read"])
        except Unanswered as exc:
            if exc.timeout:
                why, status = "did not answer in time", 504
            else:
                proxy.upstreams.forget(box.id, port)
                why, status = ("does not answer: nothing listens there, or it closed the "
                               "connection"), 502
            await ports._unreachable(box.id, port, status, why)(scope, receive, send)
            return
        metrics = scope["app"].state.service.metrics
        proxy.activity.seen(box.id)
        labels = (box.id, str(port))
        self.counter(metrics, "proxy_requests", *labels, via).inc()
        length = None
        for name, value in conn.headers:
            lower = name.lower()
            if lower == b"content-length":
                length = value
            elif lower == b"transfer-encoding":
                length = b"chunked"  # its chunks say where it ends (RFC 9112 6.3)
                break
        out_headers = response_headers(
            [(n.decode("latin-1"), v.decode("latin-1")) for n, v in conn.headers],
            prefix=prefix, via_link=via == "link")
        received, released = 0, False

        def finished() -> None:
            nonlocal released
            if not released:
                released = True
                self.counter(metrics, "proxy_bytes", *labels, "in").inc(0)
                self.counter(metrics, "proxy_bytes", *labels, "out").inc(received)
                pool.release(conn)

        if length is None or not length.isdigit() or int(length) > 1024**2:
            async def chunks() -> AsyncIterator[bytes]:  # a stream: Starlette's watch
                nonlocal received
                try:
                    while chunk := await conn.chunk(None):
                        received += len(chunk)
                        yield chunk
                finally:  # (broken off: the caller's connection is closed unfinished)
                    finished()

            response = ports._Relayed(chunks(), status_code=conn.status, bounded=False)
            response.raw_headers = out_headers
            try:
                await response(scope, receive, send)
            finally:
                if not released:  # its caller left before the body began
                    conn.close()
                    finished()
            return
        left, ended = int(length), False
        try:
            await send({"type": "http.response.start", "status": conn.status,
                        "headers": out_headers})
            while chunk := await conn.chunk(ports.BOUNDED_STALL_S):
                received += len(chunk)
                left -= len(chunk)
                await send({"type": "http.response.body", "body": chunk,
                            "more_body": left > 0})  # the last one ends it: one send less
                ended = left <= 0
        except (TimeoutError, Unanswered):  # stalled (BOUNDED_STALL_S) or broken: left
            conn.close()                    # unfinished, the caller's connection closed
            return
        finally:
            finished()
        if not ended:  # an empty body
            await send({"type": "http.response.body", "body": b"", "more_body": False})


_PLAIN: dict[str, tuple[str, int, str] | None] = {}


def _plain(base: str) -> tuple[str, int, str] | None:
    """(host, port, Host header) of an upstream base URL upstream.py's client reaches
    (`http://HOST:PORT`, no TLS, no IPv6 brackets); None for any other (httpx's)."""
    found = _PLAIN.get(base, False)
    if found is not False:
        return found  # type: ignore[return-value]
    address = None
    rest = base.removeprefix("http://")
    if rest != base and "/" not in rest and "@" not in rest and "[" not in rest:
        host, colon, number = rest.partition(":")
        if host and (not colon or number.isdigit() and 0 < int(number) < 65536):
            address = (host, int(number) if colon else 80, rest)
    if len(_PLAIN) > 4096:
        _PLAIN.clear()
    _PLAIN[base] = address
    return address


def _proxy_of(scope: Scope) -> Any:
    """The app's proxy state (routes/ports.py makes it on first use)."""
    proxy = getattr(scope["app"].state, "proxy", None)
    if proxy is None or not getattr(proxy, "lean", False):
        from starlette.requests import HTTPConnection

        from sandboxer_tui.service.routes import ports

        proxy = ports._proxy(HTTPConnection(scope))
        lean_pool(proxy.upstreams.http())  # on asyncio's streams
        pool = proxy.pool = Pool()  # upstream.py's client, closed with the proxy
        closing = proxy.close

        async def close() -> None:
            pool.close()
            await closing()

        proxy.close = close
        proxy.lean = True
    return proxy


async def _target(scope: Scope, via: str, name: str, port: int,
                  ) -> tuple[Any, int, str, str, str, str] | None:
    """(sandbox, port, upstream base URL, tail, prefix, via) when every check passes; None
    (or an exception) when the routes are to answer instead."""
    from sandboxer.service import Scope as KeyScope

    app = scope["app"]
    proxy = _proxy_of(scope)
    raw = scope.get("raw_path") or scope["path"].encode()
    segments = raw.decode("latin-1").split("/")
    query = scope.get("query_string", b"").decode("latin-1")
    if via == "key":
        key = scope.get("state", {}).get("api_key")
        if key is None or not KeyScope(key["scope"]).allows(KeyScope.WRITE):
            return None
        box = proxy.found.get(key["id"], name)
        if box is None:
            from starlette.requests import Request

            from sandboxer_tui.service.auth import caller

            who = await caller(Request(scope), KeyScope.WRITE)
            box = await who.client.get(name)
            proxy.found.put(who.principal, name, box)
        tail, prefix = segments[6:], f"/v1/sandboxes/{name}/ports/{port}"
    else:
        link = proxy.links.check(name)  # LinkRefused: the route's 403
        box = await app.state.service.client.get(link.sandbox_id)
        if box is None or box.state != "running":
            return None
        port, tail, prefix = link.port, segments[4:], f"/v1/previews/{name}"
    base = await proxy.upstreams.url(box, port)
    return (box, port, base, "/" + "/".join(tail) + (f"?{query}" if query else ""), prefix,
            via)


# -- the upstream connections ---------------------------------------------------------------


def lean_pool(http: Any) -> None:
    """The proxy's pool (service/proxy.py's Upstreams, an httpx transport) connecting through
    asyncio's own streams (`AsyncioBackend`) instead of anyio's, which cost about a third of
    the pool's time per request; a pool of another shape is left as it is."""
    pool = getattr(http, "_pool", None)
    if pool is not None and hasattr(pool, "_network_backend"):
        if not isinstance(pool._network_backend, AsyncioBackend):
            pool._network_backend = AsyncioBackend()


def _backend_base() -> tuple[type, type]:
    from httpcore._backends.base import AsyncNetworkBackend, AsyncNetworkStream

    return AsyncNetworkBackend, AsyncNetworkStream


class AsyncioStream(_backend_base()[1]):  # type: ignore[misc]
    """One connection to a sandbox's port, as httpcore reads and writes it, with its errors
    as httpcore's (the httpx transport maps them on: 502, 504)."""

    def __init__(self, reader: Any, writer: Any) -> None:
        self._reader, self._writer = reader, writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        import asyncio

        from httpcore import ReadError, ReadTimeout

        try:
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError as exc:
            raise ReadTimeout(exc) from exc
        except OSError as exc:
            raise ReadError(exc) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        import asyncio

        from httpcore import WriteError, WriteTimeout

        if not buffer:
            return
        try:
            self._writer.write(buffer)
            async with asyncio.timeout(timeout):
                await self._writer.drain()
        except TimeoutError as exc:
            raise WriteTimeout(exc) from exc
        except (OSError, RuntimeError) as exc:  # RuntimeError: written after a close
            raise WriteError(exc) from exc

    async def aclose(self) -> None:
        self._writer.close()

    async def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                        timeout: float | None = None) -> AsyncioStream:
        from httpcore import ConnectError, ConnectTimeout

        try:
            await self._writer.start_tls(ssl_context, server_hostname=server_hostname,
                                         ssl_handshake_timeout=timeout)
        except TimeoutError as exc:
            await self.aclose()
            raise ConnectTimeout(exc) from exc
        except Exception as exc:  # ssl.SSLError, OSError
            await self.aclose()
            raise ConnectError(exc) from exc
        return self

    def get_extra_info(self, info: str) -> Any:
        if info == "ssl_object":
            return self._writer.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._writer.get_extra_info("sockname")
        if info == "server_addr":
            return self._writer.get_extra_info("peername")
        if info == "socket":
            return self._writer.get_extra_info("socket")
        if info == "is_readable":  # an idle connection the other end closed, or wrote on
            from httpcore._utils import is_socket_readable

            return self._reader.at_eof() or is_socket_readable(
                self._writer.get_extra_info("socket"))
        return None


class AsyncioBackend(_backend_base()[0]):  # type: ignore[misc]
    """httpcore's network backend on asyncio's streams (TCP; a unix socket through anyio's)."""

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Any = None) -> AsyncioStream:
        import asyncio

        from httpcore import ConnectError, ConnectTimeout

        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, local_addr=(local_address, 0) if local_address else None)
        except TimeoutError as exc:
            raise ConnectTimeout(exc) from exc
        except OSError as exc:
            raise ConnectError(exc) from exc
        sock = writer.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return AsyncioStream(reader, writer)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Any = None) -> Any:
        from httpcore._backends.anyio import AnyIOBackend

        return await AnyIOBackend().connect_unix_socket(path, timeout, socket_options)

    async def sleep(self, seconds: float) -> None:
        import asyncio

        await asyncio.sleep(seconds)
