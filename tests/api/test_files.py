"""`box.files` through the library on the real Docker engine, in process (and through a
live `sbx serve`: tests/api/test_files_remote.py collects them again): an agent's round
trip (code in, run with env and cwd, the artefact back), each operation, the
`sandbox.file` events (size and SHA-256, never the bytes), bad input refused with the
documented exit code changing nothing, a backend without the files capability refused
naming it, trees both ways, and a large transfer that keeps the process's memory bounded.
docs/api.md, "Files"."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import pytest_asyncio
from support import remove_test_containers

import sandboxer
from sandboxer import BadInput, Conflict, NotFound
from tests.api.conftest import RUN

pytestmark = pytest.mark.docker

@pytest_asyncio.fixture
async def client(sbx_home: Path):
    """An AsyncSandboxer in this process on the test's SBX_HOME (tests/api/test_files_remote.py
    collects these tests again with a client of a live `sbx serve`)."""
    sbx = sandboxer.AsyncSandboxer(home=sbx_home, actor="api-test")
    yield sbx
    await sbx.close()
    remove_test_containers(sbx_home)


@pytest_asyncio.fixture
async def box(client):
    made = await client.create("default", ttl="10m", labels=RUN, task="files")
    yield made
    await made.destroy()


def _file_events(events) -> list[dict]:
    return [dict(e.payload) for e in events if e.type == "sandbox.file"]


async def test_an_agents_round_trip_code_in_run_with_env_and_cwd_artefact_out(box):
    code = "import os\nopen('out.txt', 'w').write(os.environ['WHO'] + ' ' + os.getcwd())\n"
    script = 'read line < job.txt; echo "$line $WHO $(pwd)" > out.txt'  # busybox: no python
    put = await box.files.write("/work/job/run.sh", script, mode=0o755)
    assert put == sandboxer.FileTransfer("/work/job/run.sh", len(script),
                                         hashlib.sha256(script.encode()).hexdigest())
    await box.files.write("/work/job/job.txt", b"task-1\n")
    await box.files.write("/work/job/unused.py", code)
    ran = await box.exec(["sh", "./run.sh"], env={"WHO": "agent"}, cwd="/work/job")
    assert ran.exit_code == 0, ran.stderr
    assert await box.files.read_text("/work/job/out.txt") == "task-1 agent /work/job\n"
    info = await box.files.stat("/work/job/run.sh")
    assert (info.type, info.size, info.mode, info.name) == ("file", len(script), 0o755,
                                                            "run.sh")


async def test_list_stat_exists_mkdir_rename_remove(box):
    await box.files.mkdir("/work/a/b/c")
    await box.files.write("/work/a/b/c/f.txt", b"x" * 10)
    await box.exec(["ln", "-s", "c/f.txt", "/work/a/b/link"])
    listed = await box.files.list("/work/a", depth=3)
    assert [(i.path, i.type) for i in listed] == [
        ("/work/a/b", "dir"), ("/work/a/b/c", "dir"), ("/work/a/b/c/f.txt", "file"),
        ("/work/a/b/link", "symlink")]
    assert [i.path for i in await box.files.list("/work/a")] == ["/work/a/b"]
    link = await box.files.stat("/work/a/b/link")
    assert (link.type, link.target) == ("symlink", "c/f.txt")
    assert await box.files.read("/work/a/b/link") == b"x" * 10  # followed
    assert await box.files.exists("/work/a/b/c/f.txt")
    assert not await box.files.exists("/work/a/nothing")

    await box.files.rename("/work/a/b/c/f.txt", "/work/a/g.txt")
    assert await box.files.read("/work/a/g.txt") == b"x" * 10
    assert not await box.files.exists("/work/a/b/c/f.txt")
    with pytest.raises(BadInput, match="not empty"):
        await box.files.remove("/work/a/b")
    await box.files.remove("/work/a/g.txt")
    await box.files.remove("/work/a", recursive=True)
    assert not await box.files.exists("/work/a")
    ops = [(e["op"], e["path"]) for e in _file_events(await box.events())]
    assert ops == [("mkdir", "/work/a/b/c"), ("write", "/work/a/b/c/f.txt"),
                   ("read", "/work/a/b/link"), ("rename", "/work/a/b/c/f.txt"),
                   ("read", "/work/a/g.txt"), ("remove", "/work/a/g.txt"),
                   ("remove", "/work/a")]


async def test_events_record_size_and_digest_never_the_bytes(client, box, sbx_home):
    marker = f"secret-content-{secrets.token_hex(12)}"
    data = (marker + "\n") * 1000
    await box.files.write("/work/data.txt", data)
    assert await box.files.read_text("/work/data.txt") == data
    digest = hashlib.sha256(data.encode()).hexdigest()
    write, read = _file_events(await box.events())
    assert write == {"op": "write", "direction": "in", "path": "/work/data.txt", "to": None,
                     "kind": "file", "bytes": len(data), "sha256": digest, "entries": None}
    assert (read["op"], read["direction"], read["bytes"], read["sha256"]) == (
        "read", "out", len(data), digest)
    assert [e.actor for e in await box.events() if e.type == "sandbox.file"] == \
        ["api-test", "api-test"]
    await client.deliver_events()
    hits = [p.name for p in sbx_home.rglob("*") if p.is_file()
            and marker.encode() in p.read_bytes()]
    assert hits == []  # not in the database, the JSON Lines sink or anywhere else there


async def test_bad_paths_are_refused_and_change_nothing(box):
    before = await box.events()
    with pytest.raises(BadInput, match="relative") as relative:
        await box.files.write("work/x.txt", b"data")
    assert relative.value.exit_code == 2
    for call in (box.files.read("etc/passwd"), box.files.list("work"),
                 box.files.remove("x"), box.files.mkdir("x"), box.files.rename("/etc", "x")):
        with pytest.raises(BadInput):
            await call
    with pytest.raises(BadInput, match="folder"):
        await box.files.read("/etc")
    with pytest.raises(NotFound, match="/work/missing.txt") as missing:
        await box.files.read("/work/missing.txt")
    assert missing.value.exit_code == 3
    for call in (box.files.stat("/work/missing"), box.files.remove("/work/missing"),
                 box.files.rename("/work/missing", "/work/other"),
                 box.files.list("/work/missing")):
        with pytest.raises(NotFound):
            await call
    with pytest.raises(NotFound, match="^/work/no does not exist"):
        await box.files.mkdir("/work/no/such", parents=False)
    assert await box.events() == before
    assert (await box.exec(["ls", "/work"])).stdout == b""  # nothing was written


async def test_a_backend_without_files_is_refused_naming_it(client, stub_profile,
                                                            monkeypatch):
    from sandboxer.adapters.base import Capability
    from sandboxer.adapters.stub import StubAdapter

    monkeypatch.setattr(StubAdapter, "capabilities",
                        StubAdapter.capabilities - {Capability.FILES})
    box = await client.create(stub_profile, labels=RUN)
    before = await box.events()
    with pytest.raises(Conflict, match="stub backend cannot read or write files") as refused:
        await box.files.write("/work/x", b"x")
    assert refused.value.exit_code == 4
    with pytest.raises(Conflict, match="stub backend"):
        await box.files.list("/")
    assert await box.events() == before
    await box.destroy()


async def test_trees_up_and_down(box, tmp_path):
    local = tmp_path / "project"
    (local / "src" / "pkg").mkdir(parents=True)
    (local / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (local / "README").write_bytes(secrets.token_bytes(70_000))
    (local / "empty").mkdir()
    up = await box.files.upload(local, "/work/project")
    assert up.path == "/work/project" and up.entries == 6
    listed = {i.path: i.type for i in await box.files.list("/work/project", depth=5)}
    assert listed == {"/work/project/README": "file", "/work/project/empty": "dir",
                      "/work/project/src": "dir", "/work/project/src/pkg": "dir",
                      "/work/project/src/pkg/mod.py": "file"}
    # under another name; into an existing folder
    await box.files.upload(local, "/work/renamed")
    assert await box.files.read("/work/renamed/src/pkg/mod.py") == b"x = 1\n"
    await box.files.upload(local / "README", "/work/project/src")
    assert (await box.files.stat("/work/project/src/README")).size == 70_000

    await box.exec(["sh", "-c", "echo made > /work/project/src/out.txt"])
    down = await box.files.download("/work/project", tmp_path / "back")
    back = tmp_path / "back"
    assert (back / "src" / "out.txt").read_text() == "made\n"
    assert (back / "README").read_bytes() == (local / "README").read_bytes()
    assert (back / "empty").is_dir()
    assert down.bytes > 70_000 and len(down.sha256) == 64
    one = await box.files.download("/work/project/src/pkg/mod.py", tmp_path)
    assert Path(one.path) == tmp_path / "mod.py" and (tmp_path / "mod.py").read_text() == "x = 1\n"
    kinds = [(e["op"], e["kind"], e["direction"]) for e in _file_events(await box.events())
             if e["op"] in ("upload", "download")]
    assert kinds[0] == ("upload", "tree", "in") and kinds[-1] == ("download", "tree", "out")


def test_the_sync_api_has_files(sbx_home, tmp_path):
    with sandboxer.Sandboxer(home=sbx_home, actor="api-test") as sbx:
        try:
            with sbx.create("default", ttl="10m", labels=RUN) as box:
                local = tmp_path / "in.bin"
                local.write_bytes(b"\x00\x01" * 5000)
                box.files.write("/work/in.bin", local)
                with local.open("rb") as f:
                    box.files.write("/work/again.bin", f)
                assert box.files.read("/work/again.bin") == local.read_bytes()
                assert b"".join(box.files.stream("/work/in.bin")) == local.read_bytes()
                assert [i.name for i in box.files.list("/work")] == ["again.bin", "in.bin"]
        finally:
            remove_test_containers(sbx_home)


BIG = textwrap.dedent("""
    import asyncio, hashlib, json, sys
    from pathlib import Path
    import sandboxer

    home, local, size = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])


    def peak_kib():
        # this process's own high-water mark (ru_maxrss would count the parent it was
        # forked from: Linux records the forked copy's peak at exec)
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])

    async def main():
        async with sandboxer.AsyncSandboxer(home=home, actor="api-test") as sbx:
            box = await sbx.create("default", ttl="10m", labels=json.loads(sys.argv[4]))
            try:
                before = peak_kib()
                put = await box.files.write("/tmp/big", local)
                digest, got = hashlib.sha256(), 0
                async for chunk in box.files.stream("/tmp/big"):
                    digest.update(chunk)
                    got += len(chunk)
                peak = peak_kib()
                print(json.dumps({"sent": put.bytes, "sent_sha256": put.sha256, "got": got,
                                  "got_sha256": digest.hexdigest(), "before_kib": before,
                                  "peak_kib": peak}))
            finally:
                await box.destroy()

    asyncio.run(main())
""")


@pytest.mark.slow
def test_a_large_file_goes_in_and_out_with_bounded_memory(sbx_home, tmp_path):
    """256 MiB up and down through the library (the core in the same process): the
    process's peak RSS stays under 150 MiB (bench/ measures 1 GiB)."""
    size = 256 << 20
    local = tmp_path / "big.bin"
    digest = hashlib.sha256()
    block = secrets.token_bytes(1 << 20)
    with local.open("wb") as f:
        for i in range(size >> 20):
            piece = block[i:] + block[:i]
            digest.update(piece)
            f.write(piece)
    script = tmp_path / "big.py"
    script.write_text(BIG)
    env = {**os.environ, "SBX_HOME": str(sbx_home)}
    try:
        done = subprocess.run([sys.executable, str(script), str(sbx_home), str(local),
                               str(size), json.dumps(RUN)], env=env, capture_output=True,
                              text=True, timeout=600)
    finally:
        remove_test_containers(sbx_home)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["sent"] == report["got"] == size
    assert report["sent_sha256"] == report["got_sha256"] == digest.hexdigest()
    assert report["peak_kib"] < 150 * 1024, report
    print(f"peak RSS {report['peak_kib'] // 1024} MiB (before the transfer "
          f"{report['before_kib'] // 1024} MiB)")
