"""What a long-running front end (the dashboard) needs of the library beyond the CLI's calls:
the inventory watch, backend health, the stored samples of every sandbox, a sandbox's origin
and its interactive shell. On the stub and a real SQLite file; the engine where it takes one
(marked `docker`)."""

from __future__ import annotations

import asyncio
import os
import pty
import select
import subprocess
import time
from datetime import timedelta

import pytest
from support import table_rows

import sandboxer
from sandboxer import State
from tests.api.conftest import RUN


async def test_watch_tells_what_another_connection_changed_and_reads_nothing_otherwise(
        client, stub_profile, sbx_home, monkeypatch):
    from sandboxer.core.follow.watch import InventoryWatcher

    before = await client.create(stub_profile, name="before")
    watch = client.watch()
    first = await watch.read()
    assert [b.id for b in first.added] == [before.id] and list(first.sandboxes) == [before.id]
    assert isinstance(first.sandboxes[before.id], sandboxer.AsyncSandbox)
    reads = []
    real = InventoryWatcher._select
    monkeypatch.setattr(InventoryWatcher, "_select",
                        lambda *a, **k: reads.append(1) or real(*a, **k))
    idle = await watch.read()
    assert not idle and reads == []  # nobody committed: not a row was read
    other = sandboxer.AsyncSandboxer(home=sbx_home, actor="elsewhere")  # its own connection
    try:
        made = await other.create(stub_profile, name="made-elsewhere")
        await (await other.get(before.id)).extend("10m")
        change = await watch.read()
        assert [b.name for b in change.added] == ["made-elsewhere"]
        assert [b.id for b in change.changed] == [before.id]
        assert change.changed[0].deadline - before.deadline == timedelta(minutes=10)
        assert set(change.sandboxes) == {before.id, made.id} and reads == [1]
        await made.destroy()
        gone = await watch.read()
        assert gone.removed == (made.id,) and made.id not in gone.sandboxes
        watch.include_destroyed = True  # the next read tells the difference
        shown = await watch.read()
        assert [(b.id, b.state) for b in shown.added] == [(made.id, State.DESTROYED)]
    finally:
        await other.close()
        await watch.aclose()


async def test_watch_as_an_iterator_yields_only_reads_that_found_a_change(client, stub_profile):
    async with client.watch(every=0.05) as watch:
        first = await anext(watch)
        assert not first and dict(first.sandboxes) == {}  # the first read, even empty
        waiting = asyncio.ensure_future(anext(watch))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # nothing changed: nothing yielded
        box = await client.create(stub_profile)
        change = await asyncio.wait_for(waiting, 10)
        assert [b.id for b in change.added] == [box.id]


def test_the_sync_watch_gives_sync_handles(sync_client, stub_profile):
    box = sync_client.create(stub_profile, name="synced")
    with sync_client.watch() as changes:
        first = next(changes)
        assert isinstance(first.sandboxes[box.id], sandboxer.Sandbox)
        assert first.added[0].name == "synced"


async def test_backends_say_what_loads_what_it_can_do_and_whether_it_answers(client, service):
    stub, missing = await client.backends(["stub", "no-such-backend"])
    assert (stub.name, stub.loaded, stub.test_double, stub.checked) == ("stub", True, True, True)
    assert stub.capabilities == {"exec", "logs", "files"}
    assert (stub.reachable, stub.credentials) == (True, True)
    assert (missing.loaded, missing.reachable) == (False, False)
    assert "'no-such-backend' is not installed here" in missing.detail
    unasked = await client.backends(check=False)
    names = [s.name for s in unasked]
    assert {"docker", "stub"} <= set(names)
    assert all(s.checked is False and s.reachable is None for s in unasked)
    docker = unasked[names.index("docker")]
    assert docker.loaded and not docker.test_double and "snapshot" in docker.capabilities
    if service is not None:  # a client of a service gets no shell (it runs on that host)
        assert "shell" not in docker.capabilities


async def test_a_backend_that_does_not_answer_is_unreachable_within_the_timeout(client,
                                                                            monkeypatch):
    from sandboxer.adapters.stub import StubAdapter

    async def hangs(self):
        await asyncio.sleep(60)

    monkeypatch.setattr(StubAdapter, "health", hangs)
    started = time.monotonic()
    (stub,) = await client.backends(["stub"], timeout=0.3)
    assert time.monotonic() - started < 30
    assert (stub.reachable, stub.credentials) == (False, None)
    assert stub.detail == "no answer in 0.3s"


async def test_origin_and_shell_on_a_backend_without_one(client, stub_profile, sbx_home,
                                                         service):
    box = await client.create(stub_profile)
    assert await box.origin() is None
    before = {t: table_rows(sbx_home, t) for t in ("sandboxes", "events")}
    refusal = ("stub backend offers no interactive shell" if service is None
               else "needs a terminal on the service's host")
    with pytest.raises(sandboxer.Conflict, match=refusal):
        await box.shell_command()
    assert {t: table_rows(sbx_home, t) for t in before} == before  # nothing written
    await box.destroy()
    with pytest.raises(sandboxer.Conflict, match="is destroyed: a shell needs it running"):
        await box.shell_command()


def test_the_docker_shell_reaches_the_adapters_engine(monkeypatch):
    """`--host` names the engine the adapter reaches (DOCKER_HOST), even where the docker
    CLI's own context would name another."""
    from sandboxer.adapters.base import Capability, CapabilityNotSupported
    from sandboxer.adapters.docker import DockerAdapter

    monkeypatch.setenv("DOCKER_HOST", "tcp://engine.example:2376")
    adapter = DockerAdapter()
    assert adapter.supports(Capability.SHELL)
    argv = adapter.shell_argv("c0ffee")
    assert argv[1:] == ["--host", "tcp://engine.example:2376", "exec", "-it", "c0ffee", "sh"]
    monkeypatch.setenv("PATH", "/nonexistent")
    assert not adapter.supports(Capability.SHELL)
    with pytest.raises(CapabilityNotSupported, match="needs the docker CLI"):
        adapter.shell_argv("c0ffee")


# -- on the engine ----------------------------------------------------------------------------


def run_on_a_terminal(argv: list[str], typed: bytes, until: bytes, within: float = 30) -> bytes:
    """Run `argv` with a pseudo-terminal as its stdin and stdout (as the dashboard hands it
    the person's terminal), type `typed`, read until `until` shows."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(argv, stdin=terminal, stdout=terminal, stderr=terminal)
    os.close(terminal)
    seen = b""
    try:
        os.write(controller, typed)
        deadline = time.monotonic() + within
        while until not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(controller, 4096)
                except OSError:
                    break
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(controller)
    return seen


@pytest.mark.docker
async def test_the_shell_command_opens_a_shell_in_the_container(client, service):
    box = await client.create("default", labels=RUN)
    if service is not None:  # the shell would run on the service's host: refused, saying so
        with pytest.raises(sandboxer.Conflict, match="needs a terminal on the service's host"):
            await box.shell_command()
    else:
        argv = await box.shell_command()
        assert argv[-4:] == ["exec", "-it", box.backend_ref, "sh"]
        seen = await asyncio.to_thread(run_on_a_terminal, argv,
                                       b"echo in-the-box-$((6*7)) $(hostname)\nexit\n",
                                       b"in-the-box-42")
        assert b"in-the-box-42 " + box.backend_ref[:12].encode() in seen
    await box.pause()
    with pytest.raises(sandboxer.Conflict, match="is paused"):
        await box.shell_command()
    await box.destroy()


@pytest.mark.docker
async def test_recent_metrics_and_origin_on_the_engine(client, docker_api):
    box = await client.create("default", labels=RUN)
    assert await client.recent_metrics(timedelta(minutes=5)) == []
    live = await box.metrics()  # a reading is stored as it is taken
    stored = await client.recent_metrics(timedelta(minutes=5))
    assert [(s.sandbox_id, s.time) for s in stored] == [(box.id, live.time)]
    assert await client.recent_metrics(live.time + timedelta(seconds=1)) == []
    ckpt = await box.snapshot()
    fork = await ckpt.restore(labels=RUN)
    try:
        assert await fork.origin() == ckpt.id and await box.origin() is None
    finally:
        for b in (fork, box):
            await b.destroy()
        await ckpt.remove()
