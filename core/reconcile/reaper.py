"""Reconcile and reap: level-triggered, like a Kubernetes controller.

A cycle reads the database, lists each backend by this installation's `sbx.install` label,
and *plans* (pure functions, below). Only when the plan has actions does it load the
Manager, and every action re-checks its preconditions inside the transaction that records
it, so a plan made from a stale read can never destroy a sandbox that was extended, or act
twice when several reapers run at once. Nothing is planned from a database that cannot be
read.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from sandboxer.adapters import registry
from sandboxer.adapters.base import (
    LABEL_CHECKPOINT,
    LABEL_HARD_DEADLINE,
    LABEL_ID,
    LABEL_INSTALL,
    Adapter,
    BackendObject,
    Capability,
)
from sandboxer.core.observe import telemetry
from sandboxer.core.rules.actions import (  # noqa: F401  (the kinds are the reaper's vocabulary)
    ADOPT,
    CHECKPOINTS,
    DESTROY,
    DESTROY_OBJECT,
    FAIL,
    FILL,
    FINISH_CREATE,
    LOSE,
    ORDER,
    RESTART,
    RETIRE,
    SYNC,
    WARN,
    Action,
)
from sandboxer.core.rules.clock import Clock, from_iso, to_iso
from sandboxer.core.rules.errors import Conflict, DiskFull, Unavailable, classify, one_line
from sandboxer.core.rules.states import REAPABLE, State, dead_holders, leased, runs_setup
from sandboxer.core.rules.threads import ensure_thread_pool
from sandboxer.core.rules.ttl import EXPIRY_REASONS, expiry_reason, warning_due

if TYPE_CHECKING:
    from sandboxer.core.lifecycle.manager import Manager

# States in which a sandbox stays as it is until time or someone moves it (a full look that
# finds only these, with nothing to do, may be noted as settled)
STEADY = frozenset({State.RUNNING, State.PAUSED, State.WARM, State.LOST})


class MarkFile:
    """Where a reaper notes its last full look that found nothing to do (a small JSON file in
    the installation's folder: each installation reconciles its own objects). Written
    whole, by rename; anything unreadable counts as no note."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, Any] | None:
        try:
            mark = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return mark if isinstance(mark, dict) else None

    def save(self, mark: dict[str, Any]) -> None:
        part = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            part.write_text(json.dumps(mark))
            os.replace(part, self.path)
        except OSError:
            part.unlink(missing_ok=True)  # no note: the next cycle looks in full

    def clear(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass


class _NotAsked(Exception):
    """A backend listed but its instance not asked (plan's looks run at once): the cycle
    fails with `error`, as it did when each backend was looked at alone."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _young(obj: BackendObject, now: datetime, grace: timedelta) -> bool:
    return obj.created_at is not None and now - obj.created_at < grace


def _object_state(obj: BackendObject) -> str:
    if obj.status == "paused":
        return State.PAUSED
    return State.RUNNING if obj.running else "stopped"


def plan_reconcile(
    backend: str,
    rows: Sequence[Mapping[str, Any]],
    objects: Sequence[BackendObject],
    now: datetime,
    grace: timedelta,
    *,
    rows_outside: Mapping[str, Mapping[str, Any]] | None = None,
    dead: Collection[str] = (),
    restarts_seen: Mapping[str, str] | None = None,
) -> list[Action]:
    """Diff one backend's objects with this installation's rows of that backend.

    `rows` is the snapshot of rows that are not destroyed; `rows_outside` the rows, read
    afterwards, of objects the snapshot did not have: destroyed ones, or ones created since.
    Rows held under a live lease are some process's work in progress; `dead` names lease
    owners known dead (sandboxer.core.rules.states.dead_holders), whose leases count as lapsed, and whose
    interrupted creates need not wait out the grace. `restarts_seen`: for a sandbox whose
    object was started again, the start time its last `sandbox.restarted` event recorded.
    A `failed` row is settled once (destroyed, reason failed, the row kept): at once when
    its create left an object, else once the grace has passed since it failed.
    """
    now_iso = to_iso(now)
    rows_outside = rows_outside or {}
    restarts_seen = restarts_seen or {}
    from sandboxer.core.pools import is_member

    by_id = {r["id"]: r for r in rows if r["backend"] == backend}
    actions: list[Action] = []
    seen: set[str] = set()
    for obj in objects:
        sid = obj.labels.get(LABEL_ID)
        row = by_id.get(sid) if sid else None
        if row is None:
            later = rows_outside.get(sid) if sid else None
            if _young(obj, now, grace) or (later and later["state"] != State.DESTROYED):
                continue  # being made, or made after the snapshot: not ours to judge now
            hard = obj.labels.get(LABEL_HARD_DEADLINE)
            if sid and later is None and hard and _parse(hard) and _parse(hard) > now:
                actions.append(Action(ADOPT, backend, sid, obj.ref, "orphan", obj=obj))
            else:
                actions.append(Action(DESTROY_OBJECT, backend, sid, obj.ref, "orphan"))
            continue
        seen.add(row["id"])
        if leased(row, now_iso, dead):
            continue
        state, actual = row["state"], _object_state(obj)
        if state == State.CREATING and (is_member(row) or runs_setup(row)):
            # its maker died: its setup may not have run (or finished), so it is never made
            # running or warm: failed, and its object removed in the same step
            actions.append(Action(FAIL, backend, row["id"], obj.ref, reason="failed",
                                  target=State.FAILED, expect=state))
        elif state == State.CREATING:
            actions.append(Action(FINISH_CREATE, backend, row["id"], obj.ref, obj=obj))
        elif state == State.DESTROYING:
            actions.append(Action(DESTROY, backend, row["id"], obj.ref))
        elif state == State.FAILED:
            actions.append(Action(DESTROY, backend, row["id"], obj.ref, "failed"))
        elif (state in (State.RUNNING, State.PAUSED, State.WARM) and obj.running
              and obj.restarted_at and to_iso(obj.restarted_at) != restarts_seen.get(row["id"])):
            # back after a restart; a paused one is paused again
            actions.append(Action(RESTART, backend, row["id"], obj.ref, "restarted",
                                  target=state, expect=state, obj=obj))
        elif state in (State.RUNNING, State.PAUSED) and actual != state:
            stopped = actual == "stopped"  # not restarted by the backend: lost, and why
            actions.append(Action(LOSE if stopped else SYNC, backend, row["id"], obj.ref,
                                  "stopped" if stopped else None,
                                  target=State.LOST if stopped else actual, expect=state))
        elif state == State.WARM and actual != State.RUNNING:  # stopped or paused behind our
            actions.append(Action(LOSE, backend, row["id"], obj.ref, "stopped",  # back: no use
                                  target=State.LOST, expect=state))
    for row in by_id.values():
        if row["id"] in seen or leased(row, now_iso, dead):
            continue
        state = row["state"]
        dead_maker = row["lease_owner"] in dead  # it cannot still be making the object
        if state == State.CREATING and (dead_maker or now - from_iso(row["created_at"]) >= grace):
            actions.append(Action(FAIL, backend, row["id"], reason="failed", target=State.FAILED,
                                  expect=state))
        elif state == State.DESTROYING:
            actions.append(Action(DESTROY, backend, row["id"]))
        elif state == State.FAILED and now - _failed_at(row) >= grace:
            # settled: destroyed, reason failed, the row kept (ls --all); the grace lets an
            # object the backend was still making when the create gave up show up first
            actions.append(Action(DESTROY, backend, row["id"], reason="failed"))
        elif state in (State.RUNNING, State.PAUSED, State.WARM):
            actions.append(Action(LOSE, backend, row["id"], reason="gone", target=State.LOST,
                                  expect=state))
    return actions


def _failed_at(row: Mapping[str, Any]) -> datetime:
    return from_iso(row.get("ended_at") or row["created_at"])


def plan_reap(rows: Iterable[Mapping[str, Any]], now: datetime,
              warn_before: timedelta, dead: Collection[str] = ()) -> list[Action]:
    """Expired sandboxes to destroy, and expiry warnings that are due (`dead`: as for
    plan_reconcile)."""
    now_iso = to_iso(now)
    actions = []
    for row in rows:
        if leased(row, now_iso, dead) or row["state"] not in REAPABLE:
            continue
        reason = expiry_reason(row, now)
        if reason:
            actions.append(Action(DESTROY, row["backend"], row["id"], row["backend_ref"], reason,
                                  pool=row.get("pool") if reason == "max-age" else None))
        elif warning_due(row, now, warn_before):
            actions.append(Action(WARN, row["backend"], row["id"], reason="ttl"))
    return actions


def plan_orphans(backend: str, objects: Sequence[BackendObject], now: datetime) -> list[Action]:
    """Objects of this installation past their `sbx.hard-deadline`: no database needed."""
    actions = []
    for obj in objects:
        hard = _parse(obj.labels.get(LABEL_HARD_DEADLINE))
        if hard is not None and hard <= now:
            actions.append(Action(DESTROY_OBJECT, backend, obj.labels.get(LABEL_ID), obj.ref,
                                  "max-ttl"))
    return actions


def _parse(text: str | None) -> datetime | None:
    try:
        return from_iso(text) if text else None
    except ValueError:
        return None


def merge(reconcile: list[Action], reap: list[Action]) -> list[Action]:
    """One action per sandbox, reconcile first (it knows the backend's truth), in ORDER.
    The one exception: a sandbox whose record reconcile repairs (lost, paused, an interrupted
    create completed) is also reaped when it is due, so one cycle ends what is past its
    deadline."""
    chosen: dict[tuple[str | None, str | None], Action] = {}
    extra: list[Action] = []
    for action in [*reconcile, *reap]:
        key = (action.sandbox_id, None) if action.sandbox_id else (None, action.ref)
        first = chosen.get(key)
        if first is None:
            chosen[key] = action
        elif first.kind not in (DESTROY, DESTROY_OBJECT) and action.kind == DESTROY:
            extra.append(action)  # destroy_if re-checks that it is still due
    return sorted([*chosen.values(), *extra], key=lambda a: ORDER.index(a.kind))


# -- running a cycle -----------------------------------------------------------------------


@dataclass
class Report:
    destroyed: list[str] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    reconciled: list[dict[str, Any]] = field(default_factory=list)
    warned: list[str] = field(default_factory=list)
    planned: list[dict[str, Any]] = field(default_factory=list)
    pools: list[dict[str, Any]] = field(default_factory=list)  # members warmed or retired
    reasons: dict[str, str] = field(default_factory=dict)  # each destroyed id: why (ttl, idle...)

    def as_json(self) -> dict[str, Any]:
        return {"destroyed": self.destroyed, "reasons": self.reasons, "failed": self.failed,
                "orphans": self.orphans,
                "skipped": self.skipped, "reconciled": self.reconciled, "warned": self.warned,
                **({"planned": self.planned} if self.planned else {}),
                **({"pools": self.pools} if self.pools else {})}


RowSource = Callable[[], tuple[list[dict[str, Any]], Callable[[Iterable[str]], dict[str, dict]]]]
# (pool specs by name, their profiles) given the pools that have members (sandboxer.core.pools)
PoolSource = Callable[[set[str]], tuple[dict[str, Any], dict[str, Any]]]


class Plan(NamedTuple):
    """A cycle's actions. With other work to do, the checkpoints' part may still be on its
    way (`checkpoints`: their backends' artifact listing, dockerd's slowest call; figures in
    docs/design.md): the destroys do not wait for it, as CHECKPOINTS run last (ORDER), and
    those of an `unreachable` backend are left out."""

    actions: list[Action]
    checkpoints: asyncio.Future[list[Action]] | None = None
    unreachable: frozenset[str] = frozenset()


class Reaper:
    """One reconcile-and-reap cycle at a time; see the module docstring."""

    def __init__(
        self,
        *,
        install_id: str,
        clock: Clock,
        read_rows: RowSource,
        read_checkpoints: Callable[[], list[dict[str, Any]]] = list,
        make_manager: Callable[[dict[str, Adapter]], Manager],
        warn_before: timedelta,
        grace: timedelta,
        reap: bool = True,
        orphans: bool = False,
        dry_run: bool = False,
        concurrency: int = 16,
        make_room: Callable[[], bool] = lambda: False,
        read_restarts: Callable[[list[str]], dict[str, str]] | None = None,
        read_pools: PoolSource | None = None,
        read_due_volumes: Callable[[str], int] | None = None,
        read_due: Callable[[str], list[dict[str, Any]]] | None = None,
        read_fingerprint: Callable[[], Any] | None = None,
        marks: MarkFile | None = None,
        reconcile_every: timedelta = timedelta(0),
    ) -> None:
        self.install_id = install_id
        self.clock = clock
        self.read_rows = read_rows
        self.read_checkpoints = read_checkpoints
        self.make_manager = make_manager
        self.warn_before = warn_before
        self.grace = grace
        self.reap = reap
        self.orphans = orphans
        self.dry_run = dry_run
        self.concurrency = concurrency
        self.make_room = make_room  # on a nearly full disk: release the reserve (sandboxer.core.rules.reserve)
        self.read_restarts = read_restarts  # None: through the Manager
        self.read_pools = read_pools  # None: pools are not kept by this reaper
        # how many volumes are past their TTL at a time (None: volumes are not reaped here)
        self.read_due_volumes = read_due_volumes
        # a cycle with nothing changed since the last full look (see _plan_unchanged): the
        # rows due by a time, the database's change fingerprint, where that look is noted
        self.read_due = read_due
        self.read_fingerprint = read_fingerprint
        self.marks = marks
        self.reconcile_every = reconcile_every
        self.pool_profiles: dict[str, Any] = {}  # the profiles FILL makes members from
        self.adapters: dict[str, Adapter] = {}
        self._manager: Manager | None = None

    def _adapter(self, backend: str) -> Adapter:
        if backend not in self.adapters:
            self.adapters[backend] = registry.load_class(backend)()
        return self.adapters[backend]

    async def _list(self, backend: str) -> list[BackendObject]:
        return await self._adapter(backend).list({LABEL_INSTALL: self.install_id})

    async def plan(self, report: Report) -> Plan:
        """Read the database (or refuse), list each backend once, and plan."""
        now = self.clock.now()
        if not self.dry_run:
            self.make_room()  # a full disk stops even reads: this cycle may be what frees it
        started, fingerprint = time.time(), None
        if self.marks is not None and self.read_fingerprint is not None:
            try:
                fingerprint = self.read_fingerprint()
            except Exception:
                fingerprint = None  # the full look below says what is wrong
        if fingerprint is not None and self.reap and not self.orphans:
            unchanged = await self._plan_unchanged(report, now, fingerprint)
            if unchanged is not None:
                return Plan(unchanged)
        if self.marks is not None:
            self.marks.clear()  # noted again below only when this look settles everything
        settled = fingerprint is not None
        listed: list[str] = []
        try:
            rows, rows_by_ids = self.read_rows()
        except DiskFull:
            raise
        except Exception as exc:  # never destructive without the database
            raise Unavailable(f"cannot read the database, so nothing was changed: {exc}") from exc
        mine = [r for r in rows if r["install_id"] == self.install_id]
        dead = dead_holders(mine, to_iso(now), self.install_id)
        in_use = {r["backend"] for r in mine}
        live_ids = {r["id"] for r in mine}
        reconcile: list[Action] = []
        orphans: list[Action] = []
        unreachable: set[str] = set()
        unreachable_rows: set[str] = set()
        async def look(backend: str) -> tuple[list[BackendObject], str | None] | None:
            if backend not in in_use and registry.load_class(backend).test_double:
                return None
            asking = asyncio.ensure_future(self._adapter(backend).instance_id())
            try:
                objects = await self._list(backend)
            except BaseException:
                asking.cancel()
                raise
            try:
                return objects, await asking
            except Exception as exc:
                raise _NotAsked(exc) from exc

        checkpoint_rows = self.read_checkpoints()  # before anything is asked of a backend
        names = registry.names()  # every backend looked at at once, then judged in order
        looking = asyncio.gather(*(look(b) for b in names), return_exceptions=True)
        # the checkpoints' artifacts at the same time (an image listing is dockerd's
        # slowest call); those of a backend found unreachable are left out below
        artifacts = asyncio.ensure_future(self._plan_checkpoints(now, checkpoint_rows))
        try:
            looks = await looking
            for backend, looked in zip(names, looks, strict=True):
                if isinstance(looked, _NotAsked):
                    raise looked.error  # as when asked alone: the cycle fails
                if isinstance(looked, BaseException) and not isinstance(looked, Exception):
                    raise looked
                if isinstance(looked, Exception):
                    if backend in in_use:  # its sandboxes cannot be checked: say so, go on
                        unreachable.add(backend)
                        report.failed.append({"id": f"backend:{backend}",
                                              "code": classify(looked)[0],
                                              "error": one_line(looked)})
                    continue  # a backend we have nothing on may well be unavailable
                if looked is None:
                    continue
                listed.append(backend)
                objects, here = looked
                elsewhere = [r for r in mine if r["backend"] == backend and r.get("backend_instance")
                             and r["backend_instance"] != here]
                if elsewhere:  # never judge another engine's sandboxes by this one's listing
                    unreachable_rows.update(r["id"] for r in elsewhere)
                    report.failed.append({
                        "id": f"backend:{backend}", "code": 5,
                        "error": f"{len(elsewhere)} sandbox(es) live on another {backend} engine "
                                 f"than the one this process reaches ({(here or '?')[:20]}); they "
                                 "were not checked: check DOCKER_HOST"})
                unseen = [r for r in mine if r["backend"] == backend and r.get("backend_ref")
                          and r["id"] not in unreachable_rows
                          and not self._adapter(backend).sees(r["backend_ref"])]
                if unseen:  # e.g. a per-profile key not set here: not checked, not lost
                    unreachable_rows.update(r["id"] for r in unseen)
                    report.skipped.append({
                        "id": f"backend:{backend}",
                        "error": f"{len(unseen)} sandbox(es) not checked: this process cannot see "
                                 "them on the backend (their profile's credentials are not set here)"})
                judged = [r for r in mine if r["id"] not in unreachable_rows]
                stray = [o.labels[LABEL_ID] for o in objects
                         if o.labels.get(LABEL_ID) and o.labels[LABEL_ID] not in live_ids]
                found = {o.labels.get(LABEL_ID) for o in objects}
                if stray or None in found or any(
                        r["id"] not in found for r in judged
                        if r["backend"] == backend and r["state"] != State.LOST):
                    settled = False  # an object being made, one left to the grace, one gone
                restarted = [o.labels[LABEL_ID] for o in objects
                             if o.restarted_at and o.labels.get(LABEL_ID) in live_ids]
                reconcile += plan_reconcile(backend, judged, objects, now, self.grace,
                                            rows_outside=rows_by_ids(stray) if stray else {},
                                            dead=dead,
                                            restarts_seen=self._restarts_seen(restarted))
                if self.orphans:
                    orphans += plan_orphans(backend, objects, now)
            reachable = [r for r in mine
                         if r["backend"] not in unreachable and r["id"] not in unreachable_rows]
            if self.reap:
                reachable += await self._fleet_rows(rows, unreachable, now)
            reap = plan_reap(reachable, now, self.warn_before, dead) if self.reap else []
            pools = self._plan_pools(mine, now, dead, unreachable, unreachable_rows, report) \
                if self.reap else []
            # orphan sweeps last: a sandbox the database still knows is handled as a sandbox
            actions = merge(reconcile, [*reap, *pools, *orphans])
            if actions and not self.dry_run and not artifacts.done():
                # its part comes when the cycle reaches it: CHECKPOINTS run last (ORDER)
                return Plan(actions, artifacts, frozenset(unreachable))
            checkpoint_work = [a for a in await artifacts if a.backend not in unreachable]
            actions = merge([*reconcile, *checkpoint_work], [*reap, *pools, *orphans])
            if (settled and not actions and not report.failed and not report.skipped
                    and not self.dry_run and self.reap
                    and all(r["state"] in STEADY and not leased(r, to_iso(now), ())
                            for r in mine)):
                await self._note_unchanged(listed, now, started, fingerprint)
            return Plan(actions)
        except BaseException:
            await _ended(artifacts)
            raise

    async def _note_unchanged(self, listed: list[str], now: datetime, started: float,
                              fingerprint: Any) -> None:
        """After a full look that found nothing to do and nothing in progress: note the
        database's fingerprint and each listed backend's change marker, so the next cycles
        can tell that nothing changed. A backend that cannot tell, or one that changed while
        it was looked at, leaves nothing noted."""
        labels = {LABEL_INSTALL: self.install_id}
        answers = await asyncio.gather(
            *(self._adapter(b).change_marker(labels, started) for b in listed),
            return_exceptions=True)
        markers = {}
        for backend, marker in zip(listed, answers, strict=True):
            if isinstance(marker, BaseException) and not isinstance(marker, Exception):
                raise marker
            if not isinstance(marker, str) or marker.startswith("changed:"):
                return  # an error, a backend that cannot tell, or one that changed
            markers[backend] = marker
        assert self.marks is not None
        self.marks.save({"install": self.install_id, "at": to_iso(now), "since": started,
                         "fingerprint": fingerprint, "markers": markers})

    async def _plan_unchanged(self, report: Report, now: datetime,
                              fingerprint: Any) -> list[Action] | None:
        """The plan of a cycle between full looks, or None when a full look is needed: when
        none is noted, the noted one is older than `reconcile_every`, or the database or a
        backend changed since. Nothing changed, so reconcile would find nothing: only time
        can have made something due, and that is read through indexes of the live rows
        (core/store/inventory.py: due_sandboxes)."""
        assert self.marks is not None and self.read_due is not None
        mark = self.marks.load()
        if (not mark or mark.get("install") != self.install_id
                or mark.get("fingerprint") != fingerprint):
            return None
        try:
            at = from_iso(mark["at"])
        except (KeyError, TypeError, ValueError):
            return None
        if not at <= now < at + self.reconcile_every:
            return None
        labels = {LABEL_INSTALL: self.install_id}
        noted = dict(mark.get("markers") or {})
        try:
            answers = await asyncio.gather(
                *(self._adapter(b).change_marker(labels, mark["since"]) for b in noted),
                return_exceptions=True)
        except Exception:
            return None  # the full look says what is wrong
        for marker, answer in zip(noted.values(), answers, strict=True):
            if isinstance(answer, BaseException) and not isinstance(answer, Exception):
                raise answer
            if answer != marker:  # changed, or an error: the full look says what is wrong
                return None
        rows = self.read_due(to_iso(now + self.warn_before))
        mine = [r for r in rows if r["install_id"] == self.install_id]
        if any(r["state"] not in STEADY for r in mine):
            return None
        dead = dead_holders(mine, to_iso(now), self.install_id)
        due = plan_reap([*mine, *await self._fleet_rows(rows, set(), now)], now,
                        self.warn_before, dead)
        pools = self._plan_pools(mine, now, dead, set(), set(), report)
        return merge(await self._plan_checkpoints(now, self.read_checkpoints(), rows_only=True),
                     [*due, *pools])

    def _plan_pools(self, mine: list[dict[str, Any]], now: datetime, dead: Collection[str],
                    unreachable: set[str], unreachable_rows: set[str],
                    report: Report) -> list[Action]:
        """Fill and retire warm pool members (sandboxer.core.pools.plan_pools). A pool whose profile
        cannot be loaded is reported and left as it is."""
        if self.read_pools is None:
            return []
        from sandboxer.core.pools import is_member, plan_pools

        member_pools = {r["pool"] for r in mine if is_member(r) and r["state"] != State.DESTROYED}
        specs, self.pool_profiles = self.read_pools(member_pools)
        if not specs and not member_pools:
            return []
        for spec in specs.values():
            if spec.error:
                report.skipped.append({"id": f"pool:{spec.name}", "error": "its profile "
                                       f"cannot be loaded, so it was not checked: {spec.error}"})
        return plan_pools(specs, mine, now, install_id=self.install_id, dead=dead,
                          skip_backends=unreachable, skip_rows=unreachable_rows)

    def _restarts_seen(self, ids: list[str]) -> dict[str, str]:
        """The start time each of these sandboxes' last `sandbox.restarted` event recorded."""
        if not ids:
            return {}
        if self.read_restarts is not None:
            return self.read_restarts(ids)
        return self.manager().restarts_seen(ids)

    async def _fleet_rows(self, rows: list[dict[str, Any]], unreachable: set[str],
                          now: datetime) -> list[dict[str, Any]]:
        """Other installations' sandboxes on a shared backend (a cloud account this process
        reaches too): any reaper may end them when they expire. Reconcile stays with their
        own installation, which lists its own objects. Only rows with something due load
        their backend, so a cycle with nothing to do loads none."""
        theirs = [r for r in rows if r["install_id"] != self.install_id
                  and r["state"] in REAPABLE and r["backend"] not in unreachable
                  and (expiry_reason(r, now) or warning_due(r, now, self.warn_before))]
        usable: list[dict[str, Any]] = []
        for backend in {r["backend"] for r in theirs}:
            try:
                if not registry.load_class(backend).shared:
                    continue
                here = await self._adapter(backend).instance_id()
            except Exception:
                continue  # not installed or not reachable here: their own reaper will do it
            usable += [r for r in theirs if r["backend"] == backend
                       and (not r.get("backend_instance") or r["backend_instance"] == here)]
        return usable

    async def _plan_checkpoints(self, now: datetime, rows: list[dict[str, Any]], *,
                                rows_only: bool = False) -> list[Action]:
        """One CHECKPOINTS action per backend with work: an expired or interrupted checkpoint,
        an artifact of ours that no row claims or that nobody holds, or a ready checkpoint
        whose artifact is gone. Nothing to do costs one listing (and a look for the artifacts
        of ready rows the listing does not show). `rows_only`: between full looks, when no
        artifact of ours changed (the backends' change markers), the rows alone say what
        time made due. `rows`: the checkpoints' rows (read_checkpoints)."""
        now_iso, grace_iso = to_iso(now), to_iso(now - self.grace)

        async def has_work(backend: str) -> bool:
            try:
                cls = registry.load_class(backend)
            except Exception:
                return False  # an adapter that cannot load is reported by plan() and doctor
            if cls.test_double or Capability.SNAPSHOT not in cls.capabilities:
                return False
            mine = [r for r in rows if r["backend"] == backend]
            due = any((self.reap and r["expires_at"] and r["expires_at"] <= now_iso) or
                      (r["state"] == "pending" and r["created_at"] <= grace_iso) for r in mine)
            if due or rows_only:
                return due
            try:
                found = await self._adapter(backend).list_artifacts(
                    {LABEL_INSTALL: self.install_id})
            except Exception:
                return False
            known = {r["id"] for r in mine}
            if any(not a.held or a.labels.get(LABEL_CHECKPOINT) not in known for a in found):
                return True
            held = {a.ref for a in found if a.held}
            unlisted = [r["backend_ref"] for r in mine if r["state"] == "ready"
                        and r.get("backend_ref") and r["backend_ref"] not in held]
            if not unlisted:
                return False
            try:
                return bool(await self._adapter(backend).missing_artifacts(unlisted))
            except Exception:
                return False

        names = registry.names()  # every backend's artifacts listed at once
        work = await asyncio.gather(*(has_work(b) for b in names))
        return [Action(CHECKPOINTS, backend, None, ref=f"checkpoints:{backend}")
                for backend, due in zip(names, work, strict=True) if due]

    def manager(self) -> Manager:
        if self._manager is None:
            self._manager = self.make_manager(self.adapters)
        return self._manager

    @telemetry.traced("sbx.reap", lambda self: {"sbx.reap.dry_run": self.dry_run,
                                                "sbx.reap.mode": "reap" if self.reap
                                                else "reconcile"})
    async def cycle(self) -> Report:
        # as many threads as actions run at once (a client's larger pool is kept)
        ensure_thread_pool(asyncio.get_running_loop(), self.concurrency)
        report = Report()
        actions, checkpoints, unreachable = await self.plan(report)
        try:
            if self.dry_run:
                report.planned = [a.describe() for a in actions]
                return report
            if not actions:
                await self._reap_volumes(report)
                return report
            mgr = self.manager()
            gate = asyncio.Semaphore(self.concurrency)

            async def one(action: Action) -> None:
                async with gate:
                    await self._apply(mgr, action, report)

            for kind in ORDER:  # each kind in parallel, kinds in order
                if kind == CHECKPOINTS and checkpoints is not None:
                    try:
                        actions += [a for a in await checkpoints if a.backend not in unreachable]
                    except Exception as exc:  # the rest is done: said in the report, not lost
                        report.failed.append({"id": "checkpoints", "code": classify(exc)[0],
                                              "error": one_line(exc)})
                batch = [a for a in actions if a.kind == kind]
                if batch:
                    await asyncio.gather(*(one(a) for a in batch))
            await self._reap_volumes(report)
            return report
        finally:
            if checkpoints is not None:
                await _ended(checkpoints)

    async def _reap_volumes(self, report: Report) -> None:
        """Volumes past their TTL, after the sandboxes (a sandbox reaped in this cycle lets
        go of its mounts first); one still mounted by a live sandbox is skipped, saying so."""
        if not self.reap or self.read_due_volumes is None:
            return
        from sandboxer.core.rules.clock import to_iso

        if not self.read_due_volumes(to_iso(self.clock.now())):
            return
        from sandboxer.core.lifecycle import volumes

        done = await volumes.reap(self.manager())
        for volume_id in done["removed"]:
            report.reconciled.append({"volume": volume_id, "action": "expired volume removed",
                                      "reason": "ttl"})
        for volume_id in done["skipped"]:
            report.skipped.append({"id": volume_id, "error": "a live sandbox mounts it"})
        for volume_id, message in done["failed"]:
            report.failed.append({"id": volume_id, "code": 1, "error": message})

    async def _apply(self, mgr: Manager, action: Action, report: Report) -> None:
        label = action.sandbox_id or action.ref or "?"
        try:
            if action.kind == DESTROY and action.reason == "idle" and await _runs_a_process(
                    mgr, action.sandbox_id):
                report.skipped.append({"id": label, "error": "a background process runs in "
                                       "it: that is activity, recorded"})
                return
            if action.kind == DESTROY:
                done = await mgr.destroy_if(action.sandbox_id, action.backend,
                                            reason=action.reason)
                if done is None:
                    report.skipped.append({"id": label, "error": "no longer due"})
                elif action.reason == "max-age":
                    report.pools.append({"pool": action.pool, "action": "retired", "id": label,
                                         "reason": action.reason})
                elif action.reason in EXPIRY_REASONS:
                    report.destroyed.append(label)
                    report.reasons[label] = done.get("destroy_reason") or action.reason
                else:
                    report.reconciled.append({**action.describe(), "state": done["state"]})
            elif action.kind == DESTROY_OBJECT:
                if await mgr.destroy_orphan(action.backend, action.ref, action.sandbox_id,
                                            reason=action.reason):
                    report.orphans.append(label)
                else:
                    report.skipped.append({"id": label, "error": "claimed by a sandbox"})
            elif action.kind == CHECKPOINTS:
                from sandboxer.core.lifecycle.checkpoints import Checkpoints

                store = Checkpoints(mgr)
                for change in await store.reconcile(action.backend, self.grace):
                    report.reconciled.append({**action.describe(), **change})
                for ckpt in (await store.prune()) if self.reap else []:
                    report.reconciled.append({**action.describe(), "checkpoint": ckpt,
                                              "action": "expired checkpoint removed"})
            elif action.kind == RETIRE:
                from sandboxer.core.pools import retire

                if await retire(mgr, action.sandbox_id, mgr.adapter(action.backend),
                                reason=action.reason) is None:
                    report.skipped.append({"id": label, "error": "no longer a warm member"})
                else:
                    report.pools.append({"pool": action.pool, "action": "retired", "id": label,
                                         "reason": action.reason})
            elif action.kind == FILL:
                made = await mgr.create(self.pool_profiles[action.pool], pool_member=True)
                report.pools.append({"pool": action.pool, "action": "warmed", "id": made["id"]})
            elif action.kind == WARN:
                if await _runs_a_process(mgr, action.sandbox_id, idle_warning=True):
                    return  # busy: activity recorded, so its idle deadline is not near
                if mgr.warn_expiring(action.sandbox_id, self.warn_before):
                    report.warned.append(label)
            elif action.kind == ADOPT:
                if mgr.adopt(action.backend, action.obj):
                    report.reconciled.append(action.describe())
            elif action.kind == FINISH_CREATE:
                if mgr.finish_interrupted_create(action.sandbox_id, action.obj):
                    report.reconciled.append(action.describe())
            elif action.kind == RESTART:
                if await mgr.record_restart(action.sandbox_id, action.backend, action.expect,
                                            action.obj):
                    report.reconciled.append(action.describe())
            elif action.kind in (FAIL, LOSE, SYNC):
                if mgr.record_backend_state(action.sandbox_id, action.expect, action.target,
                                            reason=action.reason):
                    report.reconciled.append(action.describe())
                    if action.kind == FAIL and action.ref is not None:
                        # made, but its setup may not have run: ended now, as an idempotent
                        # retry settling it ends it, never left to look usable
                        await mgr.destroy_if(action.sandbox_id, action.backend, reason="failed")
        except Conflict as exc:  # another process got there first: that is fine
            report.skipped.append({"id": label, "error": one_line(exc)})
        except Exception as exc:
            report.failed.append({"id": label, "code": classify(exc)[0],
                                  "error": one_line(exc)})

    async def close(self, *, keep_manager: bool = False,
                    hand_over: Callable[[Manager], bool] | None = None) -> None:
        """Close what this reaper opened; `keep_manager`: the manager and its adapters are
        someone else's (a library client's), left open. `hand_over(manager)`: offered the
        manager this reaper made, with its store and its adapters open; True when kept (a
        client that reaps again then looks with adapters that have asked the engine's
        identity once), False to have it closed here."""
        if keep_manager:
            return
        if self._manager is not None:
            if hand_over is not None and hand_over(self._manager):
                return
            await self._manager.close()
        else:
            for adapter in self.adapters.values():
                await adapter.close()


async def _ended(task: asyncio.Future) -> None:
    """`task` cancelled unless done, and waited for, so nothing of a cycle outlives it; its
    error read, as the cycle has its own to report."""
    if not task.done():
        task.cancel()
        await asyncio.wait({task})
    if not task.cancelled():
        task.exception()


async def _runs_a_process(mgr: Manager, sandbox_id: str | None, *,
                          idle_warning: bool = False) -> bool:
    """The idle rule's exception (docs/reliability.md, 22): a sandbox with a recorded
    process not known to have ended is asked; one that still runs there is activity
    (recorded now), so the sandbox is not idle. `idle_warning`: only when the warning due is
    for the idle limit (one for the deadline is given as ever)."""
    if sandbox_id is None:
        return False
    from sandboxer.core.lifecycle.processes import keeps_busy

    if idle_warning:
        from sandboxer.core.rules.ttl import idle_deadline

        row = mgr.rows_by_ids([sandbox_id]).get(sandbox_id)
        idle = idle_deadline(row) if row else None
        if idle is None or idle >= from_iso(row["deadline"]):
            return False

    return await keeps_busy(mgr, sandbox_id)


def default_reaper(*, database_url: str | None = None, manager: Manager | None = None,
                   actor: str | None = None, **options: Any) -> Reaper:
    """A Reaper on this installation's database (`database_url`, else the settings'). It
    reads rows with the standard library when it can (a cycle with nothing to do then loads
    neither the ORM nor Alembic). Given a `manager` (a library client's), it acts through
    it and its adapters instead of making its own."""
    from sandboxer.core.rules import settings
    from sandboxer.core.rules.clock import clock_from_env
    from sandboxer.core.store import inventory

    url = database_url or settings.database_url()

    def make_manager(adapters: dict[str, Adapter]) -> Manager:
        if manager is not None:
            return manager
        from sandboxer.core.lifecycle.manager import Manager
        from sandboxer.core.pools import WarmPools
        from sandboxer.core.store.db import Database

        return Manager(db=Database(url) if database_url else None, adapters=adapters,
                       actor=actor, warm=WarmPools())

    def read_rows():
        fast = inventory.open_readonly(url)
        if fast is not None:
            conn, placeholder = fast
            rows = inventory.list_sandboxes(conn, placeholder=placeholder)

            def rows_by_ids(ids: Iterable[str]) -> dict[str, dict]:
                return inventory.rows_by_ids(conn, list(ids), placeholder)
            return rows, rows_by_ids
        mgr = reaper.manager()
        return mgr.list(), mgr.rows_by_ids

    def fast_or(read: Callable[[Any, str], Any], otherwise: Callable[[], Any]) -> Any:
        """`read(connection, placeholder)` on a read-only driver connection, closed after;
        `otherwise()` when the database is not current (the Manager's path, which migrates)."""
        fast = inventory.open_readonly(url)
        if fast is None:
            return otherwise()
        conn, placeholder = fast
        try:
            return read(conn, placeholder)
        finally:
            conn.close()

    def read_checkpoints() -> list[dict[str, Any]]:
        def through_manager() -> list[dict[str, Any]]:
            from sandboxer.core.lifecycle.checkpoints import Checkpoints

            return Checkpoints(reaper.manager()).list()

        return fast_or(lambda conn, _: inventory.list_checkpoints(conn), through_manager)

    def make_room() -> bool:
        from sandboxer.core.rules.reserve import make_room

        return make_room(url)

    def read_restarts(ids: list[str]) -> dict[str, str]:
        return fast_or(lambda conn, mark: inventory.restarts_seen(conn, ids, mark),
                       lambda: reaper.manager().restarts_seen(ids))

    options.setdefault("read_checkpoints", read_checkpoints)
    options.setdefault("make_room", make_room)
    def read_pools(member_pools: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
        from sandboxer.core import pools

        names = set(pools.candidate_files(pools.profile_folders()))
        if not names:  # no file mentions a pool: nothing to load (a pool with members is gone)
            return {}, {}
        sizes = fast_or(lambda conn, _: pools.read_sizes(conn),
                        lambda: pools.sizes_of(reaper.manager()))
        return pools.read_specs(names, sizes, member_pools)

    def read_due_volumes(now: str) -> int:
        def through_manager() -> int:
            from sandboxer.core.lifecycle import volumes

            return volumes.count_due(reaper.manager(), now)

        return fast_or(lambda conn, mark: inventory.due_volumes(conn, now, reaper.install_id,
                                                                 mark), through_manager)

    def not_current() -> Any:
        raise Unavailable("the database is not current")  # not reached: no fingerprint

    def read_due(soon: str) -> list[dict[str, Any]]:
        return fast_or(lambda conn, mark: inventory.due_sandboxes(conn, soon, mark), not_current)

    def read_fingerprint() -> list[Any] | None:
        # None when not current yet: the Manager's path migrates, and looks in full
        return fast_or(lambda conn, _: inventory.change_fingerprint(conn), lambda: None)

    options.setdefault("read_due", read_due)
    options.setdefault("read_fingerprint", read_fingerprint)
    import hashlib

    scope = hashlib.sha256(url.encode()).hexdigest()[:12]  # one note per database reaped
    options.setdefault("marks", MarkFile(settings.sbx_home() / f"reconcile-mark-{scope}.json"))
    options.setdefault("reconcile_every", settings.reconcile_every())
    options.setdefault("read_due_volumes", read_due_volumes)
    options.setdefault("read_restarts", read_restarts)
    options.setdefault("read_pools", read_pools)
    options.setdefault("warn_before", settings.expiry_warning())
    options.setdefault("grace", settings.reconcile_grace())
    reaper = Reaper(install_id=settings.install_id(),
                    clock=manager.clock if manager is not None else clock_from_env(),
                    read_rows=read_rows, make_manager=make_manager, **options)
    if manager is not None:
        reaper.adapters = manager.adapters
    return reaper
