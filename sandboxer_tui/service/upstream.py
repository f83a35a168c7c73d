"""The proxy's lean upstream client (docs/terminals-and-ports.md, "The proxy and preview
links"): a request without a body (GET, DELETE, OPTIONS) to a sandbox's plain-HTTP port,
written by hand and its answer parsed by httptools (llhttp, in C) on an asyncio Protocol.
The httpx transport it stands beside (service/proxy.py's Upstreams) cost about half of the
service's CPU per proxied request in h11 (pure Python), httpcore's pool and asyncio's
streams; what this client does not do (a body to send, HEAD, TLS, an upgrade) stays there.

Its errors are `Unanswered`: nothing listening, the connection closed before the answer's
headers or in its body, an answer llhttp refuses (the proxy's 502), or no answer in time
(504). Connections the sandbox keeps alive are reused (`Pool`); one reused connection that
the sandbox closed unanswered is retried once on a new one, as the request has no body and
its method is idempotent (RFC 9110 9.2.2)."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

import httptools  # the service's extra (pyproject.toml): uvicorn's parser too

LEAN_METHODS = frozenset({"GET", "DELETE", "OPTIONS"})
HIGH_WATER = 256 * 1024  # an answer's body buffered unread past this: stop reading it
IDLE_S = 5.0  # a kept-alive connection unused this long is closed, not reused
MAX_IDLE = 64  # kept-alive connections kept, all ports together (httpx's pool's figure)


class Unanswered(Exception):
    """No usable answer from the port: `timeout` for 504, else 502; `forget` when nothing
    listens there (the port's address is looked up again next time)."""

    def __init__(self, why: str, *, timeout: bool = False, forget: bool = False) -> None:
        super().__init__(why)
        self.timeout, self.forget = timeout, forget


def head(method: str, target: str, host: str, headers: list[tuple[str, str]]) -> bytes | None:
    """The request's line and headers, Host first (as httpx writes them); None for a target
    this client does not send as it is (anything outside printable ASCII: httpx's path
    checks it and says 400 or escapes it)."""
    if not target.startswith("/") or not target.isascii() or not target.isprintable() \
            or " " in target:
        return None
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in headers]
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


class Connection(asyncio.Protocol):
    """One connection to a port: one request at a time, its answer parsed as it comes."""

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.transport: Any = None
        self.parser = httptools.HttpResponseParser(self)
        # an answer framed by both Content-Length and chunks is read by its chunks (RFC
        # 9112 6.3), as h11 reads it, not refused
        self.parser.set_dangerous_leniencies(lenient_chunked_length=True)
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.busy = False
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.framed = False  # a Content-Length or chunks say where the body ends
        self.started: asyncio.Future | None = None  # the headers came
        self.body: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.paused = False
        self.waiter: asyncio.Future | None = None
        self.done = False
        self.keep = False
        self.error: Unanswered | None = None
        self.heard = False  # any byte of this request's answer came

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if not self.busy or self.done:  # nothing asked: a server that talks out of turn
            self.closed = True
            self.transport.close()
            return
        self.heard = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # a 101 to a plain request: the headers stand
            self.keep = False
            self._end()
        except httptools.HttpParserError as exc:
            self._fail(Unanswered(f"answered something that is not HTTP/1.1 ({exc})"))
            self.transport.close()

    def eof_received(self) -> bool:
        self._lost()
        return False  # close

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost()

    def _lost(self) -> None:
        self.closed = True
        if not self.busy or self.done or self.error is not None:
            return
        if self.started is not None and self.started.done() and not self.framed:
            self._end()  # a body that ends where the connection does (RFC 9112 6.3 #8)
        elif self.started is not None and self.started.done():
            self._fail(Unanswered("closed the connection in the middle of its answer"))
        else:
            self._fail(Unanswered("closed the connection without answering"))

    def pause_writing(self) -> None:  # a request's head is small: never waited for
        pass

    def resume_writing(self) -> None:
        pass

    # -- httptools callbacks -----------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # informational (103...): not passed on
            self.headers = []
            return
        self.status = status
        for name, value in self.headers:
            lower = name.lower()
            if lower == b"content-length" or (lower == b"transfer-encoding"
                                               and b"chunked" in value.lower()):
                self.framed = True
        if status in (204, 304):
            self.framed = True
        self.keep = self.parser.should_keep_alive()
        if self.started is not None and not self.started.done():
            self.started.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if 100 <= self.status < 200 or self.status == 0:
            return  # an informational answer's end: the real one follows
        self._end()

    # -- states ------------------------------------------------------------------------

    def _end(self) -> None:
        self.done = True
        if self.started is not None and not self.started.done():
            self.started.set_result(None)
        self._wake()

    def _fail(self, error: Unanswered) -> None:
        self.error = error
        if self.started is not None and not self.started.done():
            self.started.set_exception(error)
            self.started.exception()  # retrieved: whoever awaits it raises it
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def chunk(self, stall: float | None) -> bytes:
        """The answer's next piece of body; b"" at its end. Unanswered when the connection
        broke; TimeoutError when nothing came for `stall` seconds."""
        while True:
            if self.body:
                piece = self.body.popleft()
                self.buffered -= len(piece)
                if self.paused and self.buffered < HIGH_WATER // 4:
                    self.paused = False
                    if not self.closed and not self.transport.is_closing():
                        self.transport.resume_reading()
                return piece
            if self.error is not None:
                raise self.error
            if self.done:
                return b""
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                if stall is None:
                    await self.waiter
                else:
                    async with asyncio.timeout(stall):
                        await self.waiter
            finally:
                self.waiter = None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Pool:
    """Connections to ports, kept alive where the sandbox's server keeps them (busybox
    httpd closes each one: then every request connects anew, as a caller straight would)."""

    def __init__(self) -> None:
        self.idle: dict[tuple[str, int], list[Connection]] = {}
        self.count = 0

    async def request(self, host: str, port: int, request: bytes, *,
                      connect_timeout: float | None, read_timeout: float | None,
                      ) -> Connection:
        """The connection whose answer's headers came (`status`, `headers`); read its body
        with `chunk()`, then `release()` it."""
        key = (host, port)
        conn = self._reused(key)
        if conn is not None:
            try:
                return await self._ask(conn, request, read_timeout)
            except Unanswered as exc:
                conn.close()
                if conn.heard or exc.timeout:
                    raise
                # kept alive, then closed by the sandbox just as it was asked: once more
            except BaseException:
                conn.close()
                raise
        conn = await self._connect(key, connect_timeout)
        try:
            return await self._ask(conn, request, read_timeout)
        except BaseException:
            conn.close()
            raise

    def _reused(self, key: tuple[str, int]) -> Connection | None:
        idle = self.idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            self.count -= 1
            if not conn.closed and not conn.transport.is_closing() \
                    and now - conn.idle_since < IDLE_S:
                return conn
            conn.close()
        return None

    async def _connect(self, key: tuple[str, int], timeout: float | None) -> Connection:
        loop = asyncio.get_running_loop()
        conn = Connection(key)
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(lambda: conn, key[0], key[1])
        except TimeoutError:
            conn.close()
            raise Unanswered("did not accept a connection in time", timeout=True) from None
        except OSError:
            raise Unanswered("does not answer: nothing listens there", forget=True) from None
        return conn

    async def _ask(self, conn: Connection, request: bytes, timeout: float | None,
                   ) -> Connection:
        conn._reset()
        conn.busy = True
        conn.started = asyncio.get_running_loop().create_future()
        conn.transport.write(request)
        if conn.closed:  # lost before the write (a reused connection's race)
            conn._lost()
        try:
            if timeout is None:
                await conn.started
            else:
                async with asyncio.timeout(timeout):
                    await conn.started
        except TimeoutError:
            raise Unanswered("did not answer in time", timeout=True) from None
        return conn

    def release(self, conn: Connection) -> None:
        """Done with `conn`: kept for the next request when its answer ended cleanly and
        the sandbox keeps it alive, else closed."""
        if (not conn.done or not conn.keep or conn.closed or conn.error is not None
                or conn.body or conn.transport.is_closing()):
            conn.close()
            return
        conn._reset()
        if self.count >= MAX_IDLE:
            for idle in self.idle.values():
                while idle:
                    idle.pop().close()
            self.count = 0
        conn.idle_since = time.monotonic()
        self.idle.setdefault(conn.key, []).append(conn)
        self.count += 1

    def close(self) -> None:
        for idle in self.idle.values():
            for conn in idle:
                conn.close()
        self.idle.clear()
        self.count = 0
