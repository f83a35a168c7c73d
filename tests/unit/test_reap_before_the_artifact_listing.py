"""A reap cycle that finds sandboxes due removes them without waiting for the checkpoints'
artifact listing, on Docker an image listing and the engine's slowest call: CHECKPOINTS run
last, so their part of the plan is awaited when the cycle comes to it, and is still done in
that cycle (sandboxer/core/reconcile/reaper.py, Plan; docs/design.md, "What a reap of due
sandboxes costs"). Checkpoint rows that cannot be read still stop the cycle before anything
is asked of a backend, as an unreadable database always has. The stub is the test double here; bench/bench_scale.py part 5 measures
the effect on the real engine."""

import asyncio
from datetime import timedelta

import pytest
from support import NothingHere

from sandboxer.adapters import registry
from sandboxer.adapters.base import LABEL_CHECKPOINT, LABEL_INSTALL, Artifact, Capability
from sandboxer.adapters.stub import StubAdapter
from sandboxer.core.lifecycle.manager import Manager
from sandboxer.core.reconcile.reaper import Reaper
from sandboxer.core.rules.clock import FrozenClock
from sandboxer.core.rules.profiles import ProfileLoader
from sandboxer.core.store.db import Database

INSTALL = "inst-t"
# an artifact of ours that no checkpoint row claims: work for the CHECKPOINTS action
ORPHAN = Artifact("stub-image:ck-orphan", {LABEL_INSTALL: INSTALL, LABEL_CHECKPOINT: "ck-orphan"})


class SlowListing(StubAdapter):
    """A backend that keeps checkpoints, whose artifact listing answers only once a removal
    has happened (or never, with `answer=False`)."""

    capabilities = StubAdapter.capabilities | {Capability.SNAPSHOT}
    test_double = False  # the reaper looks for no test double's artifacts

    def __init__(self, answer: bool = True) -> None:
        super().__init__()
        self.answer = answer
        self.removed = asyncio.Event()
        self.listing_cancelled = False
        self.artifacts = [ORPHAN]
        self.order: list[str] = []

    async def list_artifacts(self, labels):
        self.order.append("listing asked")
        try:
            await self.removed.wait()
            if not self.answer:
                await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.listing_cancelled = True
            raise
        self.order.append("listing answered")
        want = dict(labels).items()
        return [a for a in self.artifacts if want <= dict(a.labels).items()]

    async def delete_artifact(self, artifact: str) -> None:
        self.artifacts = [a for a in self.artifacts if a.ref != artifact]

    async def destroy(self, ref, **kwargs) -> None:
        await super().destroy(ref, **kwargs)
        self.order.append("removed")
        self.removed.set()


@pytest.fixture
def due(sbx_home, tmp_path, monkeypatch):
    """A manager on the SlowListing backend and one sandbox past its deadline."""
    StubAdapter.reset()
    real_load = registry.load_class
    monkeypatch.setattr(registry, "load_class",
                        lambda name: SlowListing if name == "stub" else real_load(name))
    path = tmp_path / "p.yaml"
    path.write_text("backend: stub\nttl: {default: 10m, max: 1h}\n")
    clock = FrozenClock()

    def manager(adapter: SlowListing) -> Manager:
        return Manager(Database(f"sqlite:///{sbx_home / 'sbx.db'}"), clock, actor="t",
                       install_id=INSTALL, adapters={"stub": adapter})

    maker = manager(SlowListing())
    row = asyncio.run(maker.create(ProfileLoader().load_file(path)))
    asyncio.run(maker.close())
    clock.advance(timedelta(minutes=11))
    yield manager, clock, row
    StubAdapter.reset()


def reaper_on(mgr: Manager, adapter: SlowListing, clock) -> Reaper:
    reaper = Reaper(install_id=INSTALL, clock=clock,
                    read_rows=lambda: (mgr.list(), mgr.rows_by_ids),
                    make_manager=lambda _adapters: mgr,
                    warn_before=timedelta(minutes=5), grace=timedelta(seconds=60))
    reaper.adapters["stub"] = adapter
    for name in registry.names():
        if name != "stub":
            reaper.adapters[name] = NothingHere()
    return reaper


def test_due_sandboxes_are_removed_before_the_artifact_listing_answers(due):
    manager, clock, row = due
    adapter = SlowListing()
    mgr = manager(adapter)
    try:
        # the listing answers only after a removal: a cycle that waited for it never ends
        report = asyncio.run(asyncio.wait_for(reaper_on(mgr, adapter, clock).cycle(), 60))
        assert report.destroyed == [row["id"]]
        assert mgr.resolve(row["id"])["state"] == "destroyed"
        assert adapter.order[:3] == ["listing asked", "removed", "listing answered"]
        # and the checkpoints' part, which came later, was done in the same cycle
        assert {"checkpoint": "ck-orphan", "action": "orphan artifact removed"}.items() <= \
            next(r for r in report.reconciled if r.get("checkpoint") == "ck-orphan").items()
        assert adapter.artifacts == []
    finally:
        asyncio.run(mgr.close())


def test_a_cycle_that_ends_before_the_listing_answers_leaves_no_listing_behind(due):
    manager, clock, row = due
    adapter = SlowListing(answer=False)
    mgr = manager(adapter)

    async def cycle_past_its_limit() -> None:
        cycle = asyncio.ensure_future(reaper_on(mgr, adapter, clock).cycle())
        await asyncio.wait_for(adapter.removed.wait(), 60)
        cycle.cancel()  # the reap's timeout, say, while the listing is still asked
        with pytest.raises(asyncio.CancelledError):
            await cycle
        # nothing of the cycle goes on without it
        assert adapter.listing_cancelled
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    try:
        asyncio.run(cycle_past_its_limit())
        assert mgr.resolve(row["id"])["state"] == "destroyed"
        assert adapter.artifacts == [ORPHAN]  # left for the next cycle
    finally:
        asyncio.run(mgr.close())


def test_checkpoints_that_cannot_be_read_leave_every_due_sandbox_as_it_was(due):
    manager, clock, row = due
    adapter = SlowListing()
    mgr = manager(adapter)

    def unreadable():
        raise OSError("disk I/O error")

    reaper = reaper_on(mgr, adapter, clock)
    reaper.read_checkpoints = unreadable
    try:
        with pytest.raises(OSError, match="disk I/O error"):
            asyncio.run(asyncio.wait_for(reaper.cycle(), 60))
        assert mgr.resolve(row["id"])["state"] == "running"
        assert ("destroy", row["backend_ref"]) not in StubAdapter.calls
        assert adapter.order == []  # nothing was asked of the backend either
    finally:
        asyncio.run(mgr.close())
