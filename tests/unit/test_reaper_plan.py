"""The reaper's pure planning functions (plan_reconcile, plan_reap, plan_orphans, merge) and the
TTL rules (sandboxer.core.rules.ttl), on hand-built rows and backend objects: no database, no backend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandboxer.adapters.base import LABEL_HARD_DEADLINE, LABEL_ID, LABEL_INSTALL, BackendObject
from sandboxer.core.reconcile.reaper import (
    ADOPT,
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
    merge,
    plan_orphans,
    plan_reap,
    plan_reconcile,
)
from sandboxer.core.rules.clock import to_iso
from sandboxer.core.rules.ttl import (
    effective_deadline,
    expiry_reason,
    extended,
    idle_deadline,
    warning_due,
)

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
GRACE = timedelta(seconds=60)
WARN_BEFORE = timedelta(minutes=5)
INSTALL = "inst-test"
BACKEND = "stub"
S = timedelta(seconds=1)
M = timedelta(minutes=1)


def row(sid: str = "sbx-a", **over: Any) -> dict[str, Any]:
    """A sandboxes row (every column of sandboxer.core.store.models.Sandbox), running, created 10 minutes ago,
    deadline in 20 minutes, hard deadline in 50 minutes, no idle limit, no lease."""
    base: dict[str, Any] = {
        "id": sid, "name": None, "profile": "p", "profile_json": "{}", "backend": BACKEND,
        "backend_ref": f"ref-{sid}", "install_id": INSTALL, "state": "running", "owner": "t",
        "task": None, "labels_json": "{}",
        "created_at": to_iso(NOW - 10 * M), "started_at": to_iso(NOW - 10 * M),
        "deadline": to_iso(NOW + 20 * M), "hard_deadline": to_iso(NOW + 50 * M),
        "last_activity_at": to_iso(NOW - 10 * M), "idle_timeout_s": None,
        "warned_deadline": None, "ended_at": None, "error": None,
        "lease_owner": None, "lease_expires_at": None, "fence": 1,
    }
    for key, value in over.items():
        base[key] = to_iso(value) if isinstance(value, datetime) else value
    return base


def obj(sid: str | None = "sbx-a", *, status: str = "running", running: bool | None = None,
        age: timedelta = 10 * M, hard: datetime | str | None = NOW + 50 * M,
        ref: str | None = None, created: bool = True,
        restarted: datetime | None = None) -> BackendObject:
    labels = {LABEL_INSTALL: INSTALL}
    if sid is not None:
        labels[LABEL_ID] = sid
    if hard is not None:
        labels[LABEL_HARD_DEADLINE] = to_iso(hard) if isinstance(hard, datetime) else hard
    return BackendObject(ref=ref or f"ref-{sid}", labels=labels, status=status,
                         running=(status == "running") if running is None else running,
                         created_at=(NOW - age) if created else None, restarted_at=restarted)


def reconcile(rows, objects, *, gone=None, now=NOW):
    return plan_reconcile(BACKEND, rows, objects, now, GRACE, rows_outside=gone)


def kinds(actions):
    return [(a.kind, a.sandbox_id) for a in actions]


# -- plan_reconcile: objects without a row -------------------------------------------------


def test_young_object_without_row_is_left_alone():
    assert reconcile([], [obj("sbx-new", age=GRACE - S)]) == []


def test_object_exactly_grace_old_is_no_longer_young():
    (action,) = reconcile([], [obj("sbx-new", age=GRACE)])
    assert action.kind == ADOPT


def test_object_without_row_before_its_hard_deadline_is_adopted():
    o = obj("sbx-lost-db", hard=NOW + 1 * M)
    (action,) = reconcile([], [o])
    assert (action.kind, action.sandbox_id, action.ref) == (ADOPT, "sbx-lost-db", o.ref)
    assert action.reason == "orphan" and action.obj is o


@pytest.mark.parametrize("hard", [NOW, NOW - S, NOW - 1 * M])
def test_object_without_row_past_its_hard_deadline_is_destroyed(hard):
    (action,) = reconcile([], [obj("sbx-old", hard=hard)])
    assert (action.kind, action.sandbox_id, action.reason) == (DESTROY_OBJECT, "sbx-old", "orphan")
    assert action.ref == "ref-sbx-old"


@pytest.mark.parametrize("hard", [None, "not-a-time"])
def test_object_without_row_and_without_a_usable_hard_deadline_is_destroyed(hard):
    (action,) = reconcile([], [obj("sbx-odd", hard=hard)])
    assert action.kind == DESTROY_OBJECT


def test_object_without_id_label_is_destroyed_not_adopted():
    (action,) = reconcile([], [obj(None, ref="ref-anon")])
    assert (action.kind, action.sandbox_id, action.ref) == (DESTROY_OBJECT, None, "ref-anon")


def test_object_whose_row_is_destroyed_is_destroyed_even_before_its_hard_deadline():
    gone = {"sbx-a": row(state="destroyed")}
    (action,) = reconcile([], [obj("sbx-a", hard=NOW + 30 * M)], gone=gone)
    assert (action.kind, action.sandbox_id, action.reason) == (DESTROY_OBJECT, "sbx-a", "orphan")


def test_object_without_created_time_is_not_young():
    (action,) = reconcile([], [obj("sbx-x", created=False)])
    assert action.kind == ADOPT


def test_rows_of_another_backend_do_not_claim_objects():
    other = row(backend="docker")
    (action,) = reconcile([other], [obj("sbx-a")])
    assert action.kind == ADOPT  # the stub object has no stub row


# -- plan_reconcile: rows with an object ---------------------------------------------------


def test_consistent_running_row_and_object_need_nothing():
    assert reconcile([row()], [obj()]) == []


def test_interrupted_create_with_object_and_expired_lease_is_finished():
    r = row(state="creating", backend_ref=None, lease_owner="dead:1",
            lease_expires_at=NOW - S)
    o = obj()
    (action,) = reconcile([r], [o])
    assert (action.kind, action.sandbox_id, action.ref) == (FINISH_CREATE, "sbx-a", o.ref)
    assert action.obj is o


def test_creating_row_with_live_lease_is_someone_elses_work():
    r = row(state="creating", backend_ref=None, lease_owner="alive:1",
            lease_expires_at=NOW + 1 * M)
    assert reconcile([r], [obj()]) == []
    assert reconcile([r], []) == []  # with no object yet, either


def test_lease_expiring_exactly_now_is_still_held():
    r = row(state="creating", backend_ref=None, lease_owner="alive:1", lease_expires_at=NOW)
    assert reconcile([r], [obj()]) == []


def test_interrupted_destroy_with_object_is_destroyed():
    (action,) = reconcile([row(state="destroying")], [obj()])
    assert (action.kind, action.sandbox_id, action.ref, action.reason) == (
        DESTROY, "sbx-a", "ref-sbx-a", None)


def test_failed_row_with_leftover_object_is_destroyed_as_failed():
    (action,) = reconcile([row(state="failed")], [obj()])
    assert (action.kind, action.sandbox_id, action.reason) == (DESTROY, "sbx-a", "failed")


@pytest.mark.parametrize("status", ["exited", "created", "dead"])
def test_running_row_whose_object_stopped_is_lost(status):
    (action,) = reconcile([row()], [obj(status=status)])
    assert (action.kind, action.target, action.expect) == (LOSE, "lost", "running")


def test_paused_row_whose_object_stopped_is_lost():
    (action,) = reconcile([row(state="paused")], [obj(status="exited")])
    assert (action.kind, action.target, action.expect) == (LOSE, "lost", "paused")


def test_object_paused_out_of_band_is_synced():
    (action,) = reconcile([row()], [obj(status="paused", running=False)])
    assert (action.kind, action.target, action.expect) == (SYNC, "paused", "running")


def test_object_resumed_out_of_band_is_synced():
    (action,) = reconcile([row(state="paused")], [obj()])
    assert (action.kind, action.target, action.expect) == (SYNC, "running", "paused")


def test_paused_row_and_paused_object_need_nothing():
    assert reconcile([row(state="paused")], [obj(status="paused", running=False)]) == []


@pytest.mark.parametrize("state", ["running", "paused"])
def test_a_sandbox_the_backend_started_again_is_recorded_once(state):
    back = obj(restarted=NOW - 1 * M)  # running again (a paused one comes back running)
    (action,) = reconcile([row(state=state)], [back])
    assert (action.kind, action.target, action.expect, action.obj) == (RESTART, state, state,
                                                                       back)
    seen = {"sbx-a": to_iso(NOW - 1 * M)}
    now_as = back if state == "running" else obj(status="paused", restarted=NOW - 1 * M)
    after = plan_reconcile(BACKEND, [row(state=state)], [now_as], NOW, GRACE,
                           restarts_seen=seen)
    assert after == []  # recorded (and paused again) already
    again = obj(restarted=NOW - 2 * S)  # and once more, later
    assert kinds(plan_reconcile(BACKEND, [row(state=state)], [again], NOW, GRACE,
                                restarts_seen=seen)) == [(RESTART, "sbx-a")]


def test_a_restart_is_not_recorded_for_a_stopped_or_held_sandbox():
    assert kinds(reconcile([row()], [obj(status="exited", restarted=NOW - M)])) == [
        (LOSE, "sbx-a")]
    held = row(lease_owner="alive:1", lease_expires_at=NOW + M)
    assert reconcile([held], [obj(restarted=NOW - M)]) == []
    assert kinds(reconcile([row(state="creating")], [obj(restarted=NOW - M)])) == [
        (FINISH_CREATE, "sbx-a")]


def test_a_lost_sandbox_says_why():
    (stopped,) = reconcile([row()], [obj(status="exited")])
    (gone,) = reconcile([row()], [])
    assert (stopped.reason, gone.reason) == ("stopped", "gone")


def test_leased_running_row_is_not_touched_even_if_its_object_stopped():
    r = row(lease_owner="alive:1", lease_expires_at=NOW + 1 * M)
    assert reconcile([r], [obj(status="exited")]) == []
    assert reconcile([r], []) == []


# -- plan_reconcile: rows without an object ------------------------------------------------


def test_running_row_without_object_is_lost():
    (action,) = reconcile([row()], [])
    assert (action.kind, action.sandbox_id, action.target, action.expect) == (
        LOSE, "sbx-a", "lost", "running")


def test_paused_row_without_object_is_lost():
    (action,) = reconcile([row(state="paused")], [])
    assert (action.kind, action.target, action.expect) == (LOSE, "lost", "paused")


def test_creating_row_without_object_older_than_grace_fails():
    r = row(state="creating", backend_ref=None, created_at=NOW - GRACE)
    (action,) = reconcile([r], [])
    assert (action.kind, action.target, action.expect, action.reason) == (
        FAIL, "failed", "creating", "failed")


def test_creating_row_without_object_younger_than_grace_waits():
    r = row(state="creating", backend_ref=None, created_at=NOW - GRACE + S)
    assert reconcile([r], []) == []


def test_a_create_whose_holder_died_fails_at_once_without_waiting_for_lease_or_grace():
    r = row(state="creating", backend_ref=None, created_at=NOW - S, lease_owner="dead:1",
            lease_expires_at=NOW + 2 * M)
    assert plan_reconcile(BACKEND, [r], [], NOW, GRACE, dead={"other:2"}) == []
    (action,) = plan_reconcile(BACKEND, [r], [], NOW, GRACE, dead={"dead:1"})
    assert (action.kind, action.target, action.expect) == (FAIL, "failed", "creating")
    (finish,) = plan_reconcile(BACKEND, [r], [obj()], NOW, GRACE, dead={"dead:1"})
    assert finish.kind == FINISH_CREATE


def test_destroying_row_without_object_is_completed():
    (action,) = reconcile([row(state="destroying")], [])
    assert (action.kind, action.sandbox_id, action.ref) == (DESTROY, "sbx-a", None)


def test_lost_row_without_object_needs_nothing():
    assert reconcile([row(state="lost")], []) == []


def test_failed_row_without_object_is_settled_once_the_grace_has_passed():
    just_failed = row(state="failed", backend_ref=None, ended_at=NOW - GRACE + S)
    assert reconcile([just_failed], []) == []  # an object the backend is still making may come
    (action,) = reconcile([row(state="failed", backend_ref=None, ended_at=NOW - GRACE)], [])
    assert (action.kind, action.sandbox_id, action.ref, action.reason) == (
        DESTROY, "sbx-a", None, "failed")


def test_each_row_and_object_is_planned_once():
    rows = [row("sbx-a"), row("sbx-b"), row("sbx-c", state="destroying")]
    objects = [obj("sbx-a"), obj("sbx-c"), obj("sbx-z", hard=NOW - S)]
    assert sorted(kinds(reconcile(rows, objects))) == sorted(
        [(LOSE, "sbx-b"), (DESTROY, "sbx-c"), (DESTROY_OBJECT, "sbx-z")])


# -- plan_reap --------------------------------------------------------------------------------


def reap(rows, now=NOW):
    return plan_reap(rows, now, WARN_BEFORE)


def test_not_expired_needs_nothing():
    assert reap([row(deadline=NOW + 10 * M)]) == []


@pytest.mark.parametrize(("over", "reason"), [
    ({"deadline": NOW}, "ttl"),
    ({"deadline": NOW - 1 * M}, "ttl"),
    ({"deadline": NOW - 1 * M, "hard_deadline": NOW - 1 * M}, "max-ttl"),
    ({"idle_timeout_s": 600, "last_activity_at": NOW - 10 * M}, "idle"),
    ({"idle_timeout_s": 600, "last_activity_at": NOW - 12 * M, "deadline": NOW - 1 * M}, "idle"),
])
def test_expired_sandboxes_are_destroyed_with_their_reason(over, reason):
    (action,) = reap([row(**over)])
    assert (action.kind, action.sandbox_id, action.ref, action.reason) == (
        DESTROY, "sbx-a", "ref-sbx-a", reason)


@pytest.mark.parametrize("state", ["running", "paused", "lost"])
def test_expired_rows_in_reapable_states_are_destroyed(state):
    (action,) = reap([row(state=state, deadline=NOW - S)])
    assert action.kind == DESTROY


@pytest.mark.parametrize("state", ["destroying", "destroyed", "failed"])
def test_rows_in_other_states_are_left_to_reconcile(state):
    assert reap([row(state=state, deadline=NOW - 1 * M)]) == []


def test_an_interrupted_create_past_its_deadline_is_reaped_but_a_live_one_is_not():
    interrupted = row(state="creating", deadline=NOW - 1 * M, lease_owner="dead:1",
                      lease_expires_at=NOW - S)
    assert [(a.kind, a.reason) for a in reap([interrupted])] == [(DESTROY, "ttl")]
    in_progress = row(state="creating", deadline=NOW - 1 * M, lease_owner="alive:1",
                      lease_expires_at=NOW + S)
    assert reap([in_progress]) == []


def test_leased_expired_row_is_not_reaped():
    r = row(deadline=NOW - 1 * M, lease_owner="alive:1", lease_expires_at=NOW + S)
    assert reap([r]) == []


def test_expired_row_whose_holder_died_is_reaped_before_its_lease_expires():
    r = row(deadline=NOW - 1 * M, lease_owner="dead:1", lease_expires_at=NOW + M)
    assert plan_reap([r], NOW, WARN_BEFORE) == []
    assert kinds(plan_reap([r], NOW, WARN_BEFORE, {"dead:1"})) == [(DESTROY, "sbx-a")]


def test_expired_row_with_a_stale_lease_is_reaped():
    r = row(deadline=NOW - 1 * M, lease_owner="dead:1", lease_expires_at=NOW - S)
    assert kinds(reap([r])) == [(DESTROY, "sbx-a")]


def test_warning_is_due_inside_the_window_once_per_deadline():
    r = row(deadline=NOW + 4 * M)
    (action,) = reap([r])
    assert (action.kind, action.sandbox_id, action.reason) == (WARN, "sbx-a", "ttl")
    warned = row(deadline=NOW + 4 * M, warned_deadline=NOW + 4 * M)
    assert reap([warned]) == []
    # extended: a new deadline re-arms the warning
    moved = row(deadline=NOW + 4 * M + S, warned_deadline=NOW + 4 * M)
    assert kinds(reap([moved])) == [(WARN, "sbx-a")]


def test_warning_window_boundaries():
    assert kinds(reap([row(deadline=NOW + WARN_BEFORE)])) == [(WARN, "sbx-a")]
    assert reap([row(deadline=NOW + WARN_BEFORE + S)]) == []


def test_warning_follows_the_idle_deadline():
    r = row(idle_timeout_s=600, last_activity_at=NOW - 7 * M)  # idle in 3 minutes
    (action,) = reap([r])
    assert action.kind == WARN
    warned = row(idle_timeout_s=600, last_activity_at=NOW - 7 * M, warned_deadline=NOW + 3 * M)
    assert reap([warned]) == []


def test_lost_rows_are_not_warned():
    assert reap([row(state="lost", deadline=NOW + 1 * M)]) == []


# -- plan_orphans ------------------------------------------------------------------------------


def test_orphans_past_their_hard_deadline_are_destroyed():
    objects = [obj("sbx-old", hard=NOW - S), obj("sbx-edge", hard=NOW),
               obj("sbx-young", hard=NOW + S), obj("sbx-nolabel", hard=None),
               obj("sbx-bad", hard="garbage"), obj(None, ref="ref-anon", hard=NOW - M)]
    actions = plan_orphans(BACKEND, objects, NOW)
    assert [(a.kind, a.sandbox_id, a.ref, a.reason) for a in actions] == [
        (DESTROY_OBJECT, "sbx-old", "ref-sbx-old", "max-ttl"),
        (DESTROY_OBJECT, "sbx-edge", "ref-sbx-edge", "max-ttl"),
        (DESTROY_OBJECT, None, "ref-anon", "max-ttl"),
    ]
    assert all(a.backend == BACKEND for a in actions)


def test_orphan_sweep_ignores_the_age_grace():
    (action,) = plan_orphans(BACKEND, [obj("sbx-x", age=timedelta(0), hard=NOW - S)], NOW)
    assert action.kind == DESTROY_OBJECT


# -- merge ---------------------------------------------------------------------------------------


def test_merge_keeps_one_action_per_sandbox_and_reconcile_wins():
    sync = Action(SYNC, BACKEND, "sbx-a", "ref-a", target="paused", expect="running")
    destroy = Action(DESTROY, BACKEND, "sbx-a", "ref-a", "ttl")
    orphan = Action(DESTROY_OBJECT, BACKEND, "sbx-a", "ref-a", "max-ttl")
    assert merge([sync], [orphan]) == [sync]
    # a due destroy still follows a repaired record (paused out of band and expired)
    assert merge([sync], [destroy, orphan]) == [sync, destroy]
    interrupted = Action(DESTROY, BACKEND, "sbx-b", "ref-b")  # reconcile's: a destroying row
    assert merge([interrupted], [Action(DESTROY, BACKEND, "sbx-b", "ref-b", "ttl")]) == [
        interrupted]
    warn = Action(WARN, BACKEND, "sbx-c", reason="ttl")
    fail = Action(FAIL, BACKEND, "sbx-c", reason="failed", target="failed", expect="creating")
    assert merge([fail], [warn]) == [fail]


def test_merge_lets_an_expired_sandbox_found_lost_be_reaped_in_the_same_cycle():
    lose = Action(LOSE, BACKEND, "sbx-a", "ref-a", target="lost", expect="running")
    destroy = Action(DESTROY, BACKEND, "sbx-a", "ref-a", "ttl")
    orphan = Action(DESTROY_OBJECT, BACKEND, "sbx-a", "ref-a", "max-ttl")
    warn = Action(WARN, BACKEND, "sbx-a", reason="ttl")
    assert merge([lose], [destroy, orphan]) == [lose, destroy]  # LOSE applies first (ORDER)
    assert merge([lose], [warn]) == [lose]  # only a destroy joins a lose


def test_merge_lets_an_expired_interrupted_create_be_finished_then_reaped():
    finish = Action(FINISH_CREATE, BACKEND, "sbx-a", "ref-a")
    destroy = Action(DESTROY, BACKEND, "sbx-a", "ref-a", "ttl")
    assert merge([finish], [destroy]) == [finish, destroy]


def test_merge_reap_wins_over_an_orphan_sweep_of_the_same_sandbox():
    destroy = Action(DESTROY, BACKEND, "sbx-a", "ref-a", "ttl")
    orphan = Action(DESTROY_OBJECT, BACKEND, "sbx-a", "ref-a", "max-ttl")
    assert merge([], [destroy, orphan]) == [destroy]


def test_merge_keys_anonymous_objects_by_ref():
    a = Action(DESTROY_OBJECT, BACKEND, None, "ref-1", "orphan")
    b = Action(DESTROY_OBJECT, BACKEND, None, "ref-2", "orphan")
    a_again = Action(DESTROY_OBJECT, BACKEND, None, "ref-1", "max-ttl")
    assert merge([a, b], [a_again]) == [a, b]


def test_merge_sorts_by_order_and_keeps_input_order_within_a_kind():
    planned = [
        Action(WARN, BACKEND, "sbx-w"), Action(DESTROY_OBJECT, BACKEND, "sbx-o", "r-o"),
        Action(DESTROY, BACKEND, "sbx-d2"), Action(ADOPT, BACKEND, "sbx-ad"),
        Action(SYNC, BACKEND, "sbx-s"), Action(LOSE, BACKEND, "sbx-l"),
        Action(FAIL, BACKEND, "sbx-f"), Action(FINISH_CREATE, BACKEND, "sbx-fc"),
        Action(DESTROY, BACKEND, "sbx-d1"),
    ]
    out = merge(planned[:5], planned[5:])
    assert [a.kind for a in out] == [FINISH_CREATE, FAIL, LOSE, SYNC, ADOPT, DESTROY, DESTROY,
                                     DESTROY_OBJECT, WARN]
    assert [a.sandbox_id for a in out if a.kind == DESTROY] == ["sbx-d2", "sbx-d1"]
    # pool members are retired before pools are filled (room first), both before warnings
    assert ORDER[:11] == (FINISH_CREATE, FAIL, LOSE, SYNC, RESTART, ADOPT, DESTROY,
                          DESTROY_OBJECT, RETIRE, FILL, WARN)


def test_merge_of_nothing_is_nothing():
    assert merge([], []) == []


# -- sandboxer.core.rules.ttl --------------------------------------------------------------------------------------


HARD = NOW + 60 * M


@given(start=st.integers(0, 3600), by=st.integers(0, 3 * 3600))
def test_extended_never_shortens_never_passes_the_hard_deadline(start, by):
    deadline = NOW + timedelta(seconds=start)
    new, capped = extended(deadline, HARD, timedelta(seconds=by))
    assert deadline <= new <= HARD
    assert capped == (deadline + timedelta(seconds=by) > HARD)
    if not capped:
        assert new == deadline + timedelta(seconds=by)


def test_extended_caps_at_the_hard_deadline_and_says_so():
    assert extended(NOW, HARD, 30 * M) == (NOW + 30 * M, False)
    assert extended(NOW, HARD, 60 * M) == (HARD, False)  # exactly reaching it is not capping
    assert extended(NOW, HARD, 61 * M) == (HARD, True)
    assert extended(HARD, HARD, S) == (HARD, True)


def test_extended_never_moves_a_deadline_already_past_the_hard_deadline_earlier():
    # adopted or legacy rows may carry deadline > hard deadline; capping must not shorten them
    assert extended(HARD + M, HARD, M) == (HARD + M, True)


@pytest.mark.parametrize("by", [timedelta(0), -S, -10 * M])
def test_extended_by_zero_or_a_negative_duration_never_shortens(by):
    """`extend` never moves a deadline earlier (docs/reliability.md, guarantee 9):
    a non-positive duration must leave it where it is (or be refused), never shorten it."""
    deadline = NOW + 10 * M
    try:
        new, _ = extended(deadline, HARD, by)
    except ValueError:
        return
    assert new >= deadline


def test_expiry_reason_boundaries():
    assert expiry_reason(row(deadline=NOW + S), NOW) is None
    assert expiry_reason(row(deadline=NOW), NOW) == "ttl"  # the deadline itself is expired
    assert expiry_reason(row(deadline=NOW - S), NOW) == "ttl"
    assert expiry_reason(row(deadline=NOW, hard_deadline=NOW), NOW) == "max-ttl"
    assert expiry_reason(row(deadline=NOW - S, hard_deadline=NOW - S), NOW) == "max-ttl"


def test_expiry_reason_idle_boundaries():
    idle = {"idle_timeout_s": 600}
    assert expiry_reason(row(**idle, last_activity_at=NOW - 10 * M + S), NOW) is None
    assert expiry_reason(row(**idle, last_activity_at=NOW - 10 * M), NOW) == "idle"
    # idle and ttl deadline at the same instant: it is the ttl that ended it
    assert expiry_reason(row(**idle, last_activity_at=NOW - 10 * M, deadline=NOW), NOW) == "ttl"
    # the ttl deadline came first
    assert expiry_reason(row(**idle, last_activity_at=NOW - 9 * M, deadline=NOW - S),
                         NOW) == "ttl"
    # no idle limit: old activity does not matter
    assert expiry_reason(row(idle_timeout_s=None, last_activity_at=NOW - 1000 * M), NOW) is None
    assert expiry_reason(row(idle_timeout_s=0, last_activity_at=NOW - 1000 * M), NOW) is None


def test_effective_and_idle_deadline():
    r = row(idle_timeout_s=600, last_activity_at=NOW)
    assert idle_deadline(r) == NOW + 10 * M
    assert effective_deadline(r) == NOW + 10 * M  # before the deadline in 20 minutes
    assert effective_deadline(row(idle_timeout_s=3600, last_activity_at=NOW)) == NOW + 20 * M
    assert idle_deadline(row()) is None and effective_deadline(row()) == NOW + 20 * M


@pytest.mark.parametrize("state", ["creating", "lost", "destroying", "destroyed", "failed"])
def test_warning_only_for_running_or_paused(state):
    assert not warning_due(row(state=state, deadline=NOW + M), NOW, WARN_BEFORE)


def test_warning_not_due_after_expiry():
    assert not warning_due(row(deadline=NOW), NOW, WARN_BEFORE)
    assert warning_due(row(deadline=NOW + S), NOW, WARN_BEFORE)
