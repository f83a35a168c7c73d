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

