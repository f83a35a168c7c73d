"""Files over the service (docs/service.md, "Files"): a file's bytes and a tree's tar stream
go in and out as request and response bodies, list/stat/remove/mkdir/rename; the errors are
the service's one body; a streamed body is capped as an upload, a JSON one as a body. Real
uvicorn on 127.0.0.1 over the stub's in-memory filesystem; the engine's case and the memory
of a 256 MiB round trip through a real `sbx serve` are marked docker."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx
import pytest
from support import RUN_LABEL, SBX, query, table_rows

from sandboxer_tui.service.schemas import FileInfo, FileTransfer
from tests.service.conftest import Api
from tests.service.live import LiveService, start_process, stop_process
from tests.service.test_service import everything

MiB = 1024 * 1024


def made(api: Api, profile: str) -> str:
    answer = api.post("/v1/sandboxes", json={"profile": profile,
                                             "labels": dict([RUN_LABEL.split("=")])})
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def file_events(home: Path, sandbox_id: str | None = None) -> list[dict]:
    return [json.loads(e["payload_json"]) | {"actor": e["actor"]}
            for e in query(home, "SELECT * FROM events WHERE type = 'sandbox.file' "
                                 "ORDER BY id")
            if sandbox_id in (None, e["sandbox_id"])]


def tar_of(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def members_of(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def error_of(answer: httpx.Response, status: int, kind: str) -> str:
    assert answer.status_code == status, answer.text
    body = answer.json()["error"]
    assert body["kind"] == kind and "\n" not in body["message"], body
    return body["message"]


def test_a_file_goes_in_and_comes_back_and_the_chain_records_it_without_its_bytes(
        api, live, sbx_home, stub_named):
    ref = made(api, stub_named)
    data = os.urandom(3 * MiB + 17)  # not UTF-8, larger than the JSON body limit (1 MiB)

    def pieces():
        for at in range(0, len(data), 100_000):
            yield data[at:at + 100_000]

    wrote = api.put(f"/v1/sandboxes/{ref}/files", params={"path": "/work/blob.bin",
                                                          "mode": "0640"}, content=pieces())
    assert wrote.status_code == 200, wrote.text
    digest = hashlib.sha256(data).hexdigest()
    assert {k: wrote.json()[k] for k in ("path", "bytes", "sha256")} == {
        "path": "/work/blob.bin", "bytes": len(data), "sha256": digest}
    with api.stream("GET", f"/v1/sandboxes/{ref}/files",
                    params={"path": "/work/blob.bin"}) as read:
        assert read.status_code == 200
        assert read.headers["content-type"] == "application/octet-stream"
        assert read.read() == data
    stat = api.get(f"/v1/sandboxes/{ref}/files/stat", params={"path": "/work/blob.bin"})
    assert stat.status_code == 200, stat.text
    assert set(stat.json()) == set(FileInfo.model_fields)  # as the document says
    assert set(wrote.json()) == set(FileTransfer.model_fields)
    assert {k: stat.json()[k] for k in ("path", "name", "type", "size", "mode")} == {
        "path": "/work/blob.bin", "name": "blob.bin", "type": "file", "size": len(data),
        "mode": 0o640}
    listed = api.get(f"/v1/sandboxes/{ref}/files/list", params={"path": "/work"})
    assert [f["name"] for f in listed.json()] == ["blob.bin"]

    events = file_events(sbx_home, ref)
    written = [e for e in events if e["op"] == "write"]
    assert written and written[0]["sha256"] == digest and written[0]["bytes"] == len(data)
    assert written[0]["direction"] == "in" and written[0]["actor"] == "writer"
    stored = json.dumps(table_rows(sbx_home, "events"))
    assert data[:64].hex() not in stored and len(stored) < 64 * 1024  # no bytes kept


def test_a_tree_goes_in_as_tar_and_comes_back_as_tar(api, live, stub_named):
    ref = made(api, stub_named)
    tree = {"proj/main.py": b"print('hi')\n", "proj/lib/util.py": b"X = 1\n"}
    put = api.put(f"/v1/sandboxes/{ref}/files/tree", params={"path": "/src"},
                  content=tar_of(tree), headers={"Content-Type": "application/x-tar"})
    assert put.status_code == 200, put.text
    assert put.json()["path"] == "/src" and put.json()["entries"] >= 2
    got = api.get(f"/v1/sandboxes/{ref}/files/tree", params={"path": "/src/proj"})
    assert got.status_code == 200, got.text
    assert got.headers["content-type"] == "application/x-tar"
    assert members_of(got.content) == {"proj/main.py": b"print('hi')\n",
                                       "proj/lib/util.py": b"X = 1\n"}

    assert api.post(f"/v1/sandboxes/{ref}/files/mkdir",
                    json={"path": "/src/out/deep", "parents": True}).status_code == 204
    assert api.post(f"/v1/sandboxes/{ref}/files/rename",
                    json={"src": "/src/proj/main.py", "dst": "/src/out/main.py"}
                    ).status_code == 204
    names = {f["path"] for f in api.get(f"/v1/sandboxes/{ref}/files/list",
                                        params={"path": "/src", "depth": 3}).json()}
    assert {"/src/out/main.py", "/src/out/deep", "/src/proj/lib/util.py"} <= names
    assert "/src/proj/main.py" not in names
    assert api.delete(f"/v1/sandboxes/{ref}/files",
                      params={"path": "/src/proj", "recursive": "true"}).status_code == 204
    error_of(api.get(f"/v1/sandboxes/{ref}/files/stat", params={"path": "/src/proj"}),
             404, "not_found")


def test_bad_file_requests_are_one_line_errors_and_change_nothing(api, live, sbx_home,
                                                                 stub_named):
    ref = made(api, stub_named)
    assert api.put(f"/v1/sandboxes/{ref}/files", params={"path": "/keep"},
                   content=b"kept").status_code == 200
    files = f"/v1/sandboxes/{ref}/files"

    def refused(answer: httpx.Response, status: int, kind: str) -> None:
        message = error_of(answer, status, kind)
        assert "Traceback" not in message and str(sbx_home) not in message, message

    # refused before the sandbox is asked: nothing at all changes, not even an activity mark
    before = everything(sbx_home)
    for answer, status in (
            (api.put(files, params={"path": "relative/x"}, content=b"x"), 400),
            (api.put(files, params={"path": "/x", "mode": "rw-"}, content=b"x"), 400),
            (api.put(files, params={"path": "/x", "mode": "99999"}, content=b"x"), 400),
            (api.put(files, content=b"x"), 422),  # no path
            (api.post(f"{files}/mkdir", json={"path": "/d", "extra": 1}), 422),
            (api.get(f"{files}/list", params={"path": "/", "depth": 0}), 422),
            (api.post(f"/v1/sandboxes/{ref}/exec", json={"argv": ["cat"], "stdin": "%%%"}),
             400)):
        refused(answer, status, "bad_input")
    assert everything(sbx_home) == before

    # what the sandbox does not have, or a body that is not a tar: no event, nothing made
    for answer, status, kind in (
            (api.get(files, params={"path": "/missing"}), 404, "not_found"),
            (api.get(f"{files}/tree", params={"path": "/missing"}), 404, "not_found"),
            (api.get(f"{files}/stat", params={"path": "/missing"}), 404, "not_found"),
            (api.get(f"{files}/list", params={"path": "/missing"}), 404, "not_found"),
            (api.delete(files, params={"path": "/missing"}), 404, "not_found"),
            (api.post(f"{files}/rename", json={"src": "/missing", "dst": "/y"}), 404,
             "not_found"),
            (api.put(f"{files}/tree", params={"path": "/t"}, content=b"not a tar" * 100),
             400, "bad_input")):
        refused(answer, status, kind)
    assert len(file_events(sbx_home, ref)) == 1  # the write of /keep
    names = {f["name"] for f in api.get(f"{files}/list", params={"path": "/"}).json()}
    assert "y" not in names and "t" not in names and "x" not in names
    assert api.get(files, params={"path": "/keep"}).content == b"kept"


def test_a_read_key_may_not_touch_files_or_drive_processes(live, stub_named, sbx_home):
    writer = Api(live.url, live.key("write", owner="team"))
    reader = Api(live.url, live.key("read", owner="team"))
    ref = made(writer, stub_named)
    before = everything(sbx_home)
    for method, path, params in (("PUT", "files", {"path": "/x"}),
                                 ("GET", "files", {"path": "/tmp"}),
                                 ("GET", "files/list", {"path": "/tmp"}),
                                 ("GET", "files/tree", {"path": "/tmp"})):
        answer = reader.request(method, f"/v1/sandboxes/{ref}/{path}", params=params,
                                content=b"x" if method == "PUT" else None)
        error_of(answer, 403, "forbidden")
    # processes: a read key lists and reads them, but starts, signals or follows none
    for method, path, params in (("POST", "processes", None),
                                 ("POST", "processes/1/signal", None),
                                 ("GET", "processes/1/output", {"follow": "true"})):
        answer = reader.request(method, f"/v1/sandboxes/{ref}/{path}", params=params,
                                json={"argv": ["true"]} if path == "processes" else
                                {"signal": 9} if method == "POST" else None)
        error_of(answer, 403, "forbidden")
    assert everything(sbx_home) == before


def test_an_early_answer_reaches_a_client_still_sending_a_large_body(live, stub_named):
    """httpx (like curl) sends its whole body before it reads the answer: an error given
    before the body was read (a bad path, a read key, no such sandbox) is still what the
    client gets, not a connection closed under it, and the connection stays usable."""
    writer = Api(live.url, live.key("write", owner="team"))
    reader = Api(live.url, live.key("read", owner="team"))
    ref = made(writer, stub_named)
    big = b"z" * (32 * MiB)
    files = f"/v1/sandboxes/{ref}/files"
    error_of(writer.put(files, params={"path": "relative"}, content=big), 400, "bad_input")
    error_of(writer.put(f"{files}/tree", params={"path": "relative"}, content=big), 400,
             "bad_input")
    error_of(reader.put(files, params={"path": "/x"}, content=big), 403, "forbidden")
    error_of(writer.put("/v1/sandboxes/sbx-nothere/files", params={"path": "/x"},
                        content=big), 404, "not_found")
    assert writer.put(files, params={"path": "/x"}, content=b"after").status_code == 200


def test_a_client_gone_mid_upload_leaves_no_file_and_no_event(live, stub_named, sbx_home):
    import socket
    from urllib.parse import urlsplit

    token = live.key("write", owner="team")
    api = Api(live.url, token)
    ref = made(api, stub_named)
    where = urlsplit(live.url)
    with socket.create_connection((where.hostname, where.port), timeout=30) as sock:
        sock.sendall((f"PUT /v1/sandboxes/{ref}/files?path=/half HTTP/1.1\r\n"
                      f"Host: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
                      f"Content-Length: {10 * MiB}\r\n\r\n").encode() + b"h" * MiB)
    admin = Api(live.url, live.key("admin", owner="ops"))
    given_up = 'sbx_operation_duration_seconds_count{backend="stub",kind="file_write",' \
               'result="bad_input"} 1.0'
    deadline = time.monotonic() + 30
    while given_up not in admin.get("/metrics").text:  # the service saw the close
        assert time.monotonic() < deadline, "the service never gave up on the upload"
        time.sleep(0.1)
    error_of(api.get(f"/v1/sandboxes/{ref}/files/stat", params={"path": "/half"}), 404,
             "not_found")
    assert [e for e in file_events(sbx_home, ref) if e["op"] == "write"] == []
    assert api.put(f"/v1/sandboxes/{ref}/files", params={"path": "/whole"},
                   content=b"w").status_code == 200


def test_a_streamed_body_is_capped_as_an_upload_and_a_json_one_as_a_body(
        sbx_home, stub_named, monkeypatch):
    monkeypatch.setenv("SBX_SERVE_MAX_BODY", "64KiB")
    monkeypatch.setenv("SBX_SERVE_MAX_UPLOAD", "1MiB")
    live = LiveService(sbx_home).start()
    try:
        api = Api(live.url, live.key("write", owner="capped"))
        ref = made(api, stub_named)
        files = f"/v1/sandboxes/{ref}/files"
        ok = api.put(files, params={"path": "/half"}, content=b"a" * (512 * 1024))
        assert ok.status_code == 200, ok.text  # past the body limit: a file is an upload
        message = error_of(api.put(files, params={"path": "/big"}, content=b"a" * (2 * MiB)),
                           413, "bad_input")
        assert "SBX_SERVE_MAX_UPLOAD" in message

        def chunked():  # no Content-Length: the cap holds while the body is read
            for _ in range(32):
                yield b"b" * (64 * 1024)

        message = error_of(api.put(files, params={"path": "/big"}, content=chunked()),
                           413, "bad_input")
        assert "SBX_SERVE_MAX_UPLOAD" in message
        message = error_of(api.post(f"{files}/mkdir", json={"path": "/" + "d" * 70000}),
                           413, "bad_input")
        assert "SBX_SERVE_MAX_BODY" in message
        error_of(api.get(f"{files}/stat", params={"path": "/big"}), 404, "not_found")
        assert len(file_events(sbx_home)) == 1  # the one written above
    finally:
        live.stop()


CLIENT = """
import asyncio, hashlib, json, sys
import sandboxer

url, token, local, ref = sys.argv[1:5]


def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024


async def main():
    async with sandboxer.AsyncSandboxer(url=url, token=token) as sbx:
        box = await sbx.get(ref)
        sent = await box.files.write("/client.bin", open(local, "rb"))
        digest, got = hashlib.sha256(), 0
        async for chunk in box.files.stream("/client.bin"):
            digest.update(chunk)
            got += len(chunk)
        print(json.dumps({"sent": sent.bytes, "sent_sha256": sent.sha256, "got": got,
                          "got_sha256": digest.hexdigest(), "peak": peak()}))

asyncio.run(main())
"""


@pytest.mark.docker
@pytest.mark.slow
def test_256_mib_in_and_out_through_a_real_service_keeps_its_peak_under_150_mb(
        sbx, tmp_path, docker_api):
    """On the real engine and a real `sbx serve`: 256 MiB written as a file and read back
    (and as a tree), by a raw HTTP client and then by the library's remote client in a
    process of its own, stream through; the service's and that client's peak resident
    memory (VmHWM) each stay under 150 MB."""
    made_key = sbx("api-keys", "create", "--scope", "write", "--owner", "big")
    token = made_key.out.split()[-1]
    proc, url = start_process(SBX, sbx.env(), cwd=tmp_path)
    size, piece = 256 * MiB, os.urandom(MiB)
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                          timeout=600) as http:
            ref = made(_wrap(http), "default")
            idle = _peak(proc.pid)
            digest = hashlib.sha256()

            def body():
                for _ in range(size // MiB):
                    digest.update(piece)
                    yield piece

            wrote = http.put(f"/v1/sandboxes/{ref}/files", params={"path": "/big.bin"},
                             content=body())
            assert wrote.status_code == 200, wrote.text
            assert wrote.json()["bytes"] == size
            assert wrote.json()["sha256"] == digest.hexdigest()
            back, got = hashlib.sha256(), 0
            with http.stream("GET", f"/v1/sandboxes/{ref}/files",
                             params={"path": "/big.bin"}) as read:
                assert read.status_code == 200
                for chunk in read.iter_bytes(MiB):
                    back.update(chunk)
                    got += len(chunk)
            assert got == size and back.hexdigest() == digest.hexdigest()
            tar_size = 0
            with http.stream("GET", f"/v1/sandboxes/{ref}/files/tree",
                             params={"path": "/big.bin"}) as tree:
                assert tree.status_code == 200
                for chunk in tree.iter_bytes(MiB):
                    tar_size += len(chunk)
            assert tar_size > size
            http.delete(f"/v1/sandboxes/{ref}/files", params={"path": "/big.bin"})

            local = tmp_path / "client.bin"
            with local.open("wb") as out:
                for _ in range(size // MiB):
                    out.write(piece)
            script = tmp_path / "client.py"
            script.write_text(CLIENT)
            done = subprocess.run([sys.executable, str(script), url, token, str(local), ref],
                                  capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stderr
            report = json.loads(done.stdout.strip().splitlines()[-1])
            assert report["sent"] == report["got"] == size
            assert report["sent_sha256"] == report["got_sha256"] == digest.hexdigest()
            peak = _peak(proc.pid)
            print(f"sbx serve: peak RSS {peak / MiB:.1f} MiB ({idle / MiB:.1f} MiB before); "
                  f"library client over HTTP: peak RSS {report['peak'] / MiB:.1f} MiB")
            assert peak < 150 * 1000 * 1000, f"the service's peak was {peak / MiB:.0f} MiB"
            assert report["peak"] < 150 * 1000 * 1000, report
    finally:
        stop_process(proc)


def _wrap(http: httpx.Client) -> Api:
    api = Api.__new__(Api)
    api.http = http
    return api


def _peak(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")
