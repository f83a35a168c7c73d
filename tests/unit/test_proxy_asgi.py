"""The proxy's upstream connections on asyncio's streams (service/proxy_asgi.py's
AsyncioBackend under the proxy's httpx transport), against real HTTP servers on 127.0.0.1:
a server that keeps connections alive has them reused, one that closes an idle connection
is reconnected to, and nothing listening or no answer in time are httpx's own errors (the
proxy's 502 and 504)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from sandboxer_tui.service.proxy import TIMEOUTS, Upstreams
from sandboxer_tui.service.proxy_asgi import AsyncioBackend, lean_pool


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
