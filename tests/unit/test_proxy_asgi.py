"""The proxy's upstream connections on asyncio's streams (service/proxy_asgi.py's
AsyncioBackend under the proxy's httpx transport), against real HTTP servers on 127.0.0.1:
a server that keeps connections alive has them reused, one that closes an idle connection
is reconnected to, and nothing listening or no answer in time are httpx's own errors (the
proxy's 502 and 504)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from sandboxer_tui.service.proxy import TIMEOUTS, Upstreams
from sandboxer_tui.service.proxy_asgi import AsyncioBackend, lean_pool
from sandboxer_tui.service.upstream import Pool, Unanswered, head


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    connections = 0

    def get_request(self):  # every connection it accepts, counted
        self.connections += 1
        return super().get_request()


class _KeepAlive(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # connections kept alive between requests

    def do_GET(self) -> None:
        body = self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        if self.path == "/last":
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    httpd = _Server(("127.0.0.1", 0), _KeepAlive)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


async def _get(http: httpx.AsyncHTTPTransport, url: str, **timeouts: float) -> tuple[int, bytes]:
    answer = await http.handle_async_request(httpx.Request(
        "GET", url, extensions={"timeout": {**TIMEOUTS, **timeouts}}))
    try:
        return answer.status_code, await answer.aread()
    finally:
        await answer.aclose()


def test_the_pool_runs_on_asyncio_streams_and_keeps_connections_alive(server: _Server) -> None:
    async def run() -> list[tuple[int, bytes]]:
        upstreams = Upstreams()
        http = upstreams.http()
        lean_pool(http)
        assert isinstance(http._pool._network_backend, AsyncioBackend)
        base = f"http://127.0.0.1:{server.server_address[1]}"
        try:
            got = [await _get(http, f"{base}/{n}") for n in range(3)]
            assert server.connections == 1  # one connection, kept alive, for all three
            got.append(await _get(http, f"{base}/last"))  # the server closes it after this
            got.append(await _get(http, f"{base}/again"))  # so a new one is made
            assert server.connections == 2
            return got
        finally:
            await upstreams.close()

    assert asyncio.run(run()) == [(200, b"/0"), (200, b"/1"), (200, b"/2"), (200, b"/last"),
                                  (200, b"/again")]


def test_nothing_listening_and_no_answer_are_httpx_errors() -> None:
    async def run() -> None:
        upstreams = Upstreams()
        http = upstreams.http()
        lean_pool(http)
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        try:
            with pytest.raises(httpx.ConnectError):
                await _get(http, f"http://127.0.0.1:{port}/")
            with socket.socket() as silent:  # accepts, never answers
                silent.bind(("127.0.0.1", 0))
                silent.listen()
                with pytest.raises(httpx.ReadTimeout):
                    await _get(http, f"http://127.0.0.1:{silent.getsockname()[1]}/",
                               read=0.3)
        finally:
            await upstreams.close()

    asyncio.run(run())


# -- upstream.py's lean client (a request without a body), against raw servers on 127.0.0.1


class _Raw:
    """A TCP server on 127.0.0.1 that answers each connection as `script` says: it is given
    the connection and the request's head (read up to its blank line) and writes what it
    likes. Heads are kept in `heads`, connections counted in `connections`."""

    def __init__(self, script) -> None:
        self.script, self.heads, self.connections = script, [], 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            buffered = b""
            while True:
                while b"\r\n\r\n" not in buffered:
                    got = conn.recv(65536)
                    if not got:
                        return
                    buffered += got
                asked, _, buffered = buffered.partition(b"\r\n\r\n")
                self.heads.append(asked + b"\r\n\r\n")
                if self.script(conn, asked) == "close":
                    return

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def raw() -> Iterator[Callable[..., _Raw]]:
    made: list[_Raw] = []

    def make(script) -> _Raw:
        made.append(_Raw(script))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture(params=["asyncio", "uvloop"])
def run_on(request: pytest.FixtureRequest) -> Callable:
    """asyncio's own loop, and uvloop's, which `sbx serve` runs on."""
    if request.param == "uvloop":
        import uvloop

        return uvloop.run
    return asyncio.run


async def _ask(pool: Pool, port: int, path: str = "/", *, read: float | None = None,
               headers: list[tuple[str, str]] = ()) -> tuple[int, list, bytes]:
    """One GET through `pool`: (status, headers, body)."""
    request = head("GET", path, f"127.0.0.1:{port}", list(headers))
    conn = await pool.request("127.0.0.1", port, request, connect_timeout=5,
                              read_timeout=read)
    status, got, body = conn.status, conn.headers, b""
    try:
        while chunk := await conn.chunk(5):
            body += chunk
    finally:
        pool.release(conn)
    return status, got, body


def test_the_lean_client_reads_answers_by_length_by_chunks_and_to_the_close(raw, run_on) -> None:
    def script(conn: socket.socket, asked: bytes) -> str | None:
        path = asked.split(b" ")[1]
        if path == b"/length":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello")
        elif path == b"/chunks":  # in pieces, as a stream comes
            conn.sendall(b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab")
            time.sleep(0.05)
            conn.sendall(b"c\r\n")
            time.sleep(0.05)
            conn.sendall(b"2\r\nde\r\n0\r\n\r\n")
        elif path == b"/early":  # an informational answer before the real one
            conn.sendall(b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n"
                         b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        elif path == b"/both":  # framed two ways: its chunks win (RFC 9112 6.3)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: "
                         b"chunked\r\n\r\n4\r\nxxxx\r\n0\r\n\r\n")
        else:  # no length: the body ends where the connection does
            conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
            return "close"
        return None

    server = raw(script)

    async def run() -> list[tuple[int, list, bytes]]:
        pool = Pool()
        try:
            return [await _ask(pool, server.port, path)
                    for path in ("/length", "/chunks", "/early", "/both", "/close")]
        finally:
            pool.close()

    got = run_on(run())
    assert got[0] == (200, [(b"Content-Length", b"5"), (b"X-A", b"1")], b"hello")
    assert (got[1][0], got[1][2]) == (201, b"abcde")
    assert (got[2][0], got[2][2]) == (200, b"ok")
    assert (got[3][0], got[3][2]) == (200, b"xxxx")
    assert (got[4][0], got[4][2]) == (200, b"until the end")
    assert server.connections == 1  # kept alive for all four, closed by the server after


def test_the_lean_client_sends_the_headers_httpx_sends(raw, run_on) -> None:
    """The same request's head, through httpx's transport and through the lean client."""
    def script(conn: socket.socket, asked: bytes) -> None:
        conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")

    server = raw(script)
    headers = [("accept", "*/*"), ("X-Custom", "yes, a value"), ("cookie", "a=1"),
               ("x-forwarded-for", "127.0.0.1"), ("x-forwarded-proto", "http")]

    async def run() -> None:
        upstreams = Upstreams()
        http = upstreams.http()
        lean_pool(http)
        pool = Pool()
        try:
            answer = await http.handle_async_request(httpx.Request(
                "GET", f"http://127.0.0.1:{server.port}/a/b%2Fc?x=1&y=%20", headers=headers,
                extensions={"timeout": TIMEOUTS}))
            await answer.aread()
            await answer.aclose()
            assert (await _ask(pool, server.port, "/a/b%2Fc?x=1&y=%20",
                               headers=headers))[0] == 204
        finally:
            pool.close()
            await upstreams.close()

    run_on(run())
    assert len(server.heads) == 2 and server.heads[0] == server.heads[1], server.heads


def test_the_lean_client_leaves_what_it_cannot_send_to_httpx() -> None:
    assert head("GET", "/ok?a=b", "h:1", []) is not None
    for target in ("/a b", "/caf\u00e9", "/a\r\nX: y", "relative"):
        assert head("GET", target, "h:1", []) is None, target


def test_the_lean_client_says_why_there_is_no_answer(raw, run_on) -> None:
    """Nothing listening, a connection closed before the answer or in its body: 502
    (Unanswered, no timeout); no answer in time: 504 (a timeout)."""
    def script(conn: socket.socket, asked: bytes) -> str | None:
        path = asked.split(b" ")[1]
        if path == b"/short":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            return "close"
        if path == b"/half":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Le")
            return "close"
        if path == b"/garbage":
            conn.sendall(b"SSH-2.0-OpenSSH\r\n\r\n")
            return "close"
        if path == b"/slow":
            time.sleep(3)
        return "close"

    server = raw(script)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        nobody = free.getsockname()[1]

    async def run() -> None:
        pool = Pool()
        try:
            with pytest.raises(Unanswered) as gone:
                await _ask(pool, nobody)
            assert (gone.value.timeout, gone.value.forget) == (False, True)
            for path in ("/half", "/garbage", "/nothing"):
                with pytest.raises(Unanswered) as broken:
                    await _ask(pool, server.port, path)
                assert not broken.value.timeout, path
            with pytest.raises(Unanswered) as cut:  # the headers came, then the body broke
                await _ask(pool, server.port, "/short")
            assert "middle" in str(cut.value)
            started = time.monotonic()
            with pytest.raises(Unanswered) as slow:
                await _ask(pool, server.port, "/slow", read=0.3)
            assert slow.value.timeout and time.monotonic() - started < 2.5
            assert pool.count == 0  # none of them is kept for another request
        finally:
            pool.close()

    run_on(run())


def test_a_kept_connection_the_server_closed_is_asked_again_on_a_new_one(raw, run_on) -> None:
    """A server that keeps a connection alive, then closes it as the next request comes:
    that request is sent once more on a new connection (it has no body; GET)."""
    asked_on: list[int] = []

    def script(conn: socket.socket, asked: bytes) -> str | None:
        asked_on.append(conn.fileno())
        if asked.split(b" ")[1] == b"/drop":
            return "close"  # read, never answered: as a server closing an idle connection
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        return None

    server = raw(script)

    async def run() -> tuple[int, list, bytes]:
        pool = Pool()
        try:
            assert (await _ask(pool, server.port, "/first"))[2] == b"ok"
            assert pool.count == 1
            return await _ask(pool, server.port, "/drop")
        finally:
            pool.close()

    with pytest.raises(Unanswered):  # a new connection's request unanswered is not retried
        run_on(run())
    # the kept connection was asked once, then a new one once (not more)
    assert server.connections == 2 and len(server.heads) == 3


def test_a_large_answer_is_read_in_step_with_its_reader(raw, run_on) -> None:
    """An answer larger than the client buffers (HIGH_WATER): reading from the port stops
    while it waits to be read and goes on after, to the whole body, by length and to the
    close."""
    big = bytes(range(256)) * 8192  # 2 MiB

    def script(conn: socket.socket, asked: bytes) -> str | None:
        if asked.split(b" ")[1] == b"/length":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big) + big)
            return None
        conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + big)
        return "close"

    server = raw(script)

    async def read(pool: Pool, path: str) -> tuple[bytes, int]:
        conn = await pool.request("127.0.0.1", server.port,
                                  head("GET", path, "h", []), connect_timeout=5,
                                  read_timeout=5)
        await asyncio.sleep(0.3)  # the reader is slow: the client stops short of it all
        most = conn.buffered
        body = b""
        try:
            while chunk := await conn.chunk(5):
                body += chunk
        finally:
            pool.release(conn)
        return body, most

    async def run() -> None:
        pool = Pool()
        try:
            for path in ("/length", "/close"):
                body, most = await read(pool, path)
                assert body == big, path
                assert most < len(big) // 2, (path, most)
        finally:
            pool.close()

    run_on(run())


def test_the_fast_path_answers_through_the_lean_client(raw, run_on, tmp_path, monkeypatch):
    """FastProxy's request without a body, on the lean client: an answer by length and one
    by chunks passed on with their headers, counted in the metrics and as activity;
    nothing listening or a connection closed unanswered is 502 (the port's address looked
    up again), no answer in time 504, each one line naming no address."""
    import json
    from types import SimpleNamespace

    from sandboxer_tui.service import proxy as proxy_module
    from sandboxer_tui.service.metrics import ServiceMetrics
    from sandboxer_tui.service.proxy import Proxy
    from sandboxer_tui.service.proxy_asgi import FastProxy

    def script(conn: socket.socket, asked: bytes) -> str | None:
        path = asked.split(b" ")[1]
        if path == b"/length":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n"
                         b"Location: /next\r\n\r\nhello")
        elif path == b"/chunks":
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
            time.sleep(0.05)
            conn.sendall(b"2\r\nde\r\n0\r\n\r\n")
        elif path == b"/slow":
            time.sleep(2)
            return "close"
        else:
            return "close"  # unanswered
        return None

    server = raw(script)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        nobody = free.getsockname()[1]
    monkeypatch.setitem(proxy_module.TIMEOUTS, "read", 0.3)
    marked: list[str] = []

    async def mark(sandbox_id: str) -> None:
        marked.append(sandbox_id)

    metrics = ServiceMetrics()
    app = SimpleNamespace(state=SimpleNamespace(service=SimpleNamespace(metrics=metrics)))
    box = SimpleNamespace(id="sbx-one")

    async def through(path: str, port: int) -> tuple[int, list, bytes]:
        proxy = Proxy.made(tmp_path / "links.key", mark)
        proxy.pool = Pool()
        proxy.upstreams.urls[(box.id, 8080)] = (f"http://127.0.0.1:{port}", time.monotonic())
        sent: list[dict] = []

        async def receive() -> dict:
            await asyncio.Event().wait()  # the caller stays
            return {}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "app": app, "method": "GET", "path": "/", "headers": []}
        request = head("GET", path, f"127.0.0.1:{port}", [])
        try:
            await FastProxy(None).forward_lean(  # type: ignore[arg-type]
                scope, receive, send, proxy, box, 8080, ("127.0.0.1", port, "h"), request,
                "/v1/sandboxes/one/ports/8080", "key")
            await asyncio.sleep(0)  # the activity's mark, made in the background
        finally:
            proxy.pool.close()
        assert sent[0]["type"] == "http.response.start" and not sent[-1].get("more_body")
        # after a 502 the port's address is looked up again next time (as httpx's path)
        assert ((box.id, 8080) in proxy.upstreams.urls) is (sent[0]["status"] != 502)
        return (sent[0]["status"], sent[0]["headers"],
                b"".join(m.get("body", b"") for m in sent[1:]))

    async def run() -> list[tuple[int, list, bytes]]:
        return [await through(path, port) for path, port in (
            ("/length", server.port), ("/chunks", server.port), ("/", nobody),
            ("/unanswered", server.port), ("/slow", server.port))]

    length, chunks, nothing, unanswered, slow = run_on(run())
    assert length == (200, [(b"content-length", b"5"), (b"x-a", b"1"),
                            (b"location", b"/v1/sandboxes/one/ports/8080/next")], b"hello")
    assert chunks[0] == 200 and chunks[2] == b"abcde"
    assert b"content-length" not in dict(chunks[1])
    for status, answer in ((502, nothing), (502, unanswered), (504, slow)):
        assert answer[0] == status
        message = json.loads(answer[2])["error"]["message"]
        assert "port 8080 of sandbox sbx-one" in message and "127.0.0.1" not in message
    assert marked and set(marked) == {"sbx-one"}
    assert metrics.registry.get_sample_value("sbx_proxy_requests_total", {
        "sandbox": "sbx-one", "port": "8080", "via": "key"}) == 2
    assert metrics.registry.get_sample_value("sbx_proxy_bytes_total", {
        "sandbox": "sbx-one", "port": "8080", "direction": "out"}) == 10
