"""The service's proxy to a sandbox's ports and its signed preview links
(docs/terminals-and-ports.md, "The proxy and preview links"), on the real Docker engine and a
live `sbx serve`: an HTTP server and a WebSocket echo in a real sandbox (python3's standard
library, in `sandboxer/python-base:bookworm`), reached through the proxy with a key and with
a link. The sbx key and the link never reach the sandbox; no key is 401, another tenant's
sandbox 404, an altered or expired link 403 (one line), a destroyed sandbox's link 404;
traffic moves the sandbox's last activity and the metrics count it. The network is the
installation's own private bridge (`network: {mode: full}`, labelled with the installation,
removed by id with the containers); all traffic goes to 127.0.0.1."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.service.live import LiveService, served_profile
from tests.support import RUN_LABEL

pytestmark = pytest.mark.docker

# an HTTP server (8080) and a WebSocket echo (8765), standard library only
SERVER = r'''
import base64, hashlib, json, socketserver, struct, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Web(BaseHTTPRequestHandler):
    def answer(self, status, body, **headers):
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path.startswith("/redirect"):
            return self.answer(302, b"", Location="/hello")
        if self.path.startswith("/headers"):
            seen = {"path": self.path, "headers": dict(self.headers.items())}
            return self.answer(200, json.dumps(seen).encode())
        self.answer(200, b"hello from the sandbox\n", Set_Cookie="a=1")
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.answer(200, hashlib.sha256(body).hexdigest().encode())
    def log_message(self, *args):
        pass

class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        sock = self.request.makefile("rwb")
        key = ""
        while (line := sock.readline().strip()):
            name, _, value = line.decode().partition(":")
            if name.lower() == "sec-websocket-key":
                key = value.strip()
        accept = base64.b64encode(hashlib.sha1(
            (key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        sock.write(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: "
                    f"Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n").encode())
        sock.flush()
        while True:
            head = sock.read(2)
            if len(head) < 2:
                return
            opcode, size = head[0] & 15, head[1] & 127
            if size == 126:
                size = struct.unpack(">H", sock.read(2))[0]
            elif size == 127:
                size = struct.unpack(">Q", sock.read(8))[0]
            mask = sock.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(sock.read(size)))
            if opcode == 8:
                sock.write(b"\x88\x02" + data[:2]); sock.flush(); return
            if opcode in (1, 2):
                n = len(data)
                size = bytes([n]) if n < 126 else b"\x7e" + struct.pack(">H", n)
                sock.write(bytes([0x80 | opcode]) + size + data); sock.flush()

socketserver.ThreadingTCPServer.allow_reuse_address = True
echo = socketserver.ThreadingTCPServer(("0.0.0.0", 8765), Echo)
threading.Thread(target=echo.serve_forever, daemon=True).start()
ThreadingHTTPServer(("0.0.0.0", 8080), Web).serve_forever()
'''

PROFILE = {"backend": "docker", "image": "sandboxer/python-base:bookworm",
           "network": {"mode": "full"}, "ports": [8080, 8765], "command": ["python3", "-c",
                                                                          SERVER],
           "ttl": {"default": "10m", "max": "1h", "idle": "30m"}}


class Service:
    def __init__(self, live: LiveService) -> None:
        self.live = live
        self.url = live.url
        self.writer = live.key("write", owner="writer")

    def http(self, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60, trust_env=False)

    def sandbox(self, http: httpx.Client) -> dict:
        made = http.post("/v1/sandboxes", json={"profile": "web", "labels": dict(
            [RUN_LABEL.split("=", 1)])})
        assert made.status_code == 201, made.text
        return made.json()


@pytest.fixture
def service(sbx_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            docker_api) -> Iterator[Service]:
    with served_profile(sbx_home, tmp_path / "profiles", monkeypatch, "web", PROFILE) as live:
        yield Service(live)


def when_up(http: httpx.Client, path: str, limit_s: float = 60) -> httpx.Response:
    """GET `path` until the server in the sandbox answers (it starts with the container)."""
    give_up = time.monotonic() + limit_s
    while True:
        reply = http.get(path)
        if reply.status_code != 502 or time.monotonic() > give_up:
            return reply
        time.sleep(0.1)


def ws_url(service: Service, path: str) -> str:
    return "ws" + service.url.removeprefix("http") + path


def test_http_and_a_websocket_through_the_proxy_with_a_key(service: Service) -> None:
    from websockets.sync.client import connect

    with service.http(service.writer) as http:
        box = service.sandbox(http)
        base = f"/v1/sandboxes/{box['id']}/ports/8080"
        hello = when_up(http, base + "/hello")
        assert (hello.status_code, hello.text) == (200, "hello from the sandbox\n")
        assert hello.headers["set-cookie"] == f"a=1; Path={base}/"  # kept to this port

        # what reached the sandbox: the path below the port, never the key
        seen = http.get(base + "/headers?x=1%2F2", headers={"X-Custom": "yes"}).json()
        assert seen["path"] == "/headers?x=1%2F2"
        headers = {k.lower(): v for k, v in seen["headers"].items()}
        assert "authorization" not in headers and "sbxk_" not in json.dumps(seen)
        assert headers["x-custom"] == "yes" and headers["x-forwarded-for"] == "127.0.0.1"

        # a body larger than SBX_SERVE_MAX_BODY (1 MiB) streams through
        import hashlib

        body = bytes(range(256)) * (3 * 4096)  # 3 MiB
        posted = http.post(base + "/echo", content=body)
        assert (posted.status_code, posted.text) == (200, hashlib.sha256(body).hexdigest())

        # a redirect to the sandbox's root stays under the proxy
        moved = http.get(base + "/redirect")
        assert (moved.status_code, moved.headers["location"]) == (302, base + "/hello")

        # a WebSocket on the same path, relayed both ways
        key = {"Authorization": f"Bearer {service.writer}"}
        with connect(ws_url(service, f"/v1/sandboxes/{box['id']}/ports/8765/echo"),
                     additional_headers=key, open_timeout=30) as ws:
            ws.send("hello, echo")
            assert ws.recv(timeout=10) == "hello, echo"
            ws.send(b"\x00\x01binary")
            assert ws.recv(timeout=10) == b"\x00\x01binary"

        # nothing listens on a published port's path: 502, one line, no address
        gone = http.get(f"/v1/sandboxes/{box['id']}/ports/9999/x")
        assert gone.status_code == 404 and "its ports: 8080, 8765" in gone.json()["error"][
            "message"]

    # no key: 401; a read key: 403; another tenant's write key: 404
    with service.http(None) as anonymous:
        refused = anonymous.get(base + "/hello")
        assert refused.status_code == 401
    with service.http(service.live.key("read", owner="writer")) as reader:
        assert reader.get(base + "/hello").status_code == 403
    with service.http(service.live.key("write", owner="someone-else")) as other:
        not_theirs = other.get(base + "/hello")
        assert not_theirs.status_code == 404, not_theirs.text
        assert other.post(base + "/links", json={}).status_code == 404
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as caught:
        connect(ws_url(service, f"/v1/sandboxes/{box['id']}/ports/8765/echo"),
                open_timeout=30)
    assert caught.value.response.status_code == 401


def test_traffic_is_activity_and_the_metrics_count_it(service: Service) -> None:
    with service.http(service.writer) as http:
        box = service.sandbox(http)
        base = f"/v1/sandboxes/{box['id']}/ports/8080"
        assert when_up(http, base + "/hello").status_code == 200
        before = http.get(f"/v1/sandboxes/{box['id']}").json()["last_activity_at"]
        give_up = time.monotonic() + 20
        while True:  # the clock moves on, and traffic marks it (at most once a second)
            assert http.get(base + "/hello").status_code == 200
            after = http.get(f"/v1/sandboxes/{box['id']}").json()["last_activity_at"]
            if after > before or time.monotonic() > give_up:
                break
            time.sleep(0.2)
        assert after > before
        events = http.get("/v1/events", params={"sandbox": box["id"]}).json()
        assert "sandbox.touched" not in [e["type"] for e in events]  # quiet: no event each

        for _ in range(5):
            assert http.get(base + "/hello").status_code == 200
    with service.http(service.live.key("admin")) as admin:
        text = admin.get("/metrics").text
    requests = [line for line in text.splitlines()
                if line.startswith("sbx_proxy_requests_total{") and box["id"] in line]
    assert len(requests) == 1 and 'port="8080"' in requests[0] and 'via="key"' in requests[0]
    assert float(requests[0].rsplit(" ", 1)[1]) >= 7
    out = [line for line in text.splitlines() if line.startswith("sbx_proxy_bytes_total{")
           and box["id"] in line and 'direction="out"' in line]
    assert out and float(out[0].rsplit(" ", 1)[1]) >= 7 * len("hello from the sandbox\n")


def test_a_signed_link_opens_one_port_without_a_key_until_it_expires(service: Service,
                                                                      ) -> None:
    from websockets.sync.client import connect

    with service.http(service.writer) as http:
        box = service.sandbox(http)
        assert when_up(http, f"/v1/sandboxes/{box['id']}/ports/8080/hello").status_code == 200
        made = http.post(f"/v1/sandboxes/{box['id']}/ports/8080/links",
                         json={"expires_in": "10m"})
        assert made.status_code == 201, made.text
        link = made.json()
        assert link["url"] == service.url + link["path"] and link["port"] == 8080
        token = link["path"].split("/")[3]

        # too long, or a port it does not publish: refused, no event
        assert http.post(f"/v1/sandboxes/{box['id']}/ports/8080/links",
                         json={"expires_in": "25h"}).status_code == 400
        assert http.post(f"/v1/sandboxes/{box['id']}/ports/9090/links",
                         json={}).status_code == 404
        events = http.get("/v1/events", params={"sandbox": box["id"]}).json()
        made_links = [e for e in events if e["type"] == "sandbox.port.link"]
        assert len(made_links) == 1 and made_links[0]["payload"]["port"] == 8080
        assert token not in json.dumps(events)  # the link is a credential: never recorded

        ws_link = http.post(f"/v1/sandboxes/{box['id']}/ports/8765/links", json={}).json()

    with service.http(None) as browser:
        page = browser.get(link["path"] + "hello")
        assert (page.status_code, page.text) == (200, "hello from the sandbox\n")
        assert page.headers["referrer-policy"] == "no-referrer"
        seen = browser.get(link["path"] + "headers", headers={
            "Referer": link["url"], "Authorization": "Basic dXNlcjpwdw=="}).json()
        assert seen["path"] == "/headers" and token not in json.dumps(seen)
        headers = {k.lower(): v for k, v in seen["headers"].items()}
        assert headers["authorization"] == "Basic dXNlcjpwdw=="  # the app's own
        assert "referer" not in headers
        assert browser.get(link["path"].rstrip("/")).status_code == 307

        with connect(ws_url(service, ws_link["path"] + "echo"), open_timeout=30) as ws:
            ws.send("through a link")
            assert ws.recv(timeout=10) == "through a link"

        # altered: 403, one line; a link to another port is another link
        payload, mac = token.split(".")
        for bad in (payload + "." + mac[:-1] + ("A" if mac[-1] != "A" else "B"),
                    payload[:-1] + "." + mac, "nonsense"):
            refused = browser.get(f"/v1/previews/{bad}/hello")
            assert refused.status_code == 403
            assert refused.text.count("\n") == 1 and "not valid" in refused.text

    with service.http(service.writer) as http:
        short = http.post(f"/v1/sandboxes/{box['id']}/ports/8080/links",
                          json={"expires_in": 1}).json()
        with service.http(None) as browser:
            give_up = time.monotonic() + 10
            while (answer := browser.get(short["path"] + "hello")).status_code == 200:
                assert time.monotonic() < give_up, "the link did not expire"
                time.sleep(0.2)
            assert answer.status_code == 403 and answer.text == (
                "this preview link has expired: ask for a new one\n")

        # destroying the sandbox revokes its links
        assert http.delete(f"/v1/sandboxes/{box['id']}").status_code == 200
    with service.http(None) as browser:
        revoked = browser.get(link["path"] + "hello")
        assert revoked.status_code == 404 and "gone" in revoked.text
