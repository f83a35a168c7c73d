"""Work inside a Modal sandbox through the real `modal` SDK, against the local stand-in
(tests/standins/modal_server.py): exec with env, a working folder (`workdir=`) and stdin
(the process's stdin: write, drain, write_eof), a timeout that kills every process of the
exec and keeps its output, and files as tar through exec (the base's defaults).

The stand-in's commands run on this host, so a "sandbox path" here is a folder of the test's
tmp folder, and what a command leaves is seen directly. Every RPC the stand-in does not
implement fails the test.
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
from standins.modal_server import ModalStandin
from support import (
    SourceBroke,
    alive,
    breaking,
    chunks,
    gather,
    modal_sdk_env,
    write_profile,
)

from sandboxer.adapters.base import (
    LABEL_ID,
    Capability,
    CapabilityNotSupported,
    CreateRequest,
    NoSuchPath,
)
from sandboxer.adapters.modal import ModalAdapter

TOKEN_ID = f"ak-sbxfiles{secrets.token_hex(6)}"
TOKEN_SECRET = f"as-sbxfiles{secrets.token_hex(12)}"


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> ModalStandin:
    server = ModalStandin(tmp_path_factory.mktemp("modal-standin"), TOKEN_ID, TOKEN_SECRET)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def modal_env(standin, monkeypatch, tmp_path):
    """The SDK (here and in the `sbx` this test starts) pointed at the stand-in."""
    modal_sdk_env(monkeypatch, standin.url, TOKEN_ID, TOKEN_SECRET, tmp_path / "modal.toml")


@pytest.fixture
def box(standin, modal_env):
    """(run, ref): a coroutine runner holding one ModalAdapter, and a running sandbox."""
    seen = len(standin.unimplemented)
    loop = asyncio.new_event_loop()  # one loop for the adapter's client, as in one sbx run
    adapter = ModalAdapter()
    sandbox_id = f"sbx-files-{secrets.token_hex(4)}"
    request = CreateRequest(sandbox_id=sandbox_id, image=standin.add_image(),
                            hard_deadline=datetime.now(UTC) + timedelta(hours=1),
                            labels={LABEL_ID: sandbox_id})
    ref = loop.run_until_complete(adapter.create(request)).ref
    yield adapter, loop.run_until_complete, ref
    loop.run_until_complete(adapter.destroy(ref))
    loop.run_until_complete(adapter.close())
    loop.close()
    assert standin.unimplemented[seen:] == [], "the SDK called RPCs the stand-in lacks"


def test_exec_takes_env_workdir_and_stdin(box, tmp_path):
    adapter, run, ref = box
    work = tmp_path / "work"
    work.mkdir()
    result = run(adapter.exec(ref, ["sh", "-c", 'pwd; echo "$GREETING"; cat'],
                              env={"GREETING": "hello there"}, cwd=str(work),
                              stdin=b"from stdin\n"))
    assert (result.exit_code, result.stderr) == (0, b"")
    assert result.stdout == f"{work}\nhello there\nfrom stdin\n".encode()

    data = os.urandom(5 * 1024 * 1024 + 7)  # more than one drain's worth, streamed in
    result = run(adapter.exec(ref, ["sha256sum"], stdin=chunks(data)))
    assert result.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()

    result = run(adapter.exec(ref, ["cat"], timeout_s=10))  # no stdin: empty, not waited for
    assert (result.exit_code, result.stdout, result.timed_out) == (0, b"", False)
    with pytest.raises(SourceBroke):  # the caller's stdin failing midway: raised, not hidden
        run(adapter.exec(ref, ["cat"], stdin=breaking()))


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


def test_a_tree_goes_in_comes_back_and_is_listed(box, tmp_path):
    adapter, run, ref = box
    assert adapter.supports(Capability.FILES)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in (("proj/a.txt", b"alpha\n"), ("proj/sub/b.bin", os.urandom(300_000))):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o640, 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    dest = tmp_path / "in" / "box"
    run(adapter.put_archive(ref, str(dest), chunks(buffer.getvalue(), 4096)))
    assert (dest / "proj" / "a.txt").read_bytes() == b"alpha\n"

    back = run(gather(adapter.get_archive(ref, str(dest / "proj"))))
    with tarfile.open(fileobj=io.BytesIO(back)) as tar:
        assert sorted(m.name for m in tar.getmembers() if m.isfile()) == \
            ["proj/a.txt", "proj/sub/b.bin"]
        assert tar.extractfile("proj/sub/b.bin").read() == \
            (dest / "proj" / "sub" / "b.bin").read_bytes()

    listed = run(adapter.list_files(ref, str(dest / "proj")))
    assert [(f.name, f.type) for f in listed] == [("a.txt", "file"), ("sub", "dir")]
    assert (listed[0].size, listed[0].mode, listed[0].mtime.timestamp()) == \
        (6, 0o640, 1_700_000_000)
    run(adapter.make_dir(ref, str(dest / "made" / "deep")))
    run(adapter.rename_file(ref, str(dest / "proj" / "a.txt"), str(dest / "made")))
    assert (dest / "made" / "a.txt").read_bytes() == b"alpha\n"
    run(adapter.remove_file(ref, str(dest / "proj"), recursive=True))
    assert not (dest / "proj").exists()
    assert run(adapter.stat_file(ref, str(dest / "proj"))) is None
    with pytest.raises(NoSuchPath):
        run(gather(adapter.get_archive(ref, str(dest / "proj"))))


def test_run_as_another_user_is_refused_naming_the_backend(box, tmp_path):
    adapter, run, ref = box
    with pytest.raises(CapabilityNotSupported, match="the modal backend"):
        run(adapter.exec(ref, ["touch", str(tmp_path / "ran")], user="root"))
    assert not (tmp_path / "ran").exists()


def test_what_modal_cannot_do_is_refused_through_the_cli_naming_it(sbx, standin, modal_env,
                                                                    tmp_path):
    """Through `sbx`: `-u` and `--detach` exit 4 naming the backend, and nothing runs; files
    work (`sbx cp` in and `sbx files cat` out)."""
    profile = write_profile(tmp_path, "mdl", f"extends: modal\nimage: {standin.add_image()}\n")
    made = sbx("create", "--profile-file", str(profile), "--json")
    assert made.code == 0, made.err
    box_id = made.json()["id"]
    before = standin.running_processes(), len(standin.methods())
    for args in (("-u", "nobody"), ("--detach",)):
        refused = sbx("exec", *args, box_id, "--", "touch", str(tmp_path / "ran"))
        assert refused.code == 4, refused.err
        assert "modal backend" in refused.err and len(refused.err.strip().splitlines()) == 1
    assert not (tmp_path / "ran").exists()
    assert "TaskExecStart" not in standin.methods()[before[1]:]

    (tmp_path / "note.txt").write_text("through the cli\n")
    put = sbx("cp", str(tmp_path / "note.txt"), f"{box_id}:{tmp_path / 'box'}")
    assert put.code == 0, put.err
    shown = sbx("files", "cat", box_id, str(tmp_path / "box"))
    assert (shown.code, shown.out) == (0, "through the cli\n"), shown.err
    assert sbx("destroy", box_id, "--yes").code == 0
