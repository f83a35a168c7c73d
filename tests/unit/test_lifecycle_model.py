"""The sandbox lifecycle against a model: a hypothesis RuleBasedStateMachine drives the real
Manager and the real Reaper on the stub backend (a TEST DOUBLE), with a FrozenClock and a real
SQLite file, and checks after every step that the database, the backend and the event log
agree with a small independent model of deadlines, idle limits and states.

Pause / resume are not modelled: the stub does not declare Capability.PAUSE and the Manager has
no pause operation yet. When both exist, add `pause` / `resume` rules (paused sandboxes keep
their deadline and are reaped like running ones) and let the object-exists invariant accept
`paused`.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    precondition,
    rule,
)
from support import NothingHere

from sandboxer.adapters import registry
from sandboxer.adapters.base import AdapterError
from sandboxer.adapters.stub import StubAdapter
from sandboxer.core.lifecycle.manager import EVENTS, SANDBOXES, Manager
from sandboxer.core.reconcile.reaper import Reaper
from sandboxer.core.rules.clock import FrozenClock, from_iso, to_iso
from sandboxer.core.rules.errors import BadInput, Conflict
from sandboxer.core.rules.profiles import Profile
from sandboxer.core.rules.ttl import effective_deadline
from sandboxer.core.store.db import Database

INSTALL = "inst-lifecycle-model"
DEFAULT_TTL = timedelta(minutes=10)
MAX_TTL = timedelta(hours=1)
IDLE = timedelta(minutes=20)
WARN_BEFORE = timedelta(minutes=5)
GRACE = timedelta(seconds=60)
LEASE_TTL = timedelta(minutes=2)
PROFILE = Profile.model_validate({
    "name": "model", "backend": "stub",
    "ttl": {"default": "10m", "max": "1h", "idle": "20m"},
})


@dataclass
class Model:
    """What the model believes about one sandbox; computed without sandboxer.core.rules.ttl."""

    ref: str
    deadline: datetime
    hard: datetime
    last_activity: datetime
    state: str = "running"
    gone: bool = False  # the backend object vanished and no reconcile has run since
    was_lost: bool = False  # reconcile recorded it lost (sandbox.lost written)
    warned: datetime | None = None  # the effective deadline sandbox.expiring was sent for
    ended_reason: str | None = None
    ended_at: datetime | None = None

    def effective(self) -> datetime:
        return min(self.deadline, self.last_activity + IDLE)

    def reason(self, now: datetime) -> str | None:
        idle = self.last_activity + IDLE
        if idle <= now and idle < self.deadline:
            return "idle"
        if self.deadline <= now:
            return "max-ttl" if self.deadline >= self.hard else "ttl"
        return None


_TEMPLATE: dict[str, Path] = {}


def _migrated_template() -> Path:
    """One migrated, checkpointed database per session, copied for each example (fast)."""
    if "db" not in _TEMPLATE:
        folder = Path(tempfile.mkdtemp(prefix="sbx-model-template-"))
        atexit.register(shutil.rmtree, folder, True)
        db = Database(f"sqlite:///{folder / 'sbx.db'}")
        db.migrate()
        with db.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        db.dispose()
        _TEMPLATE["db"] = folder / "sbx.db"
    return _TEMPLATE["db"]


class LifecycleMachine(RuleBasedStateMachine):
    sandboxes = Bundle("sandboxes")

    def __init__(self) -> None:
        super().__init__()
        StubAdapter.reset()
        self.tmp = Path(tempfile.mkdtemp(prefix="sbx-model-"))
        shutil.copy(_migrated_template(), self.tmp / "sbx.db")
        self.clock = FrozenClock()
        # install_id, actor and lease given explicitly: nothing read from SBX_HOME / env
        url = f"sqlite:///{self.tmp / 'sbx.db'}"
        self.mgr = Manager(Database(url), self.clock,
                           actor="model", install_id=INSTALL, lease_ttl=LEASE_TTL)
        # a second process's Manager on the same database (its own lease owner)
        self.mgr2 = Manager(Database(url), self.clock,
                            actor="model-2", install_id=INSTALL, lease_ttl=LEASE_TTL)
        self.model: dict[str, Model] = {}
        self.seen_deadline: dict[str, str] = {}

    def teardown(self) -> None:
        try:
            asyncio.run(self.mgr.close())
            asyncio.run(self.mgr2.close())
        finally:
            StubAdapter.reset()
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- helpers --------------------------------------------------------------------------

    def now(self) -> datetime:
        return self.clock.now()

    def reaper(self, *, reap: bool = True) -> Reaper:
        """Like sandboxer.core.reconcile.reaper.default_reaper, on this test's Manager, database and clock. The
        model's installation has nothing on the other registered backends: they are stood in
        for by an empty one, so the test needs no engine and stays fast."""
        mgr = self.mgr
        reaper = Reaper(install_id=INSTALL, clock=self.clock,
                        read_rows=lambda: (mgr.list(), mgr.rows_by_ids),
                        make_manager=lambda _adapters: mgr,
                        warn_before=WARN_BEFORE, grace=GRACE, reap=reap)
        for name in registry.names():
            if name != "stub":
                reaper.adapters[name] = NothingHere()
        return reaper

    def table(self, table) -> list[dict]:
        with self.mgr.db.read() as conn:
            return [dict(r) for r in conn.execute(sa.select(table)).mappings()]

    def snapshot(self) -> tuple[list[dict], list[dict], dict]:
        return self.table(SANDBOXES), self.table(EVENTS), dict(StubAdapter.objects)

    # -- rules ----------------------------------------------------------------------------

    # ttl: the profile default, exactly the maximum (deadline == hard deadline), or any, up to
    # 10 minutes over the maximum (refused)
    @rule(target=sandboxes,
          ttl_s=st.one_of(st.none(), st.just(3600), st.integers(1, 70 * 60)))
    def create(self, ttl_s):
        ttl = None if ttl_s is None else timedelta(seconds=ttl_s)
        if ttl is not None and ttl > MAX_TTL:
            before = self.snapshot()
            with pytest.raises(BadInput, match="max 1h"):
                asyncio.run(self.mgr.create(PROFILE, ttl=ttl))
            assert self.snapshot() == before  # refused before anything was written
            return multiple()
        now = self.now()
        row = asyncio.run(self.mgr.create(PROFILE, ttl=ttl))
        assert row["state"] == "running"
        self.model[row["id"]] = Model(ref=row["backend_ref"], deadline=now + (ttl or DEFAULT_TTL),
                                      hard=now + MAX_TTL, last_activity=now)
        return row["id"]

    @rule(sid=sandboxes, by_s=st.one_of(st.integers(1, 600), st.integers(1, 2 * 3600)))
    def extend(self, sid, by_s):
        m, by = self.model[sid], timedelta(seconds=by_s)
        if m.state != "running":
            with pytest.raises(Conflict, match="cannot extend"):
                asyncio.run(self.mgr.extend(sid, by))
            return
        row, capped = asyncio.run(self.mgr.extend(sid, by))
        wanted = m.deadline + by
        assert capped == (wanted > m.hard)
        m.deadline = min(wanted, m.hard)
        m.last_activity = self.now()  # asking for more time is activity
        assert row["deadline"] == to_iso(m.deadline)

    @rule(sid=sandboxes)
    def touch(self, sid):
        m = self.model[sid]
        if m.state != "running":
            with pytest.raises(Conflict, match="cannot touch"):
                self.mgr.touch(sid)
            return
        self.mgr.touch(sid)
        m.last_activity = self.now()

    @rule(sid=sandboxes)
    def exec(self, sid):
        m = self.model[sid]
        if m.state != "running":
            with pytest.raises(Conflict, match="cannot exec"):
                asyncio.run(self.mgr.exec(sid, ["echo", "hi"]))
            return
        if m.gone:  # the backend says so; sbx does not learn it from a failed exec
            with pytest.raises(AdapterError):
                asyncio.run(self.mgr.exec(sid, ["echo", "hi"]))
            m.last_activity = self.now()  # activity is recorded when a command starts
            return
        result = asyncio.run(self.mgr.exec(sid, ["echo", "hi"]))
        assert (result.exit_code, result.stdout) == (0, b"hi\n")
        m.last_activity = self.now()

    @rule(sid=sandboxes)
    def destroy(self, sid):
        m = self.model[sid]
        row, done_now = asyncio.run(self.mgr.destroy(sid))
        assert row["state"] == "destroyed"
        assert done_now == (m.state != "destroyed")
        if done_now:
            m.state, m.gone, m.ended_reason, m.ended_at = "destroyed", False, "manual", self.now()

    def expected_cycle(self, now: datetime) -> tuple[dict[str, str], set[str], set[str]]:
        """What one reap cycle at `now` must do: (due -> reason, found lost, warned)."""
        due = {sid: m.reason(now) for sid, m in self.model.items()
               if m.state in ("running", "lost") and m.reason(now)}
        found_lost = {sid for sid, m in self.model.items() if m.gone}
        warn = {sid for sid, m in self.model.items()
                if m.state == "running" and not m.gone and sid not in due
                and m.effective() - WARN_BEFORE <= now < m.effective()
                and m.warned != m.effective()}
        return due, found_lost, warn

    def record_cycle(self, now: datetime, due: dict[str, str], found_lost: set[str],
                     warn: set[str]) -> None:
        for sid in found_lost:
            m = self.model[sid]
            m.state, m.gone, m.was_lost, m.ended_at = "lost", False, True, now
        for sid, reason in due.items():
            m = self.model[sid]
            m.state, m.ended_reason, m.ended_at = "destroyed", reason, now
        for sid in warn:
            self.model[sid].warned = self.model[sid].effective()
        # after a completed reap, nothing that is on the clock is past its effective deadline
        for row in self.mgr.list():
            if row["state"] in ("running", "paused", "lost"):
                assert effective_deadline(row) > now, row["id"]

    @rule()
    def reap(self):
        now = self.now()
        due, found_lost, warn = self.expected_cycle(now)

        report = asyncio.run(self.reaper().cycle())

        assert report.failed == [] and report.skipped == [] and report.orphans == []
        assert sorted(report.destroyed) == sorted(due)
        assert sorted(r["id"] for r in report.reconciled) == sorted(found_lost)
        assert all((r["action"], r["state"]) == ("lose", "lost") for r in report.reconciled)
        assert sorted(report.warned) == sorted(warn)
        self.record_cycle(now, due, found_lost, warn)

    @rule(sid=sandboxes, extend=st.booleans(), by_s=st.integers(1, 3600),
          seconds=st.integers(0, 40 * 60))
    def extend_or_touch_races_reap(self, sid, extend, by_s, seconds):
        """The reaper plans from a read; the user extends (or touches) before it applies: the
        re-check inside the destroy transaction must keep a sandbox no longer due."""
        self.advance(seconds)
        now = self.now()
        stale = self.mgr.list()
        planned, found_lost, planned_warn = self.expected_cycle(now)
        if extend:
            self.extend(sid, by_s)
        else:
            self.touch(sid)
        due, found_lost_after, warn = self.expected_cycle(now)
        assert set(due) <= set(planned) and found_lost_after == found_lost
        reaper = self.reaper()
        reaper.read_rows = lambda: (stale, self.mgr.rows_by_ids)

        report = asyncio.run(reaper.cycle())

        assert report.failed == [] and report.orphans == []
        assert sorted(report.destroyed) == sorted(due)
        assert sorted(s["id"] for s in report.skipped) == sorted(set(planned) - set(due))
        assert all(s["error"] == "no longer due" for s in report.skipped)
        assert sorted(r["id"] for r in report.reconciled) == sorted(found_lost)
        assert sorted(report.warned) == sorted(planned_warn & warn)
        # a warning planned from the stale read but no longer due is simply not written
        self.record_cycle(now, due, found_lost, planned_warn & warn)

    @rule(seconds=st.integers(0, 40 * 60))
    def two_reapers_at_once(self, seconds):
        """Two reapers (two Managers, two lease owners, one database) in one event loop:
        together they do each action exactly once, and neither fails."""
        self.advance(seconds)
        now = self.now()
        due, found_lost, warn = self.expected_cycle(now)

        async def both():
            other = self.reaper()
            other.make_manager = lambda _adapters: self.mgr2
            return await asyncio.gather(self.reaper().cycle(), other.cycle())

        first, second = asyncio.run(both())

        for report in (first, second):
            assert report.failed == [] and report.orphans == []
            assert all(s["id"] in set(due) | found_lost | warn for s in report.skipped)
        destroyed = first.destroyed + second.destroyed
        assert sorted(destroyed) == sorted(due)  # each exactly once
        reconciled = [r["id"] for r in first.reconciled + second.reconciled]
        assert sorted(reconciled) == sorted(found_lost)
        warned = first.warned + second.warned
        assert sorted(warned) == sorted(warn)
        self.record_cycle(now, due, found_lost, warn)

    @rule(sid=sandboxes)
    def lose(self, sid):
        """Removed out of band, then one reconcile (no reap) notices it; on a sandbox that is
        not running this is a no-op and the reconcile must change nothing."""
        m = self.model[sid]
        StubAdapter.lose(m.ref)
        if m.state == "running":
            m.gone = True
        # the reconcile also notices any earlier unnoticed removal
        expect = sorted(s for s, other in self.model.items() if other.gone)
        report = asyncio.run(self.reaper(reap=False).cycle())
        assert report.failed == [] and report.skipped == [] and report.destroyed == []
        assert report.orphans == [] and report.warned == []
        assert sorted(r["id"] for r in report.reconciled) == expect
        assert all((r["action"], r["state"]) == ("lose", "lost") for r in report.reconciled)
        for lost in expect:
            m = self.model[lost]
            m.state, m.gone, m.was_lost, m.ended_at = "lost", False, True, self.now()
        again = asyncio.run(self.reaper(reap=False).cycle())
        assert again.as_json() == {"destroyed": [], "reasons": {}, "failed": [], "orphans": [], "skipped": [],
                                   "reconciled": [], "warned": []}

    @precondition(lambda self: any(m.state == "running" and not m.gone
                                   for m in self.model.values()))
    @rule(data=st.data())
    def lose_unnoticed(self, data):
        """Removed out of band with no reconcile after it: the next reap must notice it (and
        end it in the same cycle when it is due)."""
        sid = data.draw(st.sampled_from(sorted(
            s for s, m in self.model.items() if m.state == "running" and not m.gone)))
        StubAdapter.lose(self.model[sid].ref)
        self.model[sid].gone = True

    @rule(seconds=st.one_of(st.integers(0, 5 * 60), st.integers(0, 40 * 60)))
    def advance(self, seconds):
        self.clock.advance(timedelta(seconds=seconds))

    @rule(seconds=st.integers(0, 40 * 60))
    def cron(self, seconds):
        """Time passes, then the reaper runs: what `* * * * * sbx reap` does."""
        self.advance(seconds)
        self.reap()

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def database_matches_the_model(self):
        rows = {r["id"]: r for r in self.table(SANDBOXES)}
        assert set(rows) == set(self.model)
        for sid, m in self.model.items():
            row = rows[sid]
            assert row["state"] == m.state, sid
            assert row["install_id"] == INSTALL
            assert row["deadline"] == to_iso(m.deadline), sid
            assert row["hard_deadline"] == to_iso(m.hard), sid
            assert row["last_activity_at"] == to_iso(m.last_activity), sid
            assert row["idle_timeout_s"] == IDLE.total_seconds()
            assert row["warned_deadline"] == to_iso(m.warned), sid
            assert row["lease_owner"] is None and row["lease_expires_at"] is None
            assert row["ended_at"] == to_iso(m.ended_at), sid
            assert row["error"] is None

    @invariant()
    def deadline_never_decreases_and_never_passes_the_hard_deadline(self):
        for row in self.table(SANDBOXES):
            assert row["deadline"] <= row["hard_deadline"], row["id"]
            before = self.seen_deadline.get(row["id"])
            assert before is None or row["deadline"] >= before, row["id"]
            self.seen_deadline[row["id"]] = row["deadline"]

    @invariant()
    def a_backend_object_exists_iff_the_sandbox_is_running(self):
        # (or paused, once pause exists); `gone` marks an out-of-band removal not yet noticed
        expected = {m.ref for m in self.model.values() if m.state == "running" and not m.gone}
        assert set(StubAdapter.objects) == expected

    @invariant()
    def the_event_log_tells_the_same_story(self):
        events = self.table(EVENTS)
        report = self.mgr.verify_events()
        assert report.intact, report.problem
        assert report.checked == len(events)
        per = Counter((e["sandbox_id"], e["type"]) for e in events)
        rows = {r["id"]: r for r in self.table(SANDBOXES)}
        for sid, m in self.model.items():
            assert per[(sid, "sandbox.creating")] == per[(sid, "sandbox.created")] == 1
            assert per[(sid, "sandbox.lost")] == (1 if m.was_lost else 0), sid
            ended = 1 if m.state == "destroyed" else 0
            assert per[(sid, "sandbox.destroying")] == per[(sid, "sandbox.destroyed")] == ended
            if m.state != "destroyed":
                continue
            (destroying,) = [e for e in events
                             if e["sandbox_id"] == sid and e["type"] == "sandbox.destroying"]
            assert destroying["reason"] == m.ended_reason, sid
            if destroying["reason"] != "manual":
                # never before its deadline: deadline and activity are frozen once destroyed
                assert from_iso(destroying["time"]) >= effective_deadline(rows[sid]), sid
        warned = [(e["sandbox_id"], json.loads(e["payload_json"])["deadline"])
                  for e in events if e["type"] == "sandbox.expiring"]
        assert len(warned) == len(set(warned))  # once per deadline


LifecycleMachine.TestCase.settings = settings(
    max_examples=50, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestLifecycle = LifecycleMachine.TestCase


# -- deterministic examples of the same rules --------------------------------------------------


@pytest.fixture
def machine():
    m = LifecycleMachine()
    yield m
    m.teardown()


def check(machine: LifecycleMachine) -> None:
    machine.database_matches_the_model()
    machine.deadline_never_decreases_and_never_passes_the_hard_deadline()
    machine.a_backend_object_exists_iff_the_sandbox_is_running()
    machine.the_event_log_tells_the_same_story()


def test_an_expired_sandbox_gone_out_of_band_is_ended_by_one_reap(machine):
    sid = machine.create(ttl_s=600)
    machine.model[sid].gone = True
    StubAdapter.lose(machine.model[sid].ref)
    machine.advance(seconds=601)
    machine.reap()  # asserts: reconciled as lost, and destroyed (ttl) in the same cycle
    assert machine.mgr.resolve(sid)["state"] == "destroyed"
    check(machine)


def test_a_lost_sandbox_stays_lost_until_its_deadline_then_is_destroyed(machine):
    sid = machine.create(ttl_s=600)
    machine.lose(sid)
    machine.advance(seconds=300)
    machine.reap()
    assert machine.mgr.resolve(sid)["state"] == "lost"
    machine.advance(seconds=300)
    machine.reap()
    assert machine.mgr.resolve(sid)["state"] == "destroyed"
    assert machine.model[sid].ended_reason == "ttl"
    check(machine)


def test_idle_expiry_is_reaped_with_reason_idle_and_touch_postpones_it(machine):
    a = machine.create(ttl_s=3600)
    b = machine.create(ttl_s=3600)
    machine.advance(seconds=19 * 60)
    machine.touch(b)
    machine.advance(seconds=60)
    machine.reap()
    assert machine.model[a].ended_reason == "idle" and machine.model[b].state == "running"
    check(machine)


def test_a_sandbox_kept_busy_until_its_hard_deadline_ends_with_max_ttl(machine):
    sid = machine.create(ttl_s=600)
    machine.extend(sid, 2 * 3600)  # capped at the hard deadline
    for _ in range(3):
        machine.advance(seconds=19 * 60)
        machine.exec(sid)
    machine.advance(seconds=3 * 60 - 1)
    machine.reap()
    assert machine.model[sid].state == "running"
    machine.advance(seconds=1)
    machine.reap()
    assert machine.model[sid].ended_reason == "max-ttl"
    check(machine)


def test_an_extend_after_the_reapers_read_keeps_the_sandbox(machine):
    sid = machine.create(ttl_s=600)
    machine.extend_or_touch_races_reap(sid, extend=True, by_s=600, seconds=601)
    assert machine.model[sid].state == "running"
    check(machine)


def test_manager_extend_never_moves_a_deadline_earlier(machine):
    """docs/reliability.md, guarantee 9: extend never shortens. A zero or negative
    duration through the API must leave the deadline (or be refused), never move it earlier."""
    sid = machine.create(ttl_s=600)
    before = machine.mgr.resolve(sid)["deadline"]
    try:
        row, _ = asyncio.run(machine.mgr.extend(sid, timedelta(minutes=-5)))
    except BadInput:
        row = machine.mgr.resolve(sid)
    assert row["deadline"] >= before
