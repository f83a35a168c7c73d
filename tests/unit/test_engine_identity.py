"""A sandbox lives on one engine (or account) of its backend. A process that reaches
another one (a different DOCKER_HOST, say) must neither declare it lost nor "destroy" it
there while the real one keeps running: it refuses, loudly (exit 5)."""

import asyncio
from datetime import timedelta

import pytest
from support import NothingHere

from sandboxer.adapters import registry
from sandboxer.adapters.stub import StubAdapter
from sandboxer.core.lifecycle.manager import Manager
from sandboxer.core.reconcile.reaper import Reaper
from sandboxer.core.rules.clock import FrozenClock
from sandboxer.core.rules.errors import Unavailable
from sandboxer.core.rules.profiles import ProfileLoader
from sandboxer.core.store.db import Database


@pytest.fixture
def setup(sbx_home, tmp_path):
    StubAdapter.reset()
    StubAdapter.instance = "engine-a"
    path = tmp_path / "p.yaml"
    path.write_text("backend: stub\nttl: {default: 10m, max: 1h}\n")
    clock = FrozenClock()
    mgr = Manager(Database(f"sqlite:///{sbx_home / 'sbx.db'}"), clock, actor="t",
                  install_id="inst-t")
    row = asyncio.run(mgr.create(ProfileLoader().load_file(path)))
    yield mgr, clock, row
    asyncio.run(mgr.close())
    StubAdapter.reset()


def reap(mgr, clock):
    reaper = Reaper(install_id="inst-t", clock=clock,
                    read_rows=lambda: (mgr.list(), mgr.rows_by_ids),
                    make_manager=lambda _adapters: mgr,
                    warn_before=timedelta(minutes=5), grace=timedelta(seconds=60))
    for name in registry.names():
        if name != "stub":
            reaper.adapters[name] = NothingHere()
    return asyncio.run(reaper.cycle())


def test_the_engine_is_recorded_and_another_one_is_refused(setup):
    mgr, clock, row = setup
    assert row["backend_instance"] == "engine-a"
    StubAdapter.instance = "engine-b"  # this process now reaches another engine
    clock.advance(timedelta(minutes=11))  # and the sandbox is past its deadline
    report = reap(mgr, clock)
    assert report.destroyed == [] and report.reconciled == []
    assert report.failed[0]["code"] == 5 and "another stub engine" in report.failed[0]["error"]
    assert mgr.resolve(row["id"])["state"] == "running"  # not declared lost
    assert StubAdapter.calls.count(("destroy", row["backend_ref"])) == 0
    with pytest.raises(Unavailable, match="check DOCKER_HOST"):
        asyncio.run(mgr.destroy(row["id"]))
    with pytest.raises(Unavailable):
        asyncio.run(mgr.exec(row["id"], ["true"]))
    StubAdapter.instance = "engine-a"  # the right engine again: reaped on time
    assert reap(mgr, clock).destroyed == [row["id"]]


def test_a_remembered_engine_id_holds_only_for_the_socket_file_it_was_learnt_on(
        sbx_home, tmp_path):
    """`docker info` is asked once per engine socket; an engine restarted, or another one
    at the same path, makes a new socket file, and its identity is asked again."""
    import shutil
    import socket
    import tempfile
    from pathlib import Path

    from sandboxer.adapters.docker import known_engine_id, remember_engine_id

    folder = Path(tempfile.mkdtemp(prefix="sbx-sock-"))  # AF_UNIX paths are short
    path = folder / "engine.sock"
    url = f"unix://{path}"

    def listen():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        return sock

    first = listen()
    assert known_engine_id(url)[0] is None
    remember_engine_id(known_engine_id(url)[1], "ENGINE-A")
    assert known_engine_id(url)[0] == "ENGINE-A"
    assert (sbx_home / "docker-engine-ids.json").stat().st_mode & 0o077 == 0
    first.close()
    path.unlink()
    second = listen()  # the "restarted" engine: same path, new socket file
    try:
        assert known_engine_id(url)[0] is None
    finally:
        second.close()
        shutil.rmtree(folder)
    assert known_engine_id("tcp://127.0.0.1:2375") == (None, None)  # remote: always asked
