"""Work inside an ssh sandbox (a leased host): exec with env, a working folder and stdin, a
timeout that ends everything the command started and keeps its output, and files in and out
as tar over the session. Against a real OpenSSH server on 127.0.0.1 (tests/sshd.py), through
the adapter itself: "the host" is this machine, so what a command leaves is seen directly.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import os
import tarfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from sshd import sshd_server  # noqa: F401 (a fixture)
from support import SourceBroke, alive, breaking, chunks, gather, terminal_until, wait_ended

from sandboxer.adapters.base import (
    AdapterError,
    CapabilityNotSupported,
    CreateRequest,
    InvalidRequest,
    NoSuchPath,
)

pytestmark = pytest.mark.sshd


@pytest.fixture
def leased(sshd_server, sbx_home, tmp_path):  # noqa: F811
    """An SSHAdapter and the ref of one lease on the test's sshd, released afterwards."""
    from sandboxer.adapters.ssh import SSHAdapter

    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": [
        sshd_server.inventory_entry("files-host", sshd_server.ports[0], {"pool": "files"})]}))
    adapter = SSHAdapter()
    request = CreateRequest(sandbox_id="sbx-files", labels={"sbx.id": "sbx-files"},
                            network="full", options={"inventory": str(inventory),
                                                     "connect_timeout": 5})
    adapter.validate(request)
    ref = asyncio.run(adapter.create(request)).ref
    yield adapter, ref
    asyncio.run(adapter.destroy(ref))


def test_exec_takes_env_cwd_and_stdin(leased, tmp_path):
    adapter, ref = leased
    work = tmp_path / "work dir"  # a space: the folder is quoted on the remote command line
    work.mkdir()
    script = 'pwd; printf "%s|" "$GREETING"; echo; cat'
    result = asyncio.run(adapter.exec(ref, ["sh", "-c", script], env={"GREETING": "a b'c"},
                                      cwd=str(work), stdin=b"from stdin\n"))
    assert (result.exit_code, result.stderr) == (0, b"")
    assert result.stdout == f"{work}\na b'c|\nfrom stdin\n".encode()

    # stdin as chunks, streamed: 8 MiB arrive whole and in order
    data = os.urandom(8 * 1024 * 1024)
    result = asyncio.run(adapter.exec(ref, ["sha256sum"], stdin=chunks(data)))
    assert result.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()

    # no stdin: the command's input is empty, it does not wait for one
    result = asyncio.run(adapter.exec(ref, ["cat"], timeout_s=10))
    assert (result.exit_code, result.stdout, result.timed_out) == (0, b"", False)

    # the caller's stdin failing midway: exec raises that, not a success on half the input
    with pytest.raises(SourceBroke):
        asyncio.run(adapter.exec(ref, ["cat"], stdin=breaking()))

    # a folder that does not exist: the command does not run, the shell says why
    missing = tmp_path / "missing"
    result = asyncio.run(adapter.exec(ref, ["touch", "ran"], cwd=str(missing)))
    assert result.exit_code != 0 and str(missing).encode() in result.stderr
    assert not (tmp_path / "ran").exists() and not missing.exists()


def test_env_values_are_on_no_command_line_of_the_host(leased):
    """The values reach the command through its stdin, not the remote command line, which
    the host's process list (and sshd's log) would show to others."""
    adapter, ref = leased
    secret = "s3cr3t-" + os.urandom(8).hex() + " with\nnewline "

    async def main() -> tuple[list[int], bytes]:
        release = asyncio.Event()

        async def stdin() -> AsyncIterator[bytes]:
            yield b"input\n"
            await release.wait()

        seen, out = [], b""
        script = 'echo ready; cat; printf "%s" "$SECRET"'
        async for item in adapter.exec_stream(ref, ["sh", "-c", script], timeout_s=30,
                                              env={"SECRET": secret}, stdin=stdin()):
            if isinstance(item, tuple) and item[0] == "stdout":
                out += item[1]
                if b"ready" in out and not release.is_set():
                    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                        try:
                            if secret.encode()[:20] in cmdline.read_bytes():
                                seen.append(int(cmdline.parent.name))
                        except OSError:
                            pass
                    release.set()
        return seen, out

    seen, out = asyncio.run(main())
    assert seen == [], "an env value was on a command line of the host"
    assert out == b"ready\ninput\n" + secret.encode()  # exact, trailing newline kept


def test_a_timeout_ends_the_whole_tree_in_time_and_keeps_the_output(leased, tmp_path):
    adapter, ref = leased
    pids = tmp_path / "pids"
    # a child in the command's process group, and one that left it (setsid: its own
    # session), both sleeping long after the deadline
    script = (f'echo before; echo err-before >&2; sleep 300 & echo $! >> {pids}; '
              f'setsid sh -c "echo \\$\\$ >> {pids}; exec sleep 300" & '
              f'while [ "$(wc -l < {pids})" -lt 2 ]; do :; done; echo started; sleep 300')
    started = time.monotonic()
    result = asyncio.run(adapter.exec(ref, ["sh", "-c", script], timeout_s=2))
    elapsed = time.monotonic() - started
    assert result.timed_out and result.exit_code == 124
    assert result.stdout == b"before\nstarted\n"
    assert result.stderr.startswith(b"err-before\n")
    assert result.stderr.endswith(b"sbx: timed out after 2s\n")
    assert elapsed < 2 + 0.5, f"returned {elapsed - 2:.2f}s after the deadline"
    left = [int(p) for p in pids.read_text().split()]
    assert len(left) == 2
    deadline = time.monotonic() + 5
    while any(alive(p) for p in left) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in left if alive(p)], "a process of the timed-out exec still runs"


def tree_tar() -> bytes:
    """A tar of `proj/` with a file, a nested folder, an empty file and a symlink."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        def add(name: str, data: bytes | None = None, *, mode: int = 0o644,
                link: str | None = None) -> None:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
            elif data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            else:
                info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data) if data else None)
        add("proj")
        add("proj/main.py", b"print('hi')\n", mode=0o755)
        add("proj/pkg")
        add("proj/pkg/data.bin", bytes(range(256)) * 40)
        add("proj/pkg/empty", b"")
        add("proj/link", link="main.py")
    return buffer.getvalue()


def test_a_tree_goes_in_and_comes_back_and_is_listed(leased, tmp_path):
    adapter, ref = leased
    dest = tmp_path / "in the box" / "deep"  # made with its parents
    asyncio.run(adapter.put_archive(ref, str(dest), chunks(tree_tar(), 1000)))
    assert (dest / "proj" / "main.py").read_bytes() == b"print('hi')\n"
    assert (dest / "proj" / "pkg" / "data.bin").read_bytes() == bytes(range(256)) * 40
    assert os.readlink(dest / "proj" / "link") == "main.py"

    back = asyncio.run(gather(adapter.get_archive(ref, str(dest / "proj"))))
    with tarfile.open(fileobj=io.BytesIO(back)) as tar:
        names = sorted(m.name for m in tar.getmembers())
        assert names == ["proj", "proj/link", "proj/main.py", "proj/pkg", "proj/pkg/data.bin",
                         "proj/pkg/empty"]
        assert tar.extractfile("proj/pkg/data.bin").read() == bytes(range(256)) * 40
    one = asyncio.run(gather(adapter.get_archive(ref, str(dest / "proj" / "main.py"))))
    with tarfile.open(fileobj=io.BytesIO(one)) as tar:
        assert [m.name for m in tar.getmembers()] == ["main.py"]

    listed = asyncio.run(adapter.list_files(ref, str(dest / "proj")))
    assert [(f.name, f.type) for f in listed] == [("link", "symlink"), ("main.py", "file"),
                                                  ("pkg", "dir")]
    main = next(f for f in listed if f.name == "main.py")
    assert (main.path, main.size, main.mode) == (str(dest / "proj" / "main.py"), 12, 0o755)
    assert main.mtime.timestamp() == 1_700_000_000
    assert next(f for f in listed if f.name == "link").target == "main.py"
    deep = asyncio.run(adapter.list_files(ref, str(dest / "proj"), depth=2))
    assert {f.name for f in deep} == {"link", "main.py", "pkg", "data.bin", "empty"}
    assert asyncio.run(adapter.stat_file(ref, str(dest / "proj" / "pkg"))).type == "dir"
    assert asyncio.run(adapter.stat_file(ref, str(dest / "nothing"))) is None


def test_remove_mkdir_rename_and_missing_paths(leased, tmp_path):
    adapter, ref = leased
    box = tmp_path / "box"
    asyncio.run(adapter.make_dir(ref, str(box / "a" / "b")))
    assert (box / "a" / "b").is_dir()
    (box / "a" / "b" / "f.txt").write_text("x")
    with pytest.raises(NoSuchPath):
        asyncio.run(adapter.make_dir(ref, str(box / "no" / "c"), parents=False))
    assert not (box / "no").exists()

    with pytest.raises(InvalidRequest, match="not empty"):  # refused: nothing removed
        asyncio.run(adapter.remove_file(ref, str(box / "a")))
    assert (box / "a" / "b" / "f.txt").read_text() == "x"
    asyncio.run(adapter.rename_file(ref, str(box / "a" / "b" / "f.txt"), str(box / "g.txt")))
    assert (box / "g.txt").read_text() == "x" and not (box / "a" / "b" / "f.txt").exists()
    asyncio.run(adapter.remove_file(ref, str(box / "a"), recursive=True))
    assert not (box / "a").exists()

    for call in (lambda: adapter.remove_file(ref, str(box / "gone")),
                 lambda: adapter.rename_file(ref, str(box / "gone"), str(box / "h")),
                 lambda: adapter.list_files(ref, str(box / "gone")),
                 lambda: gather(adapter.get_archive(ref, str(box / "gone")))):
        with pytest.raises(NoSuchPath, match="does not exist"):
            asyncio.run(call())
    assert sorted(p.name for p in box.iterdir()) == ["g.txt"]


def test_a_large_tree_streams_both_ways(leased, tmp_path):
    """64 MiB in and out in chunks: neither way is gathered whole on this side."""
    adapter, ref = leased
    size = 64 * 1024 * 1024
    block = os.urandom(1024 * 1024)

    async def upload() -> AsyncIterator[bytes]:
        info = tarfile.TarInfo("big.bin")
        info.size = size
        yield info.tobuf(format=tarfile.PAX_FORMAT)
        for _ in range(size // len(block)):
            yield block
        yield b"\0" * (2 * tarfile.BLOCKSIZE)  # size is a multiple of 512: no padding

    asyncio.run(adapter.put_archive(ref, str(tmp_path / "big"), upload()))
    assert (tmp_path / "big" / "big.bin").stat().st_size == size

    async def download() -> tuple[int, int]:
        total, biggest = 0, 0
        async for chunk in adapter.get_archive(ref, str(tmp_path / "big" / "big.bin")):
            total += len(chunk)
            biggest = max(biggest, len(chunk))
        return total, biggest

    total, biggest = asyncio.run(download())
    assert total > size and biggest <= 1024 * 1024


def test_run_as_another_user_is_refused_naming_the_backend(leased, tmp_path):
    adapter, ref = leased
    with pytest.raises(CapabilityNotSupported, match="the ssh backend"):
        asyncio.run(adapter.exec(ref, ["touch", str(tmp_path / "ran")], user="nobody"))
    assert not (tmp_path / "ran").exists()


def test_the_cli_round_trip_on_an_ssh_host_and_a_refusal(sbx, sshd_server, tmp_path):  # noqa: F811
    """An agent's round trip through `sbx` on a leased host: code in (`sbx cp`), run with env,
    a working folder and stdin, the artefact back out; `-u` is refused (exit 4) naming the
    backend, and nothing runs."""
    from test_ssh import inventory, ssh_profile

    hosts = inventory(tmp_path, [sshd_server.inventory_entry("cli-host", sshd_server.ports[0],
                                                             {"pool": "cli"})], "cli.yaml")
    box = sbx.create("--profile-file", str(ssh_profile(tmp_path, hosts)))
    work = tmp_path / "remote-work"
    code = tmp_path / "code"
    code.mkdir()
    (code / "main.sh").write_text('read name; echo "hello $name from $(pwd), $GREETING" > out.txt\n')

    put = sbx("cp", str(code), f"{box['id']}:{work}")
    assert put.code == 0, put.err
    assert (work / "main.sh").is_file()
    ran = sbx("exec", "-i", "-e", "GREETING=hi", "-w", str(work), box["id"], "--",
              "sh", "main.sh", input="agent\n")
    assert ran.code == 0, ran.err
    back = tmp_path / "back"
    back.mkdir()
    got = sbx("cp", f"{box['id']}:{work / 'out.txt'}", str(back))
    assert got.code == 0, got.err
    assert (back / "out.txt").read_text() == f"hello agent from {work}, hi\n"

    refused = sbx("exec", "-u", "nobody", box["id"], "--", "touch", str(tmp_path / "ran"))
    assert refused.code == 4, refused.err
    assert "ssh" in refused.err and len(refused.err.strip().splitlines()) == 1
    assert not (tmp_path / "ran").exists()
    assert sbx("destroy", box["id"], "--yes").code == 0


# -- a terminal (Capability.PTY) ------------------------------------------------------------


def _command_lines() -> bytes:
    found = b""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found += cmdline.read_bytes() + b"\n"
        except OSError:
            pass
    return found


def test_a_terminal_keeps_its_variables_off_screen_and_off_command_lines_and_hangs_up(leased):
    """A secret in the terminal's env reaches the program, but never its screen (the
    variables go in on the silenced terminal) nor a command line of the host; close() ends
    the program on the host (the terminal hangs up) and leaves the lease."""
    adapter, ref = leased
    secret = f"s3cr3t-{os.urandom(8).hex()}"

    async def main() -> tuple[bytes, bytes, int]:
        term = await adapter.open_pty(ref, ["sh"], env={"SBX_PTY_SECRET": secret})
        try:
            await term.write(b'echo "len=${#SBX_PTY_SECRET} pid=$$ end"\n')
            seen = await terminal_until(term, b" end\r\n")
            lines = _command_lines()  # while the program runs
            pid = int(seen.split(b"pid=")[-1].split()[0])
            assert alive(pid)
        finally:
            await term.close()
        return seen, lines, pid

    seen, lines, pid = asyncio.run(main())
    assert f"len={len(secret)} ".encode() in seen
    encoded = base64.b64encode(secret.encode())
    for text in (seen, lines):
        assert secret.encode() not in text and encoded not in text
    assert wait_ended([pid]) == [], "the program outlived its terminal's close()"
    assert asyncio.run(adapter.get(ref)) is not None


def test_a_terminal_in_a_folder_that_does_not_exist_is_refused_naming_it(leased, tmp_path):
    adapter, ref = leased
    missing = tmp_path / "missing"
    with pytest.raises(AdapterError) as refused:
        asyncio.run(adapter.open_pty(ref, ["sh"], cwd=str(missing)))
    assert str(missing) in str(refused.value) and "\n" not in str(refused.value)
    assert not missing.exists()
