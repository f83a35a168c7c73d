"""`box.files` through the library on the real Docker engine, in process (and through a
live `sbx serve`: tests/api/test_files_remote.py collects them again): an agent's round
trip (code in, run with env and cwd, the artefact back), each operation, the
`sandbox.file` events (size and SHA-256, never the bytes), bad input refused with the
documented exit code changing nothing, a backend without the files capability refused
naming it, trees both ways, and a large transfer that keeps the process's memory bounded.
docs/api.md, "Files"."""

from __future__ import annotations

import contextlib
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


async def _activity(client, box):
    return (await client.get(box.id)).last_activity_at


async def test_refused_file_operations_change_nothing(client, box, tmp_path):
    """A missing path, a folder read as a file, a non-bytes chunk, the root downloaded:
    refused with the documented exit code, no event, last_activity_at as it was (the
    activity used to be recorded before the backend was asked)."""
    await box.files.mkdir("/work/here")  # an event and activity before
    await box.files.write("/work/keep/kept.txt", b"kept")
    out = tmp_path / "out"
    out.mkdir()
    before_events, before = await box.events(), await _activity(client, box)

    async def ints():
        yield b"ok"
        yield 5  # bytes(5) would be five NUL bytes

    refusals = [
        (NotFound, 3, lambda: box.files.stat("/nope")),
        (BadInput, 2, lambda: box.files.read("/etc")),
        (NotFound, 3, lambda: box.files.read("/nope")),
        (NotFound, 3, lambda: box.files.remove("/nope")),
        (NotFound, 3, lambda: box.files.list("/nope")),
        (BadInput, 2, lambda: box.files.write("/work/here/x", ints())),
        # a file over a folder would replace the folder and all it holds
        (BadInput, 2, lambda: box.files.write("/work/keep", b"over")),
        (BadInput, 2, lambda: box.files.download("/", out / "root")),
        (BadInput, 2, lambda: box.files.download("/work/..", out)),
        (BadInput, 2, lambda: box.files.list("/work", depth=65)),
    ]
    for error, code, call in refusals:
        with pytest.raises(error) as caught:
            await call()
        assert caught.value.exit_code == code and "\n" not in str(caught.value)
        assert await box.events() == before_events, caught.value
        assert await _activity(client, box) == before, caught.value
    assert list(out.iterdir()) == []
    assert (await box.exec(["ls", "/work/here"])).stdout == b""  # no file of NUL bytes
    assert await box.files.read("/work/keep/kept.txt") == b"kept"  # the folder is whole
    await box.files.stat("/work/here")  # what succeeds is activity
    assert await _activity(client, box) > before


async def test_a_chunk_that_is_not_bytes_is_refused_naming_its_type(box):
    async def ints():
        yield 10
    with pytest.raises(BadInput, match="each chunk must be bytes, not int"):
        await box.files.write("/work/x", ints())


async def test_a_download_never_leaves_a_link_pointing_out_of_its_destination(box, tmp_path):
    """The tree is unpacked beside the destination and moved there: a link to a sibling of
    the top entry (../.ssh/...) stayed inside the unpacking folder but, moved, pointed out
    of the destination (docs/security.md, "Trees out of a sandbox")."""
    await box.exec(["sh", "-c", "mkdir -p /w/proj && echo ok > /w/proj/ok && "
                    "ln -s ../.ssh/authorized_keys /w/proj/notes.txt && ln -s . /w/top && "
                    "ln -s ok /w/proj/fine"])
    before = [e for e in _file_events(await box.events())]
    (tmp_path / "dl").mkdir()
    with pytest.raises(BadInput, match="'proj/notes.txt' is a link pointing out") as caught:
        await box.files.download("/w/proj", tmp_path / "dl" / "proj")
    assert caught.value.exit_code == 2
    with pytest.raises(BadInput, match="'top' is a link at the top of the tree"):
        await box.files.download("/w/top", tmp_path / "dl")
    assert list((tmp_path / "dl").iterdir()) == []
    await box.exec(["rm", "/w/proj/notes.txt"])
    done = await box.files.download("/w/proj", tmp_path / "dl" / "mine")
    assert os.readlink(tmp_path / "dl" / "mine" / "fine") == "ok"
    assert (tmp_path / "dl" / "mine" / "fine").read_text() == "ok\n" and done.entries == 3
    assert len(_file_events(await box.events())) > len(before)


async def test_a_download_is_recorded_when_it_returns(client, box, sbx_home, tmp_path):
    """The core's stream is closed when the unpacking stops (a tar's end blocks may be left
    unread), so its `sandbox.file` event is there as soon as download returns, also as a
    client's last call (it used to wait for the garbage collector: often never)."""
    await box.exec(["sh", "-c", "mkdir -p /w/d && echo x > /w/d/f"])
    for n in range(3):
        async with sandboxer.AsyncSandboxer(home=sbx_home, actor="api-test") as other:
            mine = await other.get(box.id)
            await mine.files.download("/w/d", tmp_path / f"d{n}")
            downloads = [e for e in _file_events(await box.events()) if e["op"] == "download"]
            assert len(downloads) == n + 1
    async with contextlib.aclosing(box.files.get_tree("/w/d")) as tree:
        await anext(tree)  # read a little, then stop: recorded at once
    assert len([e for e in _file_events(await box.events()) if e["op"] == "download"]) == 4


async def test_upload_of_the_current_folder(box, tmp_path, monkeypatch):
    """`upload(".", "/work/new")` names the folder by its real name (Path(".").name is
    empty: it used to write the wrong shape, then fail)."""
    local = tmp_path / "proj"
    (local / "sub").mkdir(parents=True)
    (local / "sub" / "f.txt").write_text("f\n")
    monkeypatch.chdir(local)
    done = await box.files.upload(".", "/work/new")
    assert done.path == "/work/new"
    assert await box.files.read("/work/new/sub/f.txt") == b"f\n"
    monkeypatch.chdir(local / "sub")
    await box.files.upload("..", "/work/new2")
    assert await box.files.read("/work/new2/sub/f.txt") == b"f\n"


async def test_a_listing_past_the_cap_is_refused_saying_so(client, box, monkeypatch):
    """files.list holds at most SBX_LIST_MAX_ENTRIES entries (and 64 levels): past it, a
    one-line refusal naming the cap, nothing changed."""
    await box.exec(["sh", "-c", "mkdir -p /w/many && cd /w/many && "
                    "for i in $(seq 1 60); do echo $i > f$i; done"])
    monkeypatch.setenv("SBX_LIST_MAX_ENTRIES", "50")
    before_events, before = await box.events(), await _activity(client, box)
    with pytest.raises(BadInput, match="more than 50 entries.*SBX_LIST_MAX_ENTRIES") as caught:
        await box.files.list("/w/many")
    assert caught.value.exit_code == 2 and "\n" not in str(caught.value)
    assert await box.events() == before_events and await _activity(client, box) == before
    monkeypatch.setenv("SBX_LIST_MAX_ENTRIES", "60")
    assert len(await box.files.list("/w/many")) == 60


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
