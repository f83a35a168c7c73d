"""The service against hostile clients (docs/security.md, "The service's limits"): the key is
checked before a body is read, bodies are capped (413), event streams are capped per key
and in all (429), connections are capped with /healthz still answering, headers have a
deadline and a size cap, exports stream, and an exec's JSON reply is capped and says so.
Real uvicorn on 127.0.0.1 (in the test process, or a real `sbx serve` to measure memory),
raw sockets where a client would hide what the server does."""

from __future__ import annotations

import json
import socket
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from support import RUN_LABEL, SBX, query

from tests.service.conftest import Api
from tests.service.live import LiveService, start_process, stop_process

MiB = 1024 * 1024


def _connect(url: str, timeout: float = 30) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout)
    return sock


def _request(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response read off `sock`: status, headers (lower-case names), body."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        assert piece, f"the connection closed before a response: {data!r}"
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":")
                                                             for line in lines)}
    want = int(headers.get("content-length", "0"))
    while len(body) < want:
        piece = sock.recv(65536)
        assert piece, "the connection closed inside the body"
        body += piece
    return int(status_line.split()[1]), headers, body


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed `sock` (reading whatever it sent), or None."""
    started = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - started < seconds:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except ConnectionResetError:
            return time.monotonic() - started
    return None


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _sandbox_rows(home: Path) -> int:
    return query(home, "SELECT count(*) AS n FROM sandboxes")[0]["n"]


@pytest.fixture
def limited(sbx_home, stub_named, monkeypatch):
    """Starts a live service with the given settings (SBX_SERVE_...=value)."""
    started = []

    def start(**settings: str) -> LiveService:
        for name, value in settings.items():
            monkeypatch.setenv(name, value)
        started.append(LiveService(sbx_home).start())
        return started[-1]

    yield start
    for service in started:
        service.stop()


# -- before a body is read ------------------------------------------------------------------

def test_an_unauthenticated_300_mib_post_gets_401_before_its_body_is_read(sbx, tmp_path):
    """A real `sbx serve`: the 401 comes back with nothing of the body sent; then sending
    the body (as much as the service takes before it hangs up) grows it by a few MB only."""
    proc, url = start_process(SBX, sbx.env(), cwd=tmp_path)
    try:
        before = _rss(proc.pid)
        sock = _connect(url)
        sock.sendall(_request("POST", "/v1/sandboxes", {
            "Content-Type": "application/json", "Content-Length": str(300 * MiB)}))
        status, headers, body = _response(sock)  # not one byte of the body was sent
        assert status == 401 and headers.get("connection") == "close"
        assert headers.get("www-authenticate") == "Bearer"
        error = json.loads(body)["error"]
        assert error["kind"] == "unauthorized" and error["code"] == 5
        sent = 0
        try:
            chunk = b"x" * MiB
            while sent < 300 * MiB:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass  # the service closed the connection: it does not read the body
        sock.close()
        assert sent < 300 * MiB, "the service read a 300 MiB body it had refused"
        assert _rss(proc.pid) - before < 30 * MiB
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
    finally:
        stop_process(proc)
    assert _sandbox_rows(sbx.home) == 0


def test_a_chunked_body_past_the_cap_is_413_and_the_service_does_not_grow(sbx, tmp_path):
    """A key's 300 MiB chunked body (no Content-Length to judge it by): 413 once 1 MiB came,
    the connection closed, nothing made, the real process a few MB larger at most."""
    made = sbx("api-keys", "create", "--scope", "write", "--owner", "big")
    token = made.out.split()[-1]
    proc, url = start_process(SBX, sbx.env(), cwd=tmp_path)
    try:
        before = _rss(proc.pid)
        sock = _connect(url)
        sock.sendall(_request("POST", "/v1/sandboxes", {
            "Authorization": f"Bearer {token}", "Content-Type": "application/json",
            "Transfer-Encoding": "chunked"}))
        sent, chunk = 0, b"%x\r\n%s\r\n" % (MiB, b" " * MiB)
        try:
            while sent < 300:
                sock.sendall(chunk)
                sent += 1
        except OSError:
            pass
        status, headers, body = _response(sock)
        assert status == 413, body
        assert headers.get("connection") == "close"
        error = json.loads(body)["error"]
        assert error["kind"] == "bad_input" and "SBX_SERVE_MAX_BODY" in error["message"]
        assert "1 MiB" in error["message"]
        assert sent < 300, "the service read all of a body past its cap"
        assert _rss(proc.pid) - before < 30 * MiB
        sock.close()
    finally:
        stop_process(proc)
    assert _sandbox_rows(sbx.home) == 0


def test_the_key_is_looked_up_once_a_request(live, api, monkeypatch):
    calls = []
    authenticate = live.client.authenticate

    async def counted(token):
        calls.append(token)
        return await authenticate(token)

    monkeypatch.setattr(live.client, "authenticate", counted)
    assert api.get("/v1/sandboxes").status_code == 200
    assert api.post("/v1/sandboxes", json={"profile": "stubby"}).status_code == 201
    assert len(calls) == 2


def test_a_declared_body_past_the_cap_is_413_before_it_is_read(live, api, sbx_home):
    sock = _connect(live.url)
    sock.sendall(_request("POST", "/v1/sandboxes", {
        "Authorization": api.headers["authorization"], "Content-Type": "application/json",
        "Content-Length": str(MiB + 1)}))
    status, headers, body = _response(sock)  # none of it sent
    sock.close()
    assert status == 413 and headers.get("connection") == "close"
    assert json.loads(body)["error"]["message"] == (
        "the request's body is larger than 1 MiB, the most this route takes "
        "(SBX_SERVE_MAX_BODY)")
    # a route that reads no body at all is refused too, before it acts
    box = api.post("/v1/sandboxes", json={"profile": "stubby"}).json()
    touched = box["last_activity_at"]
    refused = api.post(f"/v1/sandboxes/{box['id']}/touch", content=b"{}" * MiB)
    assert refused.status_code == 413
    assert api.get(f"/v1/sandboxes/{box['id']}").json()["last_activity_at"] == touched
    assert _sandbox_rows(sbx_home) == 1
    # a body within the cap is read as before
    assert api.post("/v1/sandboxes", json={"profile": "stubby",
                                           "task": "t" * 1000}).status_code == 201


def test_an_import_past_its_cap_is_413_and_leaves_nothing(limited, sbx_home, monkeypatch,
                                                          tmp_path):
    service = limited(SBX_SERVE_MAX_UPLOAD="64KiB")
    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    api = Api(service.url, service.key("write", owner="importer"))

    def pieces():
        for _ in range(4):
            yield b"\0" * (32 * 1024)

    refused = api.post("/v1/checkpoints/import", content=pieces(),
                       headers={"Content-Type": "application/gzip"})
    assert refused.status_code == 413, refused.text
    assert "64 KiB" in refused.json()["error"]["message"]
    assert "SBX_SERVE_MAX_UPLOAD" in refused.json()["error"]["message"]
    assert list(spool.iterdir()) == []  # the part that came was removed
    assert query(sbx_home, "SELECT count(*) AS n FROM checkpoints")[0]["n"] == 0
    # past the general 1 MiB cap would be fine on this route: the upload cap is its own
    small = api.post("/v1/checkpoints/import", content=b"\0" * 1000,
                     headers={"Content-Type": "application/gzip"})
    assert small.status_code == 400  # read, and refused as an archive: not a size matter


def test_a_bad_limit_setting_stops_the_service_from_starting(sbx, tmp_path):
    done = sbx("serve", "--listen", "127.0.0.1:0", env={"SBX_SERVE_MAX_STREAMS": "-3"},
               timeout=60)
    assert done.code == 2, done.err
    assert "SBX_SERVE_MAX_STREAMS" in done.err and "Traceback" not in done.err


# -- streams ----------------------------------------------------------------------------------

def _open_stream(url: str, token: str) -> tuple[socket.socket, int, bytes]:
    sock = _connect(url)
    sock.sendall(_request("GET", "/v1/events", {"Authorization": f"Bearer {token}",
                                                "Accept": "text/event-stream"}))
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        assert piece, data
        data += piece
    return sock, int(data.split()[1]), data


def test_streams_are_capped_per_key_and_in_all(limited):
    service = limited(SBX_SERVE_MAX_STREAMS_PER_KEY="3", SBX_SERVE_MAX_STREAMS="5")
    alice, bob = service.key("read", owner="alice"), service.key("read", owner="bob")
    held = []
    try:
        def open_then_refused(key: str, streams: int) -> httpx.Response:
            """`streams` event streams of `key` open (held), then the next one's answer."""
            for _ in range(streams):
                sock, status, _ = _open_stream(service.url, key)
                assert status == 200
                held.append(sock)
            return httpx.get(f"{service.url}/v1/events", timeout=30, headers={
                "Authorization": f"Bearer {key}", "Accept": "text/event-stream"})

        refused = open_then_refused(alice, 3)
        assert refused.status_code == 429
        assert "(SBX_SERVE_MAX_STREAMS_PER_KEY)" in refused.json()["error"]["message"]
        refused = open_then_refused(bob, 2)
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert "SBX_SERVE_MAX_STREAMS)" in error["message"] and error["code"] == 5
        # a plain (not streamed) request of the same key is served meanwhile
        assert httpx.get(f"{service.url}/v1/events", timeout=30, headers={
            "Authorization": f"Bearer {bob}"}).status_code == 200
        # a stream closed frees its slot
        held.pop(0).close()
        deadline = time.monotonic() + 30
        while True:
            sock, status, _ = _open_stream(service.url, alice)
            if status == 200:
                held.append(sock)
                break
            sock.close()
            assert time.monotonic() < deadline, "a closed stream kept its slot"
            time.sleep(0.1)
    finally:
        for sock in held:
            sock.close()


def _refusals(caplog: pytest.LogCaptureFixture, path: str) -> int:
    """How many of the library's requests to `path` the service answered 429 (httpx's log)."""
    return sum(1 for r in caplog.records
               if r.name == "httpx" and path in r.getMessage() and " 429 " in r.getMessage())


def _execs(home: Path) -> int:
    return query(home, "SELECT count(*) AS n FROM events WHERE type = 'sandbox.exec'")[0]["n"]


@pytest.fixture
def slot_taken(limited, sbx_home, caplog):
    """A live service whose keys may each hold one event stream; a library client of a write
    key with a sandbox made; that key's one slot taken by a raw stream (`held`, closed by
    the test when it frees the slot); httpx's request log captured (to count the library's
    refused requests)."""
    import logging
    from types import SimpleNamespace

    import sandboxer

    caplog.set_level(logging.INFO, logger="httpx")
    service = limited(SBX_SERVE_MAX_STREAMS_PER_KEY="1")
    key = service.key("write", owner="runner")
    with sandboxer.Sandboxer(url=service.url, token=key) as sbx:
        box = sbx.create("stubby")
        before = _execs(sbx_home)
        held, status, _ = _open_stream(service.url, key)
        assert status == 200
        try:
            yield SimpleNamespace(box=box, held=held, before=before)
        finally:
            held.close()
            box.destroy()


def test_a_library_stream_refused_for_a_slot_waits_for_one_and_runs_once(slot_taken, sbx_home,
                                                                         caplog, monkeypatch):
    """An exec through the library is an event stream: refused because the key's streams are
    all open (429, Retry-After), it is asked again until a slot frees, and then runs once."""
    import sandboxer._remote

    monkeypatch.setattr(sandboxer._remote, "STREAM_SLOT_WAIT_S", 300.0)  # a busy machine
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["result"] = slot_taken.box.exec(["echo", "waited"])
        except Exception as exc:  # noqa: BLE001 - asserted below
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    try:
        deadline = time.monotonic() + 60
        while _refusals(caplog, "/exec") < 2:  # refused, then asked again
            assert worker.is_alive(), outcome
            assert time.monotonic() < deadline, "the exec was never refused twice"
            time.sleep(0.05)
        assert worker.is_alive() and _execs(sbx_home) == slot_taken.before  # not run yet
    finally:
        slot_taken.held.close()
    worker.join(120)
    assert not worker.is_alive() and "error" not in outcome, outcome
    result = outcome["result"]
    assert result.exit_code == 0 and result.stdout == b"waited\n"
    assert _execs(sbx_home) == slot_taken.before + 1  # run once


def test_a_library_stream_that_finds_no_slot_in_time_says_which_cap(slot_taken, sbx_home, caplog,
                                                                    monkeypatch):
    """Past STREAM_SLOT_WAIT_S the refusal reaches the caller as one line naming the cap, and
    the command never ran."""
    import sandboxer
    import sandboxer._remote

    monkeypatch.setattr(sandboxer._remote, "STREAM_SLOT_WAIT_S", 1.5)
    started = time.monotonic()
    with pytest.raises(sandboxer.Unavailable, match="SBX_SERVE_MAX_STREAMS_PER_KEY") as refused:
        slot_taken.box.exec(["echo", "never"])
    waited = time.monotonic() - started
    slot_taken.held.close()
    assert "\n" not in str(refused.value) and _refusals(caplog, "/exec") >= 2
    assert 1.5 <= waited < 20, waited  # the bound set, not the default 30 s or forever
    assert _execs(sbx_home) == slot_taken.before


def test_a_sync_call_interrupted_while_it_waits_for_a_slot_never_runs(slot_taken, sbx_home,
                                                                     caplog):
    """Ctrl-C on a sync exec waiting for a slot stops its asking too: freed later, the slot
    is not taken by a command its caller gave up on."""
    import os
    import signal

    def interrupt_once_refused() -> None:
        """Ctrl-C, as a terminal sends it, once the exec waits for its slot (and only then:
        a SIGINT elsewhere would end the test run)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if _refusals(caplog, "/exec") >= 1:
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.05)

    assert threading.current_thread() is threading.main_thread()  # where SIGINT lands
    # Python's own handler, as in a terminal: a run started in the background may have
    # inherited SIGINT ignored
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt_once_refused, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            slot_taken.box.exec(["echo", "abandoned"])
    finally:
        signal.signal(signal.SIGINT, handler)
    asked = _refusals(caplog, "/exec")
    assert asked >= 1
    # still asking, it would be refused again within each Retry-After (1 s): watch three of
    # them (an absence has no condition to wait for, only a window)
    quiet_until = time.monotonic() + 3.5
    while time.monotonic() < quiet_until:
        assert _refusals(caplog, "/exec") == asked, "the interrupted exec kept asking"
        time.sleep(0.1)
    slot_taken.held.close()
    # the slot freed: a new exec runs (it too may wait for the service to see the slot
    # free), and is the only one that ever ran
    assert slot_taken.box.exec(["echo", "next"]).stdout == b"next\n"
    assert _execs(sbx_home) == slot_taken.before + 1


# -- connections ------------------------------------------------------------------------------

def test_a_connection_that_never_finishes_its_headers_is_closed(limited):
    service = limited(SBX_SERVE_HEADER_TIMEOUT="1s")
    half = _connect(service.url)
    half.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    silent = _connect(service.url)  # sends nothing at all
    dribbling = _connect(service.url)  # a byte at a time does not buy more time
    stop = threading.Event()

    def dribble() -> None:
        dribbling.sendall(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
        while not stop.wait(0.2):
            try:
                dribbling.sendall(b"a")
            except OSError:
                return

    thread = threading.Thread(target=dribble, daemon=True)
    thread.start()
    try:
        for sock in (half, silent, dribbling):
            took = _closed_within(sock, 10)
            assert took is not None and took < 5, "a connection without headers stayed open"
    finally:
        stop.set()
        thread.join(5)
        for sock in (half, silent, dribbling):
            sock.close()
    # a keep-alive connection that finished a request gets the deadline again after it
    sock = _connect(service.url)
    sock.sendall(_request("GET", "/healthz", {}))
    assert _response(sock)[0] == 200
    assert _closed_within(sock, 10) is not None
    sock.close()


def test_headers_past_their_cap_are_431_and_the_connection_closed(live):
    sock = _connect(live.url)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    try:
        for _ in range(20):
            sock.sendall(b"X-Big: " + b"a" * 8000 + b"\r\n")
    except OSError:
        pass
    status, headers, body = _response(sock)
    assert status == 431 and json.loads(body)["error"]["kind"] == "bad_input"
    assert _closed_within(sock, 10) is not None
    sock.close()
    assert httpx.get(f"{live.url}/healthz", timeout=10).status_code == 200


def test_past_the_connection_cap_only_health_answers(limited, sbx_home):
    service = limited(SBX_SERVE_MAX_CONNECTIONS="20")
    token = service.key("write", owner="crowd")
    idle = [_connect(service.url) for _ in range(25)]
    try:
        deadline = time.monotonic() + 30
        while True:  # the service has accepted them all
            sock = _connect(service.url)
            sock.sendall(_request("POST", "/v1/sandboxes", {
                "Authorization": f"Bearer {token}", "Content-Type": "application/json",
                "Content-Length": "22"}) + b'{"profile": "stubby"}\n')
            status, headers, body = _response(sock)
            sock.close()
            if status == 503 or time.monotonic() > deadline:
                break
        assert status == 503, body
        error = json.loads(body)["error"]
        assert "SBX_SERVE_MAX_CONNECTIONS" in error["message"] and error["kind"] == "unavailable"
        assert headers.get("connection") == "close"
        assert _sandbox_rows(sbx_home) <= 1  # at most the one made before the cap was reached
        before = _sandbox_rows(sbx_home)
        for path in ("/healthz", "/readyz"):
            assert httpx.get(f"{service.url}{path}", timeout=10).status_code == 200
        assert _sandbox_rows(sbx_home) == before
    finally:
        for sock in idle:
            sock.close()
    # once they are gone, everything answers again
    deadline = time.monotonic() + 30
    while httpx.get(f"{service.url}/v1/events", timeout=10,
                    headers={"Authorization": f"Bearer {token}"}).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_health_stays_fast_while_the_limits_are_hit(sbx, tmp_path):
    """A real `sbx serve` with its default limits: every stream it allows (16 keys' worth
    and more, refused), a crowd of connections that never finish their headers, and /healthz
    p99 over 200 requests stays under 50 ms."""
    tokens = []
    for index in range(10):
        made = sbx("api-keys", "create", "--scope", "read", "--owner", f"reader{index}")
        tokens.append(made.out.split()[-1])
    proc, url = start_process(SBX, sbx.env(), cwd=tmp_path)
    held: list[socket.socket] = []
    try:
        statuses = []
        for token in tokens:  # 10 keys x 16 = 160 asked, 128 allowed in all
            for _ in range(16):
                sock, status, _ = _open_stream(url, token)
                statuses.append(status)
                (held.append(sock) if status == 200 else sock.close())
        assert statuses.count(200) == 128 and statuses.count(429) == 32
        for _ in range(200):  # slow clients: half a request line each
            sock = _connect(url)
            sock.sendall(b"GET /v1/events HTTP/1.1\r\nHost: 1")
            held.append(sock)
        with httpx.Client(base_url=url, timeout=10) as client:
            for _ in range(20):
                client.get("/healthz")  # warm
            took = []
            for _ in range(200):
                started = time.perf_counter()
                assert client.get("/healthz").status_code == 200
                took.append(time.perf_counter() - started)
        took.sort()
        p99 = took[int(len(took) * 0.99) - 1]
        assert p99 < 0.050, f"/healthz p99 {p99 * 1000:.1f} ms"
    finally:
        for sock in held:
            sock.close()
        stop_process(proc)


# -- what leaves the service ------------------------------------------------------------------

def test_an_execs_reply_is_capped_and_says_so(limited, sbx_home):
    service = limited(SBX_SERVE_MAX_EXEC_OUTPUT="2")
    api = Api(service.url, service.key("write", owner="runner"))
    box = api.post("/v1/sandboxes", json={"profile": "stubby"}).json()
    reply = api.post(f"/v1/sandboxes/{box['id']}/exec",
                     json={"argv": ["echo", "héllo", "world"]}).json()
    assert reply["exit_code"] == 0
    # 2 bytes would cut é in two: the cut falls before it, so the text stays text
    assert reply["stdout"] == "h" and reply["stdout_bytes"] == len("héllo world\n".encode())
    assert reply["stdout_truncated"] is True
    assert (reply["stderr"], reply["stderr_bytes"], reply["stderr_truncated"]) == ("", 0, False)
    short = api.post(f"/v1/sandboxes/{box['id']}/exec", json={"argv": ["echo", "o"]}).json()
    assert (short["stdout"], short["stdout_truncated"], short["stdout_bytes"]) == (
        "o\n", False, 2)
    # the stream form has no cap
    with api.stream("POST", f"/v1/sandboxes/{box['id']}/exec",
                    json={"argv": ["echo", "héllo", "world"]},
                    headers={"Accept": "text/event-stream"}) as streamed:
        text = streamed.read().decode()
    frames = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
    assert frames[0] == {"data": "héllo world\n"}
    execs = query(sbx_home, "SELECT payload_json FROM events WHERE type = 'sandbox.exec'")
    assert len(execs) == 3  # each recorded once, whole-output digests and sizes
    assert json.loads(execs[0]["payload_json"])["stdout"]["bytes"] == 13


@pytest.mark.docker
def test_big_exec_output_and_exports_leave_without_growing_the_service(sbx, tmp_path,
                                                                     docker_api):
    """On the real engine and a real `sbx serve`: 32 MiB of output answered in one reply
    keeps 1 MiB of it; a ~100 MB export streams; neither grows the service by more than a
    fraction of its size."""
    made = sbx("api-keys", "create", "--scope", "write", "--owner", "big")
    token = made.out.split()[-1]
    proc, url = start_process(SBX, sbx.env(), cwd=tmp_path)
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=300) as http:
            box = http.post("/v1/sandboxes", json={"profile": "default",
                                                   "labels": dict([RUN_LABEL.split("=")])})
            assert box.status_code == 201, box.text
            ref = box.json()["id"]
            before = _rss(proc.pid)
            reply = http.post(f"/v1/sandboxes/{ref}/exec", json={"argv": [
                "sh", "-c", "head -c 33554432 /dev/zero | tr '\\0' a"]})
            assert reply.status_code == 200, reply.text
            doc = reply.json()
            assert doc["stdout_bytes"] == 32 * MiB and doc["stdout_truncated"] is True
            assert doc["stdout"] == "a" * MiB
            assert _rss(proc.pid) - before < 64 * MiB
            # ~100 MB that does not compress, in the sandbox's filesystem, then exported
            wrote = http.post(f"/v1/sandboxes/{ref}/exec", json={"argv": [
                "sh", "-c", "head -c 104857600 /dev/urandom > /big"]})
            assert wrote.json()["exit_code"] == 0, wrote.text
            ckpt = http.post(f"/v1/sandboxes/{ref}/snapshot", json={})
            assert ckpt.status_code == 201, ckpt.text
            ckpt_id = ckpt.json()["id"]
            before = _rss(proc.pid)
            peak, size = before, 0
            with http.stream("GET", f"/v1/checkpoints/{ckpt_id}/archive") as archive:
                assert archive.status_code == 200
                assert archive.headers["content-type"] == "application/gzip"
                assert archive.headers["content-disposition"] == (
                    f'attachment; filename="{ckpt_id}.tar.gz"')
                length = int(archive.headers["content-length"])
                for piece in archive.iter_bytes(MiB):
                    size += len(piece)
                    peak = max(peak, _rss(proc.pid))
            assert size == length > 100 * MiB
            assert peak - before < 64 * MiB, f"the export grew the service {peak - before}"
    finally:
        stop_process(proc)


def test_a_client_that_sends_its_whole_body_first_still_reads_the_413(live, api, sbx_home):
    """httpx and curl read the answer only once they have sent the body: the service
    half-closes after its early 413 and drops what still comes (lingers), so they get the
    answer, not a reset connection; the library over the service says the same line."""
    box = api.post("/v1/sandboxes", json={"profile": "stubby"}).json()
    big = json.dumps({"argv": ["cat"], "stdin": "x" * (24 * MiB)}).encode()
    for _ in range(2):  # each time on a new connection
        refused = api.post(f"/v1/sandboxes/{box['id']}/exec", content=big,
                           headers={"Content-Type": "application/json"})
        assert refused.status_code == 413, refused.text[:300]
        assert "SBX_SERVE_MAX_INPUT" in refused.json()["error"]["message"]
    import sandboxer

    with sandboxer.Sandboxer(url=live.url, token=live.key("write", owner="writer")) as sbx:
        with pytest.raises(sandboxer.BadInput, match="SBX_SERVE_MAX_INPUT"):
            sbx.get(box["id"]).exec(["cat"], stdin=b"y" * (20 * MiB))
        assert sbx.get(box["id"]).exec(["cat"], stdin=b"fits").stdout == b"fits"


def test_a_command_input_has_its_own_cap_above_the_json_bodys(limited, sbx_home):
    """1 MiB of exec stdin travels as about 1.4 MiB of base64, past the 1 MiB JSON cap: the
    exec route (and a process's stdin) is capped by SBX_SERVE_MAX_INPUT instead; past that
    cap the input is refused (413 naming it) and the command never runs."""
    import hashlib
    import os

    import sandboxer

    service = limited(SBX_SERVE_MAX_INPUT="2MiB")
    data = os.urandom(MiB)
    with sandboxer.Sandboxer(url=service.url, token=service.key("write")) as sbx:
        box = sbx.create("stubby")
        result = box.exec(["cat"], stdin=data)
        assert result.exit_code == 0 and hashlib.sha256(result.stdout).digest() == \
            hashlib.sha256(data).digest()
        execs = query(sbx_home, "SELECT count(*) AS n FROM events WHERE type = 'sandbox.exec'")
        with pytest.raises(sandboxer.BadInput, match="SBX_SERVE_MAX_INPUT"):
            box.exec(["cat"], stdin=os.urandom(2 * MiB))
        assert query(sbx_home, "SELECT count(*) AS n FROM events "
                               "WHERE type = 'sandbox.exec'") == execs  # it never ran
        box.destroy()
