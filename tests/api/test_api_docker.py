"""The library on the real Docker engine: the handles do what the CLI does, streams stream,
checkpoints restore and fork, many creates run at once. Everything carries the run label and
is removed by id (containers by the client fixture, checkpoint images here)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import pytest_asyncio
from support import install_id_of

import sandboxer
from sandboxer import State
from tests.api.conftest import RUN

pytestmark = pytest.mark.docker


@pytest_asyncio.fixture
async def docker_client(client, sbx_home, docker_api):
    """The client fixture, plus removal of this installation's checkpoint images."""
    yield client
    install = install_id_of(sbx_home)
    if install:
        images = docker_api.images(all=True, filters={"label": [f"sbx.install={install}"]})
        for info in sorted(images, key=lambda i: i.get("Created", 0), reverse=True):
            for ref in [t for t in info.get("RepoTags") or [] if t != "<none>:<none>"] or \
                    [info["Id"]]:
                try:
                    docker_api.remove_image(ref, force=True)
                except Exception:
                    pass


async def test_create_exec_destroy_on_the_engine(docker_client, docker_api):
    sbx = docker_client
    async with sbx.create("default", ttl="10m", labels=RUN, task="api on docker") as box:
        assert box.backend == "docker" and box.state is State.RUNNING
        info = docker_api.inspect_container(box.backend_ref)
        assert info["Config"]["Labels"]["sbx.id"] == box.id
        assert info["HostConfig"]["NetworkMode"] == "none"
        result = await box.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
        assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
        timed = await box.exec(["sleep", "30"], timeout="1s")
        assert timed.timed_out and timed.exit_code == 124
    assert box.state is State.DESTROYED
    assert docker_api.containers(all=True, filters={"id": box.backend_ref}) == []


async def test_exec_stream_yields_output_as_it_comes(docker_client):
    box = await docker_client.create("default", labels=RUN)
    arrivals = []
    async for item in box.exec_stream(["sh", "-c", "echo first; sleep 1.5; echo second >&2"]):
        arrivals.append((time.monotonic(), item))
    kinds = [(type(i).__name__, getattr(i, "stream", None), getattr(i, "data", None))
             for _, i in arrivals]
    assert kinds == [("OutputChunk", "stdout", b"first\n"),
                     ("OutputChunk", "stderr", b"second\n"), ("ExecExit", None, None)]
    # the first line came before the command slept, not with the rest at the end
    assert arrivals[1][0] - arrivals[0][0] > 1.0
    assert arrivals[-1][1].exit_code == 0
    await box.destroy()


async def test_logs_metrics_and_evidence(docker_client, tmp_path):
    from sandboxer.core.observe.evidence import verify

    profile = await docker_client.profile("default")
    talker = profile.model_copy(update={
        "name": "talker", "command": ["sh", "-c", "echo started; exec sleep 600"]})
    box = await docker_client.create(talker, labels=RUN)
    chunks = [c async for c in box.logs()]
    assert b"started" in b"".join(chunks)
    sample = await box.metrics()
    assert sample is not None and sample.sandbox_id == box.id
    assert sample.memory_bytes and sample.memory_limit == 512 * 1024**2
    await box.exec(["sh", "-c", "echo for the record"])
    bundle = await box.evidence(tmp_path / "evidence.json")
    on_disk = json.loads((tmp_path / "evidence.json").read_text())
    assert on_disk == json.loads(json.dumps(bundle)) and verify(on_disk) == []
    assert (tmp_path / "evidence.json").stat().st_mode & 0o777 == 0o600
    assert on_disk["summary"]["exec_count"] == 1
    await box.destroy()


async def test_snapshot_restore_fork_export_import(docker_client, tmp_path, sbx_home):
    box = await docker_client.create("default", labels=RUN)
    await box.exec(["sh", "-c", "echo kept > /tmp/mark"])
    ckpt = await box.snapshot("api-mark")
    assert isinstance(ckpt, sandboxer.AsyncCheckpoint)
    assert (ckpt.sandbox, ckpt.name, ckpt.kind, ckpt.state) == (box.id, "api-mark",
                                                                "filesystem", "ready")
    assert (await docker_client.checkpoint("api-mark")).id == ckpt.id
    await box.destroy()
    restored = await ckpt.restore(ttl="5m", labels=RUN)
    assert (await restored.exec(["cat", "/tmp/mark"])).stdout == b"kept\n"
    forks = await ckpt.fork(2, labels=RUN)
    assert len({f.id for f in forks}) == 2
    await forks[0].exec(["sh", "-c", "echo changed > /tmp/mark"])
    assert (await forks[1].exec(["cat", "/tmp/mark"])).stdout == b"kept\n"
    archive = await ckpt.export(tmp_path / "ckpt.tar.gz")
    assert archive.stat().st_size > 0
    for b in (restored, *forks):
        await b.destroy()
    listed = await docker_client.checkpoints(box.id)
    assert [c.id for c in listed] == [ckpt.id]
    await ckpt.remove()
    assert await docker_client.checkpoints() == []
    with pytest.raises(sandboxer.NotFound):
        await ckpt.refresh()


async def test_twenty_concurrent_creates_through_one_client(docker_client, docker_api):
    boxes = await asyncio.gather(*(docker_client.create("default", labels=RUN)
                                   for _ in range(20)))
    assert len({b.id for b in boxes}) == 20
    assert all(b.state is State.RUNNING for b in boxes)
    running = docker_api.containers(filters={"label": [f"sbx.install={boxes[0].to_dict()['install']}"]})
    assert {c["Id"] for c in running} >= {b.backend_ref for b in boxes}
    await asyncio.gather(*(b.destroy() for b in boxes))
    assert all(b.state is State.DESTROYED for b in boxes)
    assert docker_api.containers(all=True, filters={
        "label": [f"sbx.install={boxes[0].to_dict()['install']}"]}) == []


def test_the_sync_client_on_the_engine(sync_client, docker_api):
    with sync_client.create("default", labels=RUN) as box:
        assert box.exec(["sh", "-c", "echo sync"]).stdout == b"sync\n"
        box.pause()
        assert box.state is State.PAUSED
        assert docker_api.inspect_container(box.backend_ref)["State"]["Paused"]
        box.resume()
        assert box.refresh().state is State.RUNNING
    assert docker_api.containers(all=True, filters={"id": box.backend_ref}) == []
