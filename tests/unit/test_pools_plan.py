"""Warm pools without I/O: the pure planner (sandboxer.core.pools.plan_pools), what reconcile and the
reaper plan for pool members (plan_reconcile, plan_reap), the fit rule, and the `pool:` field
of profiles (its errors name the field; a pool is not inherited by another profile)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from sandboxer.core.pools import (
    PoolSpec,
    candidate_files,
    fits,
    is_member,
    member_key,
    plan_pools,
    profile_folders,
)
from sandboxer.core.reconcile.reaper import (
    DESTROY,
    FAIL,
    FILL,
    FINISH_CREATE,
    LOSE,
    RETIRE,
    plan_reap,
)
from sandboxer.core.rules.states import TRANSITIONS, State, can_transition
from sandboxer.core.rules.ttl import expiry_reason
from tests.unit.test_reaper_plan import INSTALL, NOW, M, obj, reconcile, row

DOC = {"backend": "stub", "image": "img:1", "command": None, "env": {}, "setup": [],
       "name": "p", "description": "", "labels": {}, "ttl": {"default": "30m", "max": "4h"},
       "checkpoints": {}, "pool": {"size": 2, "max_age": "10m"}}
KEY = member_key(DOC)


def member(sid: str, *, state: str = "warm", pool: str = "p", age: timedelta = 2 * M,
           doc: dict | None = None, **over: Any) -> dict[str, Any]:
    """A warm member of pool `pool` made `age` ago: deadline at 10 minutes (max_age), hard
    deadline at max_age plus the profile's 4h."""
    made = NOW - age
    base = dict(state=state, pool=pool, launch=None, owner="(pool)", created_at=made,
                started_at=made, deadline=made + 10 * M, hard_deadline=made + 10 * M + 240 * M,
                profile_json=json.dumps(doc or DOC), profile=pool)
    base.update(over)
    return row(sid, **base)


def spec(size: int = 2, **over: Any) -> dict[str, PoolSpec]:
    fields = dict(name="p", backend="stub", size=size, key=KEY, ttl_max=timedelta(hours=4))
    fields.update(over)
    return {fields["name"]: PoolSpec(**fields)}


def plan(pools, rows, **kwargs):
    return [(a.kind, a.sandbox_id, a.reason) for a in
            plan_pools(pools, rows, NOW, install_id=INSTALL, **kwargs)]


# -- the state table -----------------------------------------------------------------------


def test_warm_members_enter_leave_and_are_never_run_before_a_claim():
    assert TRANSITIONS[(State.CREATING, State.WARM)] == "sandbox.warmed"
    assert TRANSITIONS[(State.WARM, State.RUNNING)] == "sandbox.claimed"
    for target in (State.DESTROYING, State.LOST):
        assert can_transition(State.WARM, target)
    for target in (State.PAUSED, State.CREATING, State.DESTROYED):  # not without a destroy
        assert not can_transition(State.WARM, target)
    assert not can_transition(State.RUNNING, State.WARM)  # a claimed sandbox never goes back


def test_a_warm_member_past_its_max_age_expires_as_max_age_not_ttl():
    young, old = member("sbx-y", age=5 * M), member("sbx-o", age=11 * M)
    assert expiry_reason(young, NOW) is None
    assert expiry_reason(old, NOW) == "max-age"
    actions = plan_reap([young, old], NOW, timedelta(minutes=5))
    assert [(a.kind, a.sandbox_id, a.reason, a.pool) for a in actions] == [
        (DESTROY, "sbx-o", "max-age", "p")]  # and no expiry warning for a member


# -- filling and retiring ------------------------------------------------------------------


def test_an_empty_pool_is_filled_to_its_size():
    assert plan(spec(3), []) == [(FILL, None, None)] * 3


def test_a_full_pool_plans_nothing_and_claimed_sandboxes_do_not_count():
    claimed = member("sbx-c", state="running", launch="warm")
    rows = [member("sbx-a"), member("sbx-b"), claimed, row("sbx-cold")]
    assert plan(spec(2), rows) == []
    assert plan(spec(3), rows) == [(FILL, None, None)]


def test_a_member_being_made_counts_but_one_whose_maker_died_does_not():
    making = member("sbx-m", state="creating", lease_owner="alive", lease_expires_at=NOW + M)
    dead = member("sbx-d", state="creating", lease_owner="gone", lease_expires_at=NOW + M)
    assert plan(spec(2), [making]) == [(FILL, None, None)]
    assert plan(spec(2), [making, dead], dead={"gone"}) == [(FILL, None, None)]
    lapsed = member("sbx-l", state="creating")  # no lease: reconcile fails it
    assert plan(spec(1), [lapsed]) == [(FILL, None, None)]


def test_members_past_max_age_are_replaced_not_counted():
    rows = [member("sbx-old", age=11 * M), member("sbx-new")]
    # plan_reap retires the old one (max-age); the pool makes one more meanwhile
    assert plan(spec(2), rows) == [(FILL, None, None)]


def test_a_bigger_pool_is_shrunk_youngest_first():
    rows = [member("sbx-1", age=8 * M), member("sbx-2", age=5 * M), member("sbx-3", age=1 * M)]
    assert plan(spec(1), rows) == [(RETIRE, "sbx-3", "pool-shrunk"),
                                   (RETIRE, "sbx-2", "pool-shrunk")]
    assert plan(spec(0), rows) == [(RETIRE, s, "pool-shrunk") for s in ("sbx-3", "sbx-2", "sbx-1")]


def test_members_of_a_changed_profile_are_replaced():
    changed = member("sbx-x", doc={**DOC, "image": "img:2"})
    same_but_labels = member("sbx-y", doc={**DOC, "labels": {"a": "b"}, "ttl": {"default": "5m",
                                                                              "max": "4h"}})
    assert plan(spec(2), [changed, same_but_labels]) == [
        (RETIRE, "sbx-x", "pool-changed"), (FILL, None, None)]
    # a longer ttl.max than a member's hard deadline can give: it no longer fits either
    assert plan(spec(1, ttl_max=timedelta(hours=5)), [same_but_labels]) == [
        (RETIRE, "sbx-y", "pool-changed"), (FILL, None, None)]


def test_members_of_a_pool_that_no_longer_exists_are_removed():
    rows = [member("sbx-a"), member("sbx-b", state="creating", lease_owner="x",
                                    lease_expires_at=NOW + M)]
    # the warm one goes now; the one being made when it is warm (the next cycle)
    assert plan({}, rows) == [(RETIRE, "sbx-a", "pool-removed")]


def test_a_pool_whose_profile_cannot_be_loaded_is_left_as_it_is():
    rows = [member("sbx-a"), member("sbx-b", doc={**DOC, "image": "img:2"})]
    assert plan({"p": PoolSpec("p", error="p.yaml: pool.size: bad")}, rows) == []


def test_only_this_installations_members_and_reachable_backends_are_judged():
    theirs = member("sbx-t", install_id="inst-other")
    assert plan(spec(1), [theirs]) == [(FILL, None, None)]
    assert plan(spec(1), [], skip_backends={"stub"}) == []
    unseen = member("sbx-u", doc={**DOC, "image": "img:2"})
    assert plan(spec(1), [unseen], skip_rows={"sbx-u"}) == [(FILL, None, None)]


def test_the_fit_rule_is_the_claims_rule():
    ok = member("sbx-a")
    assert fits(ok, KEY, timedelta(hours=4), NOW)
    assert not fits(ok, member_key({**DOC, "env": {"A": "1"}}), timedelta(hours=4), NOW)
    assert not fits(member("sbx-o", age=11 * M), KEY, timedelta(hours=4), NOW)  # too old
    assert not fits(member("sbx-r", state="running"), KEY, timedelta(hours=4), NOW)
    # what a claim applies is not part of the key
    assert member_key({**DOC, "name": "q", "labels": {"k": "v"}, "pool": None,
                       "ttl": {"default": "1m", "max": "1h"}, "description": "x"}) == KEY


# -- reconcile -----------------------------------------------------------------------------


def test_a_member_whose_maker_died_after_the_backend_made_it_is_failed_not_made_warm():
    making = member("sbx-m", state="creating", created_at=NOW - 5 * M)
    plain = row("sbx-p", state="creating", created_at=NOW - 5 * M)
    actions = reconcile([making, plain], [obj("sbx-m"), obj("sbx-p")])
    assert {(a.kind, a.sandbox_id, a.target) for a in actions} == {
        (FAIL, "sbx-m", State.FAILED), (FINISH_CREATE, "sbx-p", None)}


def test_a_warm_member_gone_stopped_or_paused_on_the_backend_is_lost():
    rows = [member("sbx-g"), member("sbx-s"), member("sbx-p"), member("sbx-ok")]
    objects = [obj("sbx-s", status="exited"), obj("sbx-p", status="paused"), obj("sbx-ok")]
    actions = reconcile(rows, objects)
    assert sorted((a.kind, a.sandbox_id, a.target, a.reason) for a in actions) == [
        (LOSE, "sbx-g", State.LOST, "gone"), (LOSE, "sbx-p", State.LOST, "stopped"),
        (LOSE, "sbx-s", State.LOST, "stopped")]


def test_is_member_means_made_for_a_pool_and_never_claimed():
    assert is_member(member("sbx-a"))
    assert not is_member(member("sbx-c", state="running", launch="warm"))
    assert not is_member(row("sbx-cold", launch="cold"))
    assert not is_member(row("sbx-old"))  # made before pools existed


# -- profiles -------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "field", "why"), [
    ("pool: {size: -1}", "pool.size", "greater than or equal to 0"),
    ("pool: {size: 101}", "pool.size", "less than or equal to 100"),
    ("pool: {size: two}", "pool.size", "should be a whole number"),
    ("pool: {size: true}", "pool.size", "should be a whole number"),
    ("pool: {max_age: 5m}", "pool.size", "required"),
    ("pool: {size: 1, max_age: 0s}", "pool.max_age", "must be longer than zero"),
    ("pool: {size: 1, max_age: soon}", "pool.max_age", "bad duration"),
    ("pool: {size: 1, warm: yes}", "pool.warm", "unknown field"),
    ("pool: 3", "pool", "should be a mapping, not 3"),
    ("secrets: {T: env:TOKEN}\npool: {size: 1}", "pool", "cannot keep a pool"),
])
def test_bad_pool_fields_name_the_field(sbx_home, tmp_path, text, field, why):
    from sandboxer.core.rules.profiles import ProfileError, ProfileLoader

    path = tmp_path / "bad.yaml"
    path.write_text(f"backend: docker\n{text}\n")
    with pytest.raises(ProfileError) as caught:
        ProfileLoader().load_file(path)
    assert f"{path}: {field}: " in str(caught.value) and why in str(caught.value)


def test_a_pool_is_the_profiles_own_not_inherited_by_another_name(sbx_home, tmp_path,
                                                                   monkeypatch):
    from sandboxer.core.rules.profiles import ProfileLoader

    folder = tmp_path / "profiles"
    folder.mkdir()
    monkeypatch.setenv("SBX_PROFILE_PATH", str(folder))
    (folder / "warm.yaml").write_text("backend: docker\npool: {size: 3, max_age: 2m}\n")
    (folder / "child.yaml").write_text("extends: warm\ndescription: a child\n")
    (folder / "default.yaml").write_text("extends: default\npool: {size: 1}\n")
    loader = ProfileLoader()
    assert loader.load("warm").pool.size == 3
    assert loader.load("child").pool is None  # five children would be five pools otherwise
    assert loader.load("default").pool.size == 1  # an overlay of the same profile may add one
    assert loader.load("default").pool.max_age == timedelta(minutes=10)  # short by default


def test_the_pool_scan_reads_every_folder_of_the_search_path(sbx_home, tmp_path, monkeypatch):
    from sandboxer.core.rules.profiles import search_path, trust

    extra = tmp_path / "extra"
    extra.mkdir()
    monkeypatch.setenv("SBX_PROFILE_PATH", f"{extra}:{tmp_path / 'more'}")
    project = tmp_path / ".sbx" / "profiles"
    project.mkdir(parents=True)
    (project / "mine.yaml").write_text("backend: docker\npool:\n  size: 1\n")
    trust(project)
    assert set(search_path()) <= {Path(p) for p in profile_folders()}
    (extra / "flow.yml").write_text("{backend: docker, 'pool': {size: 2}}\n")
    (extra / "plain.yaml").write_text("backend: docker\n")
    assert set(candidate_files(profile_folders())) == {"mine", "flow"}
