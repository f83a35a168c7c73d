"""Warm pools on the real Docker engine, through the real `sbx` CLI in subprocesses: members
made by `sbx reap`, claimed by `sbx create` (one winner per member, on SQLite and on
PostgreSQL), refilled, replaced past max_age, shrunk, drained, removed with their pool; crashes
at the claim and while a member is made leave nothing behind; bad `pool` fields exit 2 and
change nothing.

Pooled profiles live in the test's user config folder, which every `sbx` of the test reads.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from support import (
    RUN_LABEL,
    containers_of,
    events_of,
    install_id_of,
    query,
    show,
    table_rows,
)

from tests.reliability.test_reliability import finish, popen, process_state, wait_until, warm_up
from tests.store.test_postgres import Host, pg_url  # noqa: F401 (a fixture)

pytestmark = pytest.mark.docker


def profiles_folder(sbx) -> Path:
    folder = sbx.cwd / "xdg-config" / "sandboxer" / "profiles"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def pooled(sbx, name: str = "warm", size: int = 2, max_age: str = "10m", extra: str = "") -> str:
    """A profile `name` on Docker (the default one's image and limits) with a pool."""
    (profiles_folder(sbx) / f"{name}.yaml").write_text(
        f"extends: default\npool: {{size: {size}, max_age: {max_age}}}\n{extra}")
    return name


def reap(sbx, *args: str, env: dict[str, str] | None = None) -> dict:
    result = sbx("reap", "--json", *args, env=env)
    assert result.code == 0, (result.out, result.err)
    return result.json()


def pool_of(sbx, name: str = "warm") -> dict:
    listed = sbx("pool", "ls", "--json")
    assert listed.code == 0, listed.err
    return {p["profile"]: p for p in listed.json()}[name]


def members(docker_api, sbx, name: str = "warm") -> dict[str, dict]:
    """This installation's containers that are members of pool `name`, by container id."""
    return {c["Id"]: c for c in containers_of(docker_api, install_id_of(sbx.home))
            if c["Labels"].get("sbx.pool") == name}


def parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def near(a: datetime, b: datetime, within: float = 5) -> bool:
    return abs((a - b).total_seconds()) <= within


def warmed(report: dict) -> list[str]:
    return [p["id"] for p in report.get("pools", []) if p["action"] == "warmed"]


def retired(report: dict) -> dict[str, str]:
    return {p["id"]: p["reason"] for p in report.get("pools", []) if p["action"] == "retired"}


# -- made, hidden, claimed, refilled ---------------------------------------------------------


def test_members_are_made_hidden_claimed_at_create_and_refilled(sbx, docker_api):
    pooled(sbx, size=2)
    report = reap(sbx)
    assert len(warmed(report)) == 2
    made = members(docker_api, sbx)
    assert len(made) == 2 and all(c["State"] == "running" for c in made.values())
    # real sandboxes of ours, owned by nobody, never listed as a user's
    rows = query(sbx.home, "SELECT * FROM sandboxes")
    assert {(r["state"], r["owner"], r["pool"], r["launch"]) for r in rows} == {
        ("warm", "(pool)", "warm", None)}
    for listing in (sbx("ls", "--json"), sbx("ls", "--all", "--json"),
                    sbx("ls", "--state", "warm", "--json")):
        assert listing.code == 0 and listing.json() == []
    pool = pool_of(sbx)
    assert (pool["size"], pool["ready"], pool["starting"], pool["claimed"]) == (2, 2, 0, 0)
    assert pool["backend"] == "docker" and pool["max_age"] == "10m"

    before = time.time()
    box = sbx.create("--profile", "warm", "--name", "agent", "--ttl", "5m", "--task", "t1",
                     "--owner", "ci-bot", "--label", "team=infra")
    assert box["launch"] == "warm" and box["pool"] == "warm"
    assert box["backend_ref"] in made and box["state"] == "running"
    assert (box["name"], box["owner"], box["task"]) == ("agent", "ci-bot", "t1")
    assert box["labels"]["team"] == "infra" and set(box["labels"]) == {"team", "sbx-test-run"}
    # the deadline starts at the claim (started_at), not when the member was made (created_at)
    claimed = parse(box["started_at"])
    assert claimed.timestamp() >= before - 1 and parse(box["created_at"]) <= claimed
    assert parse(box["deadline"]) - claimed == timedelta(minutes=5)
    assert parse(box["hard_deadline"]) - claimed == timedelta(hours=4)  # the profile's ttl.max
    hello = sbx("exec", "agent", "--", "echo", "hello")
    assert (hello.code, hello.out) == (0, "hello\n")
    types = [e["type"] for e in events_of(sbx, box["id"])]
    assert types[:3] == ["sandbox.creating", "sandbox.warmed", "sandbox.claimed"]
    claim = [e for e in events_of(sbx, box["id"]) if e["type"] == "sandbox.claimed"][0]
    assert claim["payload"]["launch"] == "warm" and claim["payload"]["owner"] == "ci-bot"
    listed = sbx("ls", "--json").json()
    assert [(b["id"], b["launch"]) for b in listed] == [(box["id"], "warm")]
    assert show(sbx, "agent")["launch"] == "warm"
    assert (pool_of(sbx)["ready"], pool_of(sbx)["claimed"]) == (1, 1)

    second = sbx.create("--profile", "warm")
    third = sbx.create("--profile", "warm")  # the pool is empty: created cold
    assert second["launch"] == "warm" and second["backend_ref"] in made
    assert second["backend_ref"] != box["backend_ref"]
    assert third["launch"] == "cold" and third["backend_ref"] not in made
    creating = events_of(sbx, third["id"])[0]
    assert creating["type"] == "sandbox.creating" and creating["payload"]["launch"] == "cold"

    refill = reap(sbx)
    assert len(warmed(refill)) == 2
    assert len(members(docker_api, sbx)) == 4  # two claimed, two new
    pool = pool_of(sbx)
    assert (pool["ready"], pool["claimed"]) == (2, 2)
    assert reap(sbx).get("pools") is None  # full: nothing to do
    assert sbx("events", "verify").code == 0


def test_a_request_no_member_fits_is_created_cold_and_leaves_the_pool(sbx, docker_api,
                                                                      tmp_path):
    pooled(sbx, size=1)
    reap(sbx)
    (member_ref,) = members(docker_api, sbx)
    # the same profile name with another command: another container, so not this member
    other = tmp_path / "warm.yaml"
    other.write_text("extends: default\ncommand: [sleep, '3600']\npool: {size: 1}\n")
    cold = sbx.create("--profile-file", str(other))
    assert cold["launch"] == "cold" and cold["backend_ref"] != member_ref
    # a TTL longer than the profile allows is refused as ever, warm or not
    refused = sbx("create", "--profile", "warm", "--ttl", "5h")
    assert refused.code == 2 and "longer than profile" in refused.err
    # a name already taken: exit 4, and the member is still warm for the next create
    sbx.create("--profile", "warm", "--name", "taken")
    assert reap(sbx)["pools"][0]["action"] == "warmed"
    (fresh_ref,) = set(members(docker_api, sbx)) - {member_ref}
    clash = sbx("create", "--profile", "warm", "--name", "taken", "--label", RUN_LABEL)
    assert clash.code == 4 and "taken" in clash.err
    assert pool_of(sbx)["ready"] == 1
    assert sbx.create("--profile", "warm")["backend_ref"] == fresh_ref


def test_a_pooled_profiles_setup_runs_before_a_member_is_warm(sbx, docker_api):
    pooled(sbx, size=1, extra="setup: ['echo set-up > /tmp/ready']\n")
    reap(sbx)
    box = sbx.create("--profile", "warm")
    assert box["launch"] == "warm"
    ready = sbx("exec", box["id"], "--", "cat", "/tmp/ready")
    assert (ready.code, ready.out) == (0, "set-up\n")
    types = [e["type"] for e in events_of(sbx, box["id"])]
    assert types[:4] == ["sandbox.creating", "sandbox.exec", "sandbox.warmed", "sandbox.claimed"]
    # a setup that fails: the member is failed and removed, never warm; reap says so
    pooled(sbx, name="broken", size=1, extra="setup: ['exit 3']\n")
    report = sbx("reap", "--json")
    assert report.code == 1 and "exited 3" in report.json()["failed"][0]["error"]
    assert members(docker_api, sbx, "broken") == {}
    assert [r["state"] for r in query(sbx.home, "SELECT state FROM sandboxes WHERE pool = "
                                      "'broken'")] == ["destroyed"]


# -- replaced, shrunk, drained, removed ------------------------------------------------------


def test_members_past_max_age_are_replaced(sbx, docker_api):
    pooled(sbx, size=2, max_age="5m")
    reap(sbx)
    old = set(members(docker_api, sbx))
    report = reap(sbx, env={"SBX_CLOCK_OFFSET": "6m"})
    assert sorted(retired(report).values()) == ["max-age", "max-age"]
    assert len(warmed(report)) == 2
    new = set(members(docker_api, sbx))
    assert len(new) == 2 and not new & old
    reasons = {r["reason"] for r in query(sbx.home, "SELECT reason FROM events WHERE type = "
                                          "'sandbox.destroying'")}
    assert reasons == {"max-age"}


def test_set_size_shrinks_the_pool_now_and_drain_empties_it_until_set_again(sbx, docker_api):
    pooled(sbx, size=3)
    reap(sbx)
    before = members(docker_api, sbx)
    assert len(before) == 3
    done = sbx("pool", "set", "warm", "--size", "1", "--json")
    assert done.code == 0 and done.json()["size"] == 1 and done.json()["size_set"] is True
    assert done.json()["ready"] == 1
    kept = members(docker_api, sbx)  # shrunk before it returned: the youngest went
    assert len(kept) == 1 and set(kept) <= set(before)
    reasons = [r["reason"] for r in query(sbx.home, "SELECT reason FROM events WHERE type = "
                                          "'sandbox.destroying'")]
    assert reasons == ["pool-shrunk", "pool-shrunk"]
    assert reap(sbx).get("pools") is None  # nothing left for the reap to do

    assert sbx("pool", "set", "warm", "--size", "3").code == 0
    assert len(members(docker_api, sbx)) == 3  # filled before it returned
    drained = sbx("pool", "drain", "warm", "--json")
    assert drained.code == 0, drained.err
    assert len(drained.json()["destroyed"]) == 3 and drained.json()["failed"] == []
    assert members(docker_api, sbx) == {}
    assert query(sbx.home, "SELECT id FROM sandboxes WHERE state <> 'destroyed'") == []
    assert reap(sbx).get("pools") is None  # it stays empty...
    assert members(docker_api, sbx) == {}
    assert pool_of(sbx)["size"] == 0
    types = [r["type"] for r in query(sbx.home, "SELECT type FROM events WHERE sandbox_id "
                                      "IS NULL ORDER BY id")]
    assert types == ["pool.resized", "pool.resized", "pool.drained"]
    assert sbx("pool", "set", "warm", "--size", "1").code == 0  # ...until set again
    assert len(members(docker_api, sbx)) == 1


def test_the_members_of_a_pool_that_no_longer_exists_are_removed(sbx, docker_api):
    pooled(sbx, size=2)
    reap(sbx)
    (profiles_folder(sbx) / "warm.yaml").write_text("extends: default\n")  # no pool any more
    report = reap(sbx)
    assert sorted(retired(report).values()) == ["pool-removed", "pool-removed"]
    assert members(docker_api, sbx) == {}
    pooled(sbx, size=1)
    reap(sbx)
    (profiles_folder(sbx) / "warm.yaml").unlink()  # the profile itself gone
    assert sorted(retired(reap(sbx)).values()) == ["pool-removed"]
    assert members(docker_api, sbx) == {}


def test_a_profile_that_changed_gets_new_members_and_a_broken_one_keeps_its_own(sbx,
                                                                              docker_api):
    pooled(sbx, size=1)
    reap(sbx)
    (first,) = members(docker_api, sbx)
    pooled(sbx, size=1, extra="resources: {cpu: 0.5}\n")  # another container: replaced
    report = reap(sbx)
    assert list(retired(report).values()) == ["pool-changed"] and len(warmed(report)) == 1
    (second,) = members(docker_api, sbx)
    assert second != first
    assert sbx.create("--profile", "warm")["backend_ref"] == second
    reap(sbx)
    (third,) = set(members(docker_api, sbx)) - {second}  # a claimed one keeps its labels
    # a typo in the file: the pool is not judged (its member stays), and reap says why
    (profiles_folder(sbx) / "warm.yaml").write_text("extends: default\npool: {size: many}\n")
    report = reap(sbx)
    assert report.get("pools") is None
    assert any(s["id"] == "pool:warm" and "pool.size" in s["error"] for s in report["skipped"])
    assert set(members(docker_api, sbx)) == {second, third}
    assert pool_of(sbx)["members"][0]["state"] == "warm"


# -- bad input -------------------------------------------------------------------------------


def test_bad_pool_fields_and_sizes_exit_2_naming_them_and_change_nothing(sbx, docker_api,
                                                                         tmp_path):
    pooled(sbx, size=1)
    warm_up(sbx)
    bad = tmp_path / "bad.yaml"
    bad.write_text("backend: docker\npool: {size: -2, max_age: never}\n")
    validated = sbx("profiles", "validate", str(bad))
    assert validated.code == 2
    assert f"{bad}: pool.size: " in validated.err and f"{bad}: pool.max_age: " in validated.err

    def state() -> tuple:
        return (table_rows(sbx.home, "sandboxes"), table_rows(sbx.home, "events"),
                table_rows(sbx.home, "pools"),
                containers_of(docker_api, install_id_of(sbx.home)))

    before = state()
    created = sbx("create", "--profile-file", str(bad), "--label", RUN_LABEL)
    assert created.code == 2 and "pool.size" in created.err
    for args, code, said in [
        (("--size", "-1"), 2, "bad size -1"),
        (("--size", "101"), 2, "bad size 101"),
        (("--size", "two"), 2, "'--size'"),
        ((), 2, "--size"),
    ]:
        result = sbx("pool", "set", "warm", *args)
        assert (result.code, said in result.err) == (code, True), result.err
        assert len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err
    as_json = sbx("pool", "set", "warm", "--size", "500", "--json")
    assert as_json.code == 2 and as_json.json()["error"]["kind"] == "bad_input"
    no_pool = sbx("pool", "set", "default", "--size", "1")
    assert no_pool.code == 2 and "declares no pool" in no_pool.err
    assert sbx("pool", "set", "nosuch", "--size", "1").code == 3
    assert sbx("pool", "drain", "nosuch").code == 3
    assert sbx("pool", "drain", "default").code == 3
    assert state() == before


# -- concurrency and crashes -----------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, sbx, tmp_path):
    """The `sbx` runner on SQLite (the test's own SBX_HOME), or on a PostgreSQL database of
    the test's own (SBX_DATABASE_URL)."""
    if request.param == "sqlite":
        return sbx
    return Host(sbx.home, sbx.cwd, request.getfixturevalue("pg_url"), "host-a")


def claimed_events(sbx) -> Counter:
    listed = sbx("events", "--json")
    assert listed.code == 0, listed.err
    return Counter(e["sandbox_id"] for e in listed.json() if e["type"] == "sandbox.claimed")


def test_concurrent_creates_claim_each_member_once_and_the_rest_are_cold(store, docker_api):
    pooled(store, size=3)
    warm_up(store)
    reap(store)
    made = set(members(docker_api, store))
    assert len(made) == 3
    # eight creates stop just before they look for a member, then all go on at once
    procs = [popen(store, "create", "--profile", "warm", "--label", RUN_LABEL, "--json",
                   env={"SBX_FAILPOINT": "claim.before-claim:stop"}) for _ in range(8)]
    wait_until(lambda: all(process_state(p.pid) == "T" for p in procs), 120,
               "every create to reach the claim")
    for proc in procs:
        proc.send_signal(signal.SIGCONT)
    boxes = []
    for proc in procs:
        result = finish(proc)
        assert result.code == 0, result.err
        boxes.append(result.json())
    warm = [b for b in boxes if b["launch"] == "warm"]
    cold = [b for b in boxes if b["launch"] == "cold"]
    assert len(warm) == 3 and len(cold) == 5
    assert sorted(b["backend_ref"] for b in warm) == sorted(made)  # each member once
    assert len({b["backend_ref"] for b in boxes}) == 8 and len({b["id"] for b in boxes}) == 8
    assert claimed_events(store) == {b["id"]: 1 for b in warm}
    assert pool_of(store)["ready"] == 0 and pool_of(store)["claimed"] == 3
    assert store("events", "verify").code == 0


def test_kill_9_between_claim_and_answer_hands_no_member_out_twice_and_leaks_none(
        store, docker_api):
    pooled(store, size=2)
    warm_up(store)
    reap(store)
    made = set(members(docker_api, store))
    crashed = store("create", "--profile", "warm", "--label", RUN_LABEL,
                    env={"SBX_FAILPOINT": "claim.after-claim"})
    assert crashed.code == -signal.SIGKILL, (crashed.code, crashed.err)
    taken = claimed_events(store)
    assert sum(taken.values()) == 1  # the dead create took one member, once
    (dead_claim,) = taken
    # it is a sandbox on the clock like any other (the caller died before the answer)
    row = show(store, dead_claim)
    assert row["state"] == "running" and row["launch"] == "warm"
    after = [store.create("--profile", "warm") for _ in range(2)]
    assert [b["launch"] for b in after] == ["warm", "cold"]  # the other member, then cold
    assert after[0]["backend_ref"] in made and after[0]["id"] != dead_claim
    assert max(claimed_events(store).values()) == 1
    reap(store)  # refilled: two new members beside the two claimed ones and the cold one
    assert len(members(docker_api, store)) == 4
    # past every deadline and max_age, one reap ends every sandbox and replaces the members:
    # what is left on the engine is exactly the new pool, nothing leaked
    final = reap(store, env={"SBX_CLOCK_OFFSET": "5h"})
    assert final["failed"] == []
    assert set(final["destroyed"]) == {dead_claim, after[0]["id"], after[1]["id"]}
    assert sorted(retired(final).values()) == ["max-age", "max-age"]
    pool = pool_of(store)
    refs = {show(store, m["id"])["backend_ref"] for m in pool["members"]}
    assert len(refs) == 2 and all(m["state"] == "warm" for m in pool["members"])
    assert {c["Id"] for c in containers_of(docker_api, install_id_of(store.home))} == refs
    assert store("ls", "--json").json() == []
    assert store("events", "verify").code == 0


def test_a_reaper_killed_while_making_a_member_leaves_nothing_half_made(sbx, docker_api):
    pooled(sbx, size=1)
    warm_up(sbx)
    crashed = sbx("reap", env={"SBX_FAILPOINT": "create.after-backend", "SBX_LEASE_TTL": "1s"})
    assert crashed.code == -signal.SIGKILL, (crashed.code, crashed.err)
    (half,) = query(sbx.home, "SELECT id, state FROM sandboxes")
    assert half["state"] == "creating" and len(members(docker_api, sbx)) == 1
    (half_ref,) = members(docker_api, sbx)
    time.sleep(1.5)  # the dead reaper's lease lapses
    first = reap(sbx)  # the member is failed (its setup may not have run), never warm,
    # and its container removed in the same step
    assert half_ref not in members(docker_api, sbx)
    assert query(sbx.home, "SELECT state FROM sandboxes WHERE id = ?", half["id"]) == [
        {"state": "destroyed"}]
    assert sbx.create("--profile", "warm")["launch"] == "warm"  # the member made since
    second = reap(sbx)
    states = Counter(r["state"] for r in query(sbx.home, "SELECT state FROM sandboxes"))
    assert states["creating"] == 0 and states["destroying"] == 0
    assert first["failed"] == [] and second["failed"] == []
    assert sbx("events", "verify").code == 0
