"""The remote client sends its key only where it means to (docs/service.md, "The remote
client"): over `unix:///PATH` only to a listener of this user (SO_PEERCRED, checked before a
byte is sent), and to a loopback URL (127.0.0.0/8, ::1, localhost) never through a proxy the
environment names (HTTP_PROXY, ALL_PROXY), which would see the key."""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import sandboxer
from tests.service.conftest import live, stub_named  # noqa: F401 (fixtures)
from tests.service.live import LiveService

NOBODY = 65534
TOKEN = "sbxk_01jtrustcheck_notarealsecretbutsecretenough"

# A listener of uid `nobody` at argv[1]: says "ready", then for each connection the number of
# bytes it got before the client closed it ("got N").
SQUATTER = """
import socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.bind(sys.argv[1])
sock.listen(16)
print("ready", flush=True)
while True:
    conn, _ = sock.accept()
    conn.settimeout(30)
    got = b""
    try:
        while chunk := conn.recv(65536):
            got += chunk
    except OSError:
        pass
    conn.close()
    print(f"got {len(got)}", flush=True)
"""


def read_line(proc: subprocess.Popen, within: float) -> str:
    """The next line `proc` prints, waiting at most `within` seconds."""
    ready, _, _ = select.select([proc.stdout], [], [], within)
    assert ready, f"no line from the listener within {within} s"
    return proc.stdout.readline().strip()


@pytest.fixture
def squatted() -> Iterator[tuple[str, subprocess.Popen]]:
    """A unix socket bound by another user (`nobody`), where the service's would be."""
    python = "/usr/bin/python3"
    if os.geteuid() != 0 or not os.access(python, os.X_OK):
        pytest.skip("needs root (to run a listener as nobody) and /usr/bin/python3")
    folder = tempfile.mkdtemp(prefix="sbx-squat-")
    os.chown(folder, NOBODY, NOBODY)
    path = os.path.join(folder, "sbx.sock")
    proc = subprocess.Popen([python, "-c", SQUATTER, path], user=NOBODY, group=NOBODY,
                            extra_groups=[], stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        assert read_line(proc, 30) == "ready"
        assert os.stat(path).st_uid == NOBODY
        yield path, proc
    finally:
        proc.kill()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def test_a_socket_of_another_user_gets_nothing_and_the_client_says_so(squatted, sbx):
    path, listener = squatted
    with sandboxer.Sandboxer(url=f"unix://{path}", token=TOKEN) as client:
        with pytest.raises(sandboxer.Unavailable, match=r"another user \(uid 65534\)"):
            client.list()
    assert read_line(listener, 30) == "got 0"  # connected, checked, closed: not one byte

    cli = sbx("ls", env={"SBX_URL": f"unix://{path}", "SBX_TOKEN": TOKEN})
    assert cli.code == 5, (cli.out, cli.err)
    lines = cli.err.strip().splitlines()
    assert len(lines) == 1 and "another user (uid 65534)" in lines[0], cli.err
    assert TOKEN not in cli.err and "Traceback" not in cli.err
    assert read_line(listener, 30) == "got 0"


def test_the_services_own_socket_still_answers(sbx_home, stub_named, tmp_path):  # noqa: F811
    service = LiveService(sbx_home, socket_path=str(tmp_path / "sbx.sock")).start()
    try:
        with sandboxer.Sandboxer(url=f"unix://{tmp_path / 'sbx.sock'}") as client:
            box = client.create(stub_named)
            assert [b.id for b in client.list()] == [box.id]
    finally:
        service.stop()


# -- proxies --------------------------------------------------------------------------------


class RecordingProxy(ThreadingHTTPServer):
    """An HTTP proxy on 127.0.0.1 that forwards nothing: it records each request it gets
    (request line and headers) and answers 502."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                server.seen.append(f"{self.requestline}\n{self.headers}")
                self.send_response(502)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = do_PUT = do_DELETE = do_CONNECT = _record

            def log_message(self, *args) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingProxy]:
    """The proxy, named by every variable a client may read it from; no NO_PROXY."""
    server = RecordingProxy()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, server.url)
        monkeypatch.setenv(name.lower(), server.url)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield server
    server.shutdown()
    server.server_close()


def test_a_loopback_service_is_never_reached_through_a_proxy(live, stub_named, proxy, sbx):  # noqa: F811
    token = live.key("write", owner="writer")
    port = live.url.rsplit(":", 1)[1]
    for url in (live.url, f"http://localhost:{port}"):
        with sandboxer.Sandboxer(url=url, token=token) as client:
            box = client.create(stub_named)
            assert box.id in [b.id for b in client.list()]
    cli = sbx("ls", "--json", env={"SBX_URL": live.url, "SBX_TOKEN": token})
    assert cli.code == 0, cli.err
    assert box.id in cli.out
    assert proxy.seen == []


def test_a_service_elsewhere_still_goes_through_the_proxy(proxy):
    """Only loopback goes direct: another host is reached the way the environment says (here
    the proxy on 127.0.0.1, which answers 502 and is the only thing contacted)."""
    with sandboxer.Sandboxer(url="http://sbx.example:8765", token=TOKEN) as client:
        with pytest.raises(sandboxer.Unavailable, match="502"):
            client.list()
    deadline = time.monotonic() + 30
    while not proxy.seen and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proxy.seen and proxy.seen[0].startswith("GET http://sbx.example:8765/v1/sandboxes")


def test_loopback_is_127_8_ipv6_and_localhost_only():
    from sandboxer._remote import _loopback

    for url in ("http://127.0.0.1:8765", "http://127.8.9.10", "http://[::1]:8765",
                "http://localhost:8765", "https://LOCALHOST./x", "http://[::ffff:127.0.0.1]",
                "http://0.0.0.0:8765"):
        assert _loopback(url), url
    for url in ("http://10.0.0.1:8765", "http://sbx.example", "http://127.0.0.1.example",
                "http://[2001:db8::1]", "http://localhost.example.com"):
        assert not _loopback(url), url
