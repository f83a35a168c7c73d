"""The docker backend's exec options and files against the real engine (docs/adapters.md):
stdin streamed in (1 MiB exact, and 1 GiB without holding it), a timeout that ends the
exec's whole process tree and returns within 0.5 s of the deadline with the output produced
until then, user/cwd/env, and files through the engine's archive API (or, where that API
does not reach, through tar in the sandbox)."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import io
import os
import re
import secrets
import tarfile
import time

import pytest
from support import RUN_ID

from sandboxer.adapters.base import (
    LABEL_ID,
    CreateRequest,
    ExecResult,
    InvalidRequest,
    NoSuchPath,
)
from sandboxer.adapters.docker import DockerAdapter

pytestmark = pytest.mark.docker

MiB = 1024 * 1024
# the bound: a timed-out exec returns within this of its deadline
TIMEOUT_RETURN_S = 0.5


def _clock_start() -> float:
    """The start of a timed call, after a collection of this test process's garbage: a
    full collection that comes due inside the measured second (a late test holds a whole
    suite's objects) is the test runner's time, not the backend's."""
    gc.collect()
    return time.monotonic()


class Box:
    """One real sandbox, driven through the docker adapter on a loop of its own."""

    def __init__(self, **request) -> None:
        self.loop = asyncio.new_event_loop()
        self.adapter = DockerAdapter()
        sandbox_id = f"sbx-files-{secrets.token_hex(6)}"
        self.ref = self.run(self.adapter.create(CreateRequest(
            sandbox_id=sandbox_id, labels={LABEL_ID: sandbox_id, "sbx-test-run": RUN_ID},
            **request))).ref

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def exec(self, argv, **options) -> ExecResult:
        return self.run(self.adapter.exec(self.ref, argv, **options))

    def processes(self) -> list[str]:
        """Every process of the sandbox but its keep-alive and the `ps` itself."""
        listed = self.exec(["ps", "-o", "pid,args"]).stdout.decode().splitlines()[1:]
        return [line for line in listed
                if not re.search(r"\bps -o pid,args$|trap 'exit 0'|sleep 3600$", line)]

    def close(self) -> None:
        try:
            self.run(self.adapter.destroy(self.ref))
            self.run(self.adapter.close())
        finally:
            self.loop.close()


@pytest.fixture
def box(docker_api):
    made = Box()
    yield made
    made.close()


# -- stdin ------------------------------------------------------------------------------------


def test_one_mib_of_stdin_comes_through_exactly_and_fast(box):
    data = os.urandom(MiB)
    started = _clock_start()
    echoed = box.exec(["cat"], stdin=data)
    took = time.monotonic() - started
    assert echoed.exit_code == 0 and echoed.stdout == data
    assert took < 5, f"1 MiB through cat took {took:.2f}s"

    async def pieces():
        for at in range(0, len(data), 10_000):  # odd sizes, as a caller's reads come
            yield data[at:at + 10_000]

    summed = box.run(box.adapter.exec(box.ref, ["sha256sum"], stdin=pieces()))
    assert summed.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()


def _peak_rss_reset() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak resident size (VmHWM)


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) * 1024


def test_a_gib_of_stdin_is_streamed_not_held(box):
    block = os.urandom(MiB)
    sent = 1024

    async def gib():
        for _ in range(sent):
            yield block

    _peak_rss_reset()
    before = _peak_rss()
    counted = box.run(box.adapter.exec(box.ref, ["wc", "-c"], stdin=gib()))
    assert counted.exit_code == 0 and int(counted.stdout) == sent * MiB
    grew = _peak_rss() - before
    assert grew < 64 * MiB, f"sending 1 GiB of stdin grew the peak memory by {grew // MiB} MiB"


def test_stdin_a_command_does_not_read_ends_with_it(box):
    """A command that exits without reading its stdin: the rest is not sent, no hang."""
    async def endless():
        while True:
            yield b"x" * 65536
            await asyncio.sleep(0)

    result = box.run(asyncio.wait_for(
        box.adapter.exec(box.ref, ["sh", "-c", "echo done"], stdin=endless()), 30))
    assert (result.exit_code, result.stdout) == (0, b"done\n")


# -- timeout ----------------------------------------------------------------------------------


def test_a_timeout_kills_the_whole_tree_and_returns_the_output_in_time(box):
    script = ("echo before; echo err >&2; sleep 300 & (sleep 300; echo never) & "
              "sh -c 'sleep 300' & wait")
    started = _clock_start()
    result = box.exec(["sh", "-c", script], timeout_s=1.5)
    late = time.monotonic() - started - 1.5
    assert result.timed_out and result.exit_code == 124
    assert late < TIMEOUT_RETURN_S, f"returned {late:.3f}s after the deadline"
    assert result.stdout == b"before\n"
    assert result.stderr == b"err\nsbx: timed out after 1.5s\n"
    assert box.processes() == [], "processes of the timed-out exec are left"


def test_a_streamed_exec_times_out_the_same_way(box):
    async def stream() -> list:
        return [item async for item in box.adapter.exec_stream(
            box.ref, ["sh", "-c", "echo one; sleep 300 & wait"], timeout_s=1)]

    started = _clock_start()
    items = box.run(stream())
    assert time.monotonic() - started - 1 < TIMEOUT_RETURN_S
    assert items[0] == ("stdout", b"one\n")
    assert items[-2] == ("stderr", b"sbx: timed out after 1s\n")
    assert isinstance(items[-1], ExecResult) and items[-1].timed_out
    assert items[-1].exit_code == 124
    assert box.processes() == []


def test_a_timeout_while_stdin_is_still_going(box):
    async def slow():
        while True:
            yield b"line\n"
            await asyncio.sleep(0.05)

    started = _clock_start()
    result = box.run(box.adapter.exec(box.ref, ["cat"], timeout_s=1, stdin=slow()))
    assert time.monotonic() - started - 1 < TIMEOUT_RETURN_S
    assert result.timed_out and result.stdout.startswith(b"line\n")
    assert box.processes() == []


# -- user, cwd, env -----------------------------------------------------------------------------


def test_user_cwd_and_env(box):
    result = box.exec(["sh", "-c", 'id -u; pwd; echo "$GREETING"'], user="4242", cwd="/tmp",
                      env={"GREETING": "hello there"})
    assert result.stdout == b"4242\n/tmp\nhello there\n"
    assert box.exec(["id", "-u"]).stdout == b"0\n", "the user was for that exec only"
    with pytest.raises(NoSuchPath, match="/nowhere"):
        box.exec(["true"], cwd="/nowhere")
    with pytest.raises(InvalidRequest, match="nobody-here"):
        box.exec(["true"], user="nobody-here")
    missing = box.exec(["no-such-command"])
    assert missing.exit_code in (126, 127)


# -- files --------------------------------------------------------------------------------------


def _tar_of(name: str, data: bytes, mode: int = 0o640) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), mode
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def _once(data: bytes):
    yield data


def _file_from(chunks: list[bytes]) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        member = tar.next()
        return tar.extractfile(member).read()


def test_archive_in_and_out_with_missing_folders_made(box):
    data = os.urandom(200_000)
    box.run(box.adapter.put_archive(box.ref, "/work/a/b", _once(_tar_of("f.bin", data))))
    info = box.run(box.adapter.stat_file(box.ref, "/work/a/b/f.bin"))
    assert (info.type, info.size, info.mode, info.name) == ("file", len(data), 0o640, "f.bin")
    assert box.run(box.adapter.stat_file(box.ref, "/work/a")).type == "dir"
    assert box.run(box.adapter.stat_file(box.ref, "/work/none")) is None

    async def fetch(path):
        return [c async for c in box.adapter.get_archive(box.ref, path)]

    assert _file_from(box.run(fetch("/work/a/b/f.bin"))) == data
    with pytest.raises(NoSuchPath):
        box.run(fetch("/work/none"))
    with pytest.raises(InvalidRequest, match="not a folder"):
        box.run(box.adapter.put_archive(box.ref, "/work/a/b/f.bin", _once(_tar_of("x", b""))))


def test_files_where_the_archive_api_does_not_reach(docker_api):
    """A read-only sandbox's /tmp is a tmpfs the engine's archive API does not see; a
    sandbox with a user gets its files owned by that user: tar in the sandbox serves both."""
    for request, folder in (({"read_only": True}, "/tmp/in"), ({"user": "4242"}, "/tmp/in")):
        made = Box(**request)
        try:
            made.run(made.adapter.put_archive(made.ref, folder, _once(_tar_of("f", b"hi\n"))))
            assert made.exec(["stat", "-c", "%u %s", f"{folder}/f"]).stdout == \
                (b"4242 3\n" if "user" in request else b"0 3\n")
            info = made.run(made.adapter.stat_file(made.ref, f"{folder}/f"))
            assert (info.type, info.size) == ("file", 3)

            async def fetch(box: Box, path: str) -> list[bytes]:
                return [c async for c in box.adapter.get_archive(box.ref, path)]

            assert _file_from(made.run(fetch(made, f"{folder}/f"))) == b"hi\n"
        finally:
            made.close()


def test_a_failing_stdin_is_an_error_not_a_short_input(box):
    async def broken():
        yield b"first part\n"
        raise OSError("the disk the stdin came from went away")

    with pytest.raises(OSError, match="went away"):
        box.run(box.adapter.exec(box.ref, ["cat"], stdin=broken()))
