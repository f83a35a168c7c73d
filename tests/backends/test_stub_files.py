"""The stub (a TEST DOUBLE) keeps a filesystem in memory per sandbox, so the FILES contract
and the conformance kit run on it: these tests check the double itself does what the contract
says, so a failure elsewhere is not the double's."""

from __future__ import annotations

import asyncio
import io
import tarfile
from collections.abc import AsyncIterator

import pytest

from sandboxer.adapters.base import (
    Capability,
    CapabilityNotSupported,
    CreateRequest,
    InvalidRequest,
    NoSuchPath,
)
from sandboxer.adapters.stub import StubAdapter


@pytest.fixture
def stub():
    StubAdapter.reset()
    adapter = StubAdapter()
    ref = asyncio.run(adapter.create(CreateRequest(sandbox_id="s1", labels={})))
    yield adapter, ref.ref
    StubAdapter.reset()


async def one(data: bytes) -> AsyncIterator[bytes]:
    yield data


def test_declares_files_but_not_processes_or_users():
    assert StubAdapter().supports(Capability.FILES)
    assert not StubAdapter().supports(Capability.PROCESSES)
    assert not StubAdapter().supports(Capability.RUN_AS_USER)


def test_exec_takes_cwd_env_and_stdin(stub):
    adapter, ref = stub
    assert asyncio.run(adapter.exec(ref, ["cat"], stdin=one(b"piped"))).stdout == b"piped"
    assert asyncio.run(adapter.exec(ref, ["pwd"], cwd="/tmp")).stdout == b"/tmp\n"
    assert asyncio.run(adapter.exec(ref, ["printenv", "K"], env={"K": "v"})).stdout == b"v\n"
    assert asyncio.run(adapter.exec(ref, ["pwd"], cwd="/nowhere")).exit_code == 2
    timed = asyncio.run(adapter.exec(ref, ["sleep", "5"], timeout_s=0.1))
    assert (timed.exit_code, timed.timed_out) == (124, True)
    assert timed.stderr.endswith(b"sbx: timed out after 0.1s\n")


def test_user_is_refused_naming_the_backend(stub):
    adapter, ref = stub
    with pytest.raises(CapabilityNotSupported, match="the stub backend"):
        asyncio.run(adapter.exec(ref, ["echo", "hi"], user="nobody"))


def test_files_round_trip_in_memory(stub):
    adapter, ref = stub
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("d/f.txt")
        info.size, info.mode = 3, 0o600
        tar.addfile(info, io.BytesIO(b"abc"))
    asyncio.run(adapter.put_archive(ref, "/work", one(buffer.getvalue())))
    assert asyncio.run(adapter.exec(ref, ["cat", "d/f.txt"], cwd="/work")).stdout == b"abc"
    info = asyncio.run(adapter.stat_file(ref, "/work/d/f.txt"))
    assert (info.type, info.size, info.mode) == ("file", 3, 0o600)
    assert [f.path for f in asyncio.run(adapter.list_files(ref, "/work", depth=2))] == \
        ["/work/d", "/work/d/f.txt"]

    async def back() -> bytes:
        return b"".join([c async for c in adapter.get_archive(ref, "/work/d")])
    with tarfile.open(fileobj=io.BytesIO(asyncio.run(back()))) as tar:
        assert [m.name for m in tar.getmembers()] == ["d", "d/f.txt"]

    with pytest.raises(InvalidRequest):
        asyncio.run(adapter.remove_file(ref, "/work"))
    asyncio.run(adapter.rename_file(ref, "/work/d/f.txt", "/tmp"))
    assert asyncio.run(adapter.stat_file(ref, "/tmp/f.txt")).size == 3
    asyncio.run(adapter.remove_file(ref, "/work", recursive=True))
    assert asyncio.run(adapter.stat_file(ref, "/work")) is None
    with pytest.raises(NoSuchPath):
        asyncio.run(adapter.list_files(ref, "/work"))
    with pytest.raises(NoSuchPath):
        asyncio.run(adapter.make_dir(ref, "/a/b", parents=False))
