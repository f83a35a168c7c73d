"""What a sandbox's answers may not do to the service's origin (docs/security.md, "Preview
links"): every sandbox's pages are served on the service's one origin, through the proxy
and its links, so a header that acts on the whole origin (a service worker's scope, cookies
for every path, clearing the origin's storage, HSTS, another service for the origin) is
dropped or kept to the sandbox's own path; and a request framed two ways at once is not
passed on to be read a third way. On the real Docker engine and a live `sbx serve`."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.service.live import LiveService, served_profile
from tests.service.test_port_proxy import when_up
from tests.support import RUN_LABEL

pytestmark = pytest.mark.docker

# an HTTP/1.1 server (keeps connections alive) that answers origin-wide headers and
# remembers the paths it was asked for
SERVER = r'''
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SEEN = []

class Web(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self, body, headers=()):
        self.send_response(200)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        SEEN.append(self.path)
        if self.path == "/seen":
            return self.answer(json.dumps(SEEN).encode())
        if self.path == "/closed":
            return self.answer(str(len(self.closed)).encode())
        self.answer(b"a page\n", [
            ("Service-Worker-Allowed", "/"),
            ("Set-Cookie", "sid=secret; Path=/; Domain=127.0.0.1; HttpOnly"),
            ("Set-Cookie", "theme=dark"),
            ("Set-Cookie", "deep=1; path=/app/x; Secure"),
            ("Clear-Site-Data", '"*"'),
            ("Strict-Transport-Security", "max-age=31536000; includeSubDomains"),
            ("Alt-Svc", 'h2="evil.example:443"'),
        ])
    def do_POST(self):
        SEEN.append(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.answer(body)
    def log_message(self, *args):
        pass

# 8081: an answer of known length that stops after its headers; GET /closed on 8080 says
# whether the proxy closed that connection since
import socket, threading
CLOSED = []
def stall():
    listener = socket.create_server(("0.0.0.0", 8081))
    while True:
        conn, _ = listener.accept()
        def hold(conn=conn):
            asked = conn.recv(65536)
            if asked.startswith(b"GET /both "):  # framed by Content-Length and chunks both
                body = b"x" * 100
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: "
                             b"chunked\r\nConnection: close\r\n\r\n64\r\n" + body
                             + b"\r\n0\r\n\r\n")
                return conn.close()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            while conn.recv(65536):
                pass
            CLOSED.append(1)
        threading.Thread(target=hold, daemon=True).start()
threading.Thread(target=stall, daemon=True).start()
Web.closed = CLOSED

ThreadingHTTPServer(("0.0.0.0", 8080), Web).serve_forever()
'''

PROFILE = {"backend": "docker", "image": "sandboxer/python-base:bookworm",
           "network": {"mode": "full"}, "ports": [8080, 8081],
           "command": ["python3", "-c", SERVER],
           "ttl": {"default": "10m", "max": "1h", "idle": "30m"}}


@pytest.fixture
def live(sbx_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         docker_api) -> Iterator[LiveService]:
    with served_profile(sbx_home, tmp_path / "profiles", monkeypatch, "origin", PROFILE) as live:
        yield live


@pytest.fixture
def port_service(sbx_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, docker_api):
    """test_port_proxy's service: its HTTP server (8080) and WebSocket echo (8765)."""
    from tests.service import test_port_proxy

    yield from test_port_proxy.service.__wrapped__(sbx_home, tmp_path, monkeypatch, docker_api)


@pytest.fixture
def sandbox(live: LiveService) -> Iterator[tuple[httpx.Client, dict]]:
    key = live.key("write", owner="writer")
    with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {key}"},
                      timeout=60, trust_env=False) as http:
        made = http.post("/v1/sandboxes", json={"profile": "origin", "labels": dict(
            [RUN_LABEL.split("=", 1)])})
        assert made.status_code == 201, made.text
        box = made.json()
        assert when_up(http, f"/v1/sandboxes/{box['id']}/ports/8080/seen").status_code == 200
        yield http, box


def test_a_sandboxs_answer_cannot_act_on_the_services_whole_origin(sandbox) -> None:
    http, box = sandbox
    prefix = f"/v1/sandboxes/{box['id']}/ports/8080"
    link = http.post(prefix + "/links", json={"expires_in": "10m"})
    assert link.status_code == 201, link.text
    through_link = link.json()["path"].rstrip("/")
    for base, client in ((prefix, http), (through_link, httpx.Client(
            base_url=http.base_url, timeout=60, trust_env=False))):
        page = client.get(base + "/app/index.html")
        assert (page.status_code, page.text) == (200, "a page\n")
        # a service worker the page registers could otherwise take the whole origin
        for name in ("service-worker-allowed", "clear-site-data",
                     "strict-transport-security", "alt-svc"):
            assert name not in page.headers, (base, name)
        # cookies stay on this sandbox's port: never for the service's other paths (another
        # sandbox's pages, another tenant's link), never for another domain
        cookies = page.headers.get_list("set-cookie")
        assert cookies == [f"sid=secret; Path={base}/; HttpOnly", f"theme=dark; Path={base}/",
                           f"deep=1; Path={base}/app/x; Secure"], cookies


def test_a_request_framed_two_ways_is_not_passed_on(live: LiveService, sandbox) -> None:
    """Content-Length and Transfer-Encoding both: the service refuses it rather than passing
    a body the sandbox's server would frame otherwise (a request smuggled behind it)."""
    http, box = sandbox
    prefix = f"/v1/sandboxes/{box['id']}/ports/8080"
    smuggled = (f"GET {prefix}/smuggled HTTP/1.1\r\nHost: x\r\n\r\n").encode()
    body = b"0\r\n\r\n" + smuggled
    head = (f"POST {prefix}/echo HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: {http.headers['authorization']}\r\n"
            f"Content-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    host, port = live.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        raw.sendall(head + body)
        raw.settimeout(5)
        answer = b""
        try:
            while chunk := raw.recv(65536):
                answer += chunk
        except TimeoutError:
            pass
    seen = http.get(prefix + "/seen").json()
    assert "/smuggled" not in seen and not any(p.endswith("/smuggled") for p in seen), (
        seen, answer[:300])


def test_a_stalled_answer_is_not_held_for_good_once_its_caller_left(sandbox, monkeypatch):
    """An answer of known length whose body stops coming, its caller gone: the connection to
    the sandbox is closed after BOUNDED_STALL_S, not held forever (each such request kept
    one of the proxy's pooled connections, shared by every tenant, until the pool ran out)."""
    from sandboxer_tui.service.routes import ports

    monkeypatch.setattr(ports, "BOUNDED_STALL_S", 2.0)
    http, box = sandbox
    prefix = f"/v1/sandboxes/{box['id']}/ports"
    with pytest.raises(httpx.ReadTimeout):
        http.get(prefix + "/8081/stall", timeout=httpx.Timeout(60, read=1))
    give_up = time.monotonic() + 30
    while http.get(prefix + "/8080/closed").text != "1":
        assert time.monotonic() < give_up, "the proxy still holds the stalled connection"
        time.sleep(0.2)


def test_revoking_the_key_closes_its_proxied_websocket(monkeypatch, port_service) -> None:
    """A WebSocket through the proxy with a key is one long request: revoking the key closes
    it (1008) within KEY_CHECK_S, rather than leaving a leaked key its connection."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    from sandboxer_tui.service import auth
    from tests.service.test_port_proxy import ws_url

    monkeypatch.setattr(auth, "KEY_CHECK_S", 0.5)
    service = port_service
    record, token = service.live.new_key("write", owner="writer")
    with service.http(token) as http, service.http(service.live.key("admin")) as admin:
        box = service.sandbox(http)
        assert when_up(http, f"/v1/sandboxes/{box['id']}/ports/8080/hello").status_code == 200
        with connect(ws_url(service, f"/v1/sandboxes/{box['id']}/ports/8765/echo"),
                     additional_headers={"Authorization": f"Bearer {token}"},
                     open_timeout=30) as ws:
            ws.send("before")
            assert ws.recv(timeout=10) == "before"
            assert admin.delete(f"/v1/api-keys/{record['id']}").status_code == 200
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    ws.recv(timeout=30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


def test_an_answer_framed_two_ways_is_passed_on_by_its_chunks(sandbox) -> None:
    """A sandbox's answer with both Content-Length and Transfer-Encoding: chunked is read by
    its chunks (RFC 9112 6.3: they win), so its Content-Length is not passed on: passed on,
    it promised the caller another length than the body that followed."""
    http, box = sandbox
    both = http.get(f"/v1/sandboxes/{box['id']}/ports/8081/both")
    assert (both.status_code, both.content) == (200, b"x" * 100)
