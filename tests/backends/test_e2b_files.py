"""Work inside an E2B sandbox through the real `e2b` SDK, against the local stand-in
(tests/standins/e2b_server.py): exec with env, cwd and stdin (`commands.run(stdin=True)`,
`send_stdin`, `close_stdin`), a timeout that kills every process of the exec and keeps its
output, and files through envd's filesystem service and /files (the SDK's `files`).

The stand-in's commands run on this host, and the paths envd is given are this host's, so a
"sandbox path" here is a folder of the test's tmp folder and what a command leaves is seen
directly. Anything the SDK sends that the stand-in does not know fails the test.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import secrets
import tarfile
import time
from datetime import UTC, datetime, timedelta

import pytest
from standins.e2b_server import E2BStandIn
from support import SourceBroke, alive, breaking, chunks, gather

from sandboxer.adapters.base import (
    LABEL_ID,
    Capability,
    CapabilityNotSupported,
    CreateRequest,
    InvalidRequest,
    NoSuchPath,
)
from sandboxer.adapters.e2b import E2BAdapter

KEY = f"e2b_sbxfiles_{secrets.token_hex(12)}"


@pytest.fixture
def standin():
    server = E2BStandIn({KEY: "team-files"}).start()
    yield server
    server.stop()
    assert server.problems == [], f"the stand-in met what it does not know: {server.problems}"


@pytest.fixture
def e2b_env(standin, monkeypatch, sbx_home):
    """The SDK (here and in the `sbx` this test starts) pointed at the stand-in."""
    for name in list(os.environ):
        if name.startswith("E2B_"):
            monkeypatch.delenv(name)
    for name, value in {"E2B_API_URL": standin.url, "E2B_SANDBOX_URL": standin.url,
                        "E2B_API_KEY": KEY, "E2B_CONNECTION_RETRIES": "0"}.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def box(standin, e2b_env):
    """(adapter, run, ref): one E2BAdapter, a runner on one loop, a running sandbox."""
    loop = asyncio.new_event_loop()
    adapter = E2BAdapter()
    sandbox_id = f"sbx-files-{secrets.token_hex(4)}"
    request = CreateRequest(sandbox_id=sandbox_id, labels={LABEL_ID: sandbox_id},
                            hard_deadline=datetime.now(UTC) + timedelta(hours=1))
    ref = loop.run_until_complete(adapter.create(request)).ref
    yield adapter, loop.run_until_complete, ref
    loop.run_until_complete(adapter.destroy(ref))
    loop.close()


def test_exec_takes_env_cwd_and_stdin(box, tmp_path):
    adapter, run, ref = box
    work = tmp_path / "work"
    work.mkdir()
    result = run(adapter.exec(ref, ["sh", "-c", 'pwd; echo "$GREETING"; cat'],
                              env={"GREETING": "hello there"}, cwd=str(work),
                              stdin=b"from stdin\n"))
    assert (result.exit_code, result.stderr) == (0, b"")
    assert result.stdout == f"{work}\nhello there\nfrom stdin\n".encode()

    data = os.urandom(3 * 1024 * 1024 + 5)  # several send_stdin calls, in order
    result = run(adapter.exec(ref, ["sha256sum"], stdin=chunks(data)))
    assert result.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()

    result = run(adapter.exec(ref, ["cat"], timeout_s=10))  # no stdin: empty, not waited for
    assert (result.exit_code, result.stdout, result.timed_out) == (0, b"", False)
    with pytest.raises(SourceBroke):  # the caller's stdin failing midway: raised, not hidden
        run(adapter.exec(ref, ["cat"], stdin=breaking()))
    result = run(adapter.exec(ref, ["sh", "-c", "exit 3"]))
    assert result.exit_code == 3


def test_a_timeout_kills_every_process_of_the_exec_and_keeps_its_output(box, tmp_path):
    adapter, run, ref = box
    pids = tmp_path / "pids"
    script = (f'echo before; echo err-before >&2; sleep 300 & echo $! >> {pids}; '
              f'setsid sh -c "echo \\$\\$ >> {pids}; exec sleep 300" & '
              f'while [ "$(wc -l < {pids})" -lt 2 ]; do :; done; echo started; sleep 300')
    started = time.monotonic()
    result = run(adapter.exec(ref, ["sh", "-c", script], timeout_s=1.5))
    elapsed = time.monotonic() - started
    assert (result.exit_code, result.timed_out) == (124, True)
    assert result.stdout == b"before\nstarted\n"
    assert result.stderr == b"err-before\nsbx: timed out after 1.5s\n"
    assert elapsed < 1.5 + 0.5, f"returned {elapsed - 1.5:.2f}s after the deadline"
    left = [int(p) for p in pids.read_text().split()]
    deadline = time.monotonic() + 5
    while any(alive(p) for p in left) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(left) == 2 and not [p for p in left if alive(p)]


def test_files_through_envd(box, standin, tmp_path):
    adapter, run, ref = box
    assert adapter.supports(Capability.FILES)
    top = tmp_path / "box"
    run(adapter.make_dir(ref, str(top / "a" / "b")))
    assert (top / "a" / "b").is_dir()
    (top / "a" / "f.txt").write_bytes(b"12345")
    os.chmod(top / "a" / "f.txt", 0o640)
    os.symlink("f.txt", top / "a" / "link")

    listed = run(adapter.list_files(ref, str(top / "a")))
    assert [(f.name, f.type) for f in listed] == [("b", "dir"), ("f.txt", "file"),
                                                  ("link", "symlink")]
    f = listed[1]
    assert (f.path, f.size, f.mode) == (str(top / "a" / "f.txt"), 5, 0o640)
    assert abs(f.mtime.timestamp() - (top / "a" / "f.txt").stat().st_mtime) < 1
    assert listed[2].target == "f.txt"
    assert run(adapter.stat_file(ref, str(top / "a" / "b"))).type == "dir"
    assert run(adapter.stat_file(ref, str(top / "nothing"))) is None

    with pytest.raises(InvalidRequest, match="not empty"):
        run(adapter.remove_file(ref, str(top / "a")))
    assert (top / "a" / "f.txt").exists()
    with pytest.raises(NoSuchPath):
        run(adapter.make_dir(ref, str(top / "no" / "c"), parents=False))
    assert not (top / "no").exists()
    run(adapter.rename_file(ref, str(top / "a" / "f.txt"), str(top / "a" / "b")))
    assert (top / "a" / "b" / "f.txt").read_bytes() == b"12345"
    for call in (lambda: adapter.remove_file(ref, str(top / "gone")),
                 lambda: adapter.rename_file(ref, str(top / "gone"), str(top / "x")),
                 lambda: adapter.list_files(ref, str(top / "gone")),
                 lambda: gather(adapter.get_archive(ref, str(top / "gone")))):
        with pytest.raises(NoSuchPath, match="does not exist"):
            run(call())
    run(adapter.remove_file(ref, str(top / "a"), recursive=True))
    assert not (top / "a").exists()


def test_a_tree_goes_in_through_stdin_and_comes_out_through_downloads(box, standin, tmp_path):
    adapter, run, ref = box
    big = os.urandom(2 * 1024 * 1024 + 3)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in (("proj/a.txt", b"alpha\n"), ("proj/sub/big.bin", big),
                           ("proj/sub/empty", b"")):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o600, 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("proj/link")
        link.type, link.linkname = tarfile.SYMTYPE, "a.txt"
        tar.addfile(link)
    dest = tmp_path / "in"
    run(adapter.put_archive(ref, str(dest), chunks(buffer.getvalue(), 8192)))
    assert (dest / "proj" / "sub" / "big.bin").read_bytes() == big

    back = run(gather(adapter.get_archive(ref, str(dest / "proj"))))
    with tarfile.open(fileobj=io.BytesIO(back)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert sorted(members) == ["proj", "proj/a.txt", "proj/link", "proj/sub",
                                   "proj/sub/big.bin", "proj/sub/empty"]
        assert tar.extractfile("proj/sub/big.bin").read() == big  # bytes, not text
        assert members["proj/link"].linkname == "a.txt"
        assert (members["proj/a.txt"].mode, members["proj/a.txt"].mtime) == \
            (0o600, 1_700_000_000)
    one = run(gather(adapter.get_archive(ref, str(dest / "proj" / "a.txt"))))
    with tarfile.open(fileobj=io.BytesIO(one)) as tar:
        assert [m.name for m in tar.getmembers()] == ["a.txt"]
        assert tar.extractfile("a.txt").read() == b"alpha\n"


def test_run_as_another_user_is_refused_naming_the_backend(box, standin, tmp_path):
    adapter, run, ref = box
    before = len(standin.started_pids)
    with pytest.raises(CapabilityNotSupported, match="the e2b backend"):
        run(adapter.exec(ref, ["touch", str(tmp_path / "ran")], user="root"))
    assert not (tmp_path / "ran").exists() and len(standin.started_pids) == before


def test_what_e2b_cannot_do_is_refused_through_the_cli_naming_it(sbx, standin, e2b_env,
                                                                  tmp_path):
    """Through `sbx`: `-u` and `--detach` exit 4 naming the backend, and nothing runs; files
    work (`sbx cp` in, `sbx files cat` out, `sbx files ls`)."""
    made = sbx("create", "--profile", "e2b", "--json")
    assert made.code == 0, made.err
    box_id = made.json()["id"]
    before = len(standin.started_pids)
    for args in (("-u", "nobody"), ("--detach",)):
        refused = sbx("exec", *args, box_id, "--", "touch", str(tmp_path / "ran"))
        assert refused.code == 4, refused.err
        assert "e2b backend" in refused.err and len(refused.err.strip().splitlines()) == 1
    assert not (tmp_path / "ran").exists() and len(standin.started_pids) == before

    (tmp_path / "note.txt").write_text("through the cli\n")
    put = sbx("cp", str(tmp_path / "note.txt"), f"{box_id}:{tmp_path / 'box' / 'note.txt'}")
    assert put.code == 0, put.err
    shown = sbx("files", "cat", box_id, str(tmp_path / "box" / "note.txt"))
    assert (shown.code, shown.out) == (0, "through the cli\n"), shown.err
    listed = sbx("files", "ls", box_id, str(tmp_path / "box"))
    assert listed.code == 0 and "note.txt" in listed.out, listed.err
    assert sbx("destroy", box_id, "--yes").code == 0
