"""The reliability guarantees (docs/reliability.md), against the real Docker engine and
the real `sbx` CLI in subprocesses.

Time is moved with `SBX_CLOCK_OFFSET` (a process sees the future), crashes are made exact with
`SBX_FAILPOINT`, and concurrency is real: several `sbx` processes started with Popen at once.
Every container here carries this test's installation label (so the `sbx` fixture removes it)
or, when made directly on the engine, the run label, and is removed by id in a `finally`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import docker
import pytest
from support import (
    RUN_ID,
    RUN_LABEL,
    SBX,
    Result,
    containers_of,
    events_of,
    install_id_of,
    one_json,
    query,
    show,
    table_rows,
    write_profile,
)

from sandboxer.adapters.docker import BASE_IMAGE, KEEPALIVE

pytestmark = pytest.mark.docker

REAP_KEYS = {"destroyed", "failed", "orphans", "skipped"}


# -- helpers --------------------------------------------------------------------------------


def popen(sbx, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start the real `sbx` without waiting for it (for races)."""
    return subprocess.Popen([*SBX, *args], cwd=sbx.cwd, env=sbx.env(env), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen, timeout: float = 120) -> Result:
    out, err = proc.communicate(timeout=timeout)
    return Result(proc.returncode, out, err)


def warm_up(sbx) -> None:
    """Make the installation's database (and id) before anything runs in parallel."""
    result = sbx("ls", "--json")
    assert result.code == 0, result.err


def create_many(sbx, count: int, *args: str) -> list[dict]:
    """`count` sandboxes, created by concurrent `sbx create` processes."""
    warm_up(sbx)
    procs = [popen(sbx, "create", "--label", RUN_LABEL, *args, "--json") for _ in range(count)]
    boxes = []
    for proc in procs:
        result = finish(proc)
        assert result.code == 0, result.err or result.out
        boxes.append(result.json())
    return boxes


def row_of(home: Path, sandbox_id: str) -> dict:
    rows = query(home, "SELECT * FROM sandboxes WHERE id = ?", sandbox_id)
    assert rows, f"no row for {sandbox_id}"
    return rows[0]


def state_of(home: Path, sandbox_id: str) -> str:
    return row_of(home, sandbox_id)["state"]


def snapshot(home: Path) -> dict[str, list[tuple]]:
    """Every row of the tables a command could write."""
    return {t: table_rows(home, t) for t in ("sandboxes", "events", "checkpoints")}


def of_type(events: list[dict], type_: str) -> list[dict]:
    return [e for e in events if e["type"] == type_]


def reap(sbx, *args: str, offset: str | None = None, env: dict[str, str] | None = None,
         timeout: float = 120) -> Result:
    extra = dict(env or {})
    if offset:
        extra["SBX_CLOCK_OFFSET"] = offset
    return sbx("reap", *args, env=extra, timeout=timeout)


def reap_ok(sbx, *args: str, offset: str | None = None,
            env: dict[str, str] | None = None) -> dict:
    """`sbx reap --json` that must succeed; its report."""
    result = reap(sbx, *args, "--json", offset=offset, env=env)
    assert result.code == 0, (result.code, result.out, result.err)
    report = result.json()
    assert report["failed"] == [], report
    return report


def exists(docker_api, ref: str) -> bool:
    try:
        docker_api.inspect_container(ref)
        return True
    except docker.errors.NotFound:
        return False


def running(docker_api, ref: str) -> bool:
    try:
        return bool(docker_api.inspect_container(ref)["State"]["Running"])
    except docker.errors.NotFound:
        return False


def integrity_ok(home: Path) -> None:
    assert query(home, "PRAGMA integrity_check") == [{"integrity_check": "ok"}]


def chain_verifies(sbx) -> None:
    result = sbx("events", "verify")
    assert result.code == 0, (result.out, result.err)


def assert_alive(sbx, docker_api, box: dict) -> None:
    """The sandbox is running, in the database and on the engine."""
    assert state_of(sbx.home, box["id"]) == "running"
    assert running(docker_api, box["backend_ref"])


def assert_reap_keeps(sbx, docker_api, box: dict, offset: str) -> None:
    """A reap at +offset succeeds and leaves the sandbox running."""
    result = reap(sbx, offset=offset)
    assert result.code == 0, result.err
    assert_alive(sbx, docker_api, box)


def assert_reap_destroys(sbx, docker_api, box: dict, offset: str, reason: str) -> None:
    """A reap at +offset succeeds and destroys the sandbox, in the database and on the engine,
    with one destroying and one destroyed event, both for `reason`."""
    result = reap(sbx, offset=offset)
    assert result.code == 0, result.err
    assert state_of(sbx.home, box["id"]) == "destroyed"
    assert not exists(docker_api, box["backend_ref"])
    events = events_of(sbx, box["id"])
    types = [e["type"] for e in events]
    assert [e["reason"] for e in of_type(events, "sandbox.destroying")] == [reason], types
    assert [e["reason"] for e in of_type(events, "sandbox.destroyed")] == [reason], types


def wait_until(predicate, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def process_state(pid: int) -> str | None:
    """The one-letter state of a process from /proc (T = stopped), or None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return text.rsplit(")", 1)[1].split()[0]


# == 1. Never destroyed before its deadline =================================================


def test_ttl_sandbox_survives_before_its_deadline_and_is_reaped_after(sbx, docker_api):
    box = sbx.create("--ttl", "10m")

    assert_reap_keeps(sbx, docker_api, box, offset="9m")
    assert of_type(events_of(sbx, box["id"]), "sandbox.destroying") == []

    assert_reap_destroys(sbx, docker_api, box, offset="11m", reason="ttl")
    assert show(sbx, box["id"])["state"] == "destroyed"


def test_idle_limit_touch_keeps_it_alive_then_reaped_as_idle(sbx, docker_api, tmp_path):
    path = write_profile(tmp_path, "idler", "extends: default\nttl:\n  idle: 5m\n")
    box = sbx.create("--profile-file", str(path))
    assert box["idle_timeout_s"] == 300

    touched = sbx("touch", box["id"], env={"SBX_CLOCK_OFFSET": "4m"})
    assert touched.code == 0, touched.err

    # Idle since +4m: at +8m it has been idle 4m, under the 5m limit.
    assert_reap_keeps(sbx, docker_api, box, offset="8m")
    assert_reap_destroys(sbx, docker_api, box, offset="9m30s", reason="idle")


def test_extend_never_shortens_caps_at_hard_deadline_and_max_ttl_reap(sbx, docker_api):
    box = sbx.create("--ttl", "10m")
    hard = box["hard_deadline"]

    plain = sbx("extend", box["id"], "20m", "--json")
    assert plain.code == 0, plain.err
    assert plain.err == ""
    after_plain = plain.json()
    assert after_plain["capped"] is False
    assert after_plain["deadline"] > box["deadline"]
    assert after_plain["hard_deadline"] == hard

    capped = sbx("extend", box["id"], "5h")
    assert capped.code == 0, capped.err
    assert "capped at the hard deadline" in capped.err, capped.err
    assert hard in capped.err
    at_max = show(sbx, box["id"])
    assert at_max["deadline"] == hard
    assert at_max["deadline"] >= after_plain["deadline"]

    again = sbx("extend", box["id"], "1m", "--json")
    assert again.code == 0, again.err
    assert again.json()["capped"] is True
    assert again.json()["deadline"] == hard  # not earlier, not later
    extends = of_type(events_of(sbx, box["id"]), "sandbox.extended")
    assert [e["payload"]["capped"] for e in extends] == [False, True, True]
    assert all(e["payload"]["to"] >= e["payload"]["from"] for e in extends)

    # 3h59m: past every soft deadline it ever had, but not the hard one.
    assert_reap_keeps(sbx, docker_api, box, offset="3h59m")
    assert_reap_destroys(sbx, docker_api, box, offset="4h1m", reason="max-ttl")


def test_extend_and_reap_refuse_bad_input_and_write_nothing(sbx, docker_api):
    live, dead = sbx.create("--ttl", "10m"), sbx.create("--ttl", "10m")
    assert sbx("destroy", dead["id"]).code == 0

    before = snapshot(sbx.home)
    refused = sbx("extend", dead["id"], "10m")
    assert refused.code == 4, (refused.out, refused.err)
    assert len(refused.err.strip().splitlines()) == 1, refused.err
    for bad in ("0s", "abc", "10x", "-5m", "1m1h"):
        result = sbx("extend", live["id"], bad)
        assert result.code == 2, (bad, result.out, result.err)
        assert len(result.err.strip().splitlines()) == 1, result.err
    every = sbx("reap", "--every", "0s")
    assert every.code == 2, (every.out, every.err)
    assert snapshot(sbx.home) == before
    assert running(docker_api, live["backend_ref"])


# == 2. Extend racing reap never loses the sandbox ===========================================


def test_extend_racing_reap_never_loses_the_sandbox(sbx, docker_api):
    outcomes: Counter[str] = Counter()
    warm_up(sbx)
    for i in range(16):
        box = sbx.create("--ttl", "1m")
        env = {"SBX_CLOCK_OFFSET": "61s"}
        if i % 2:
            ext = popen(sbx, "extend", box["id"], "10m", env=env)
            rep = popen(sbx, "reap", "--json", env=env)
        else:
            rep = popen(sbx, "reap", "--json", env=env)
            ext = popen(sbx, "extend", box["id"], "10m", env=env)
        reaped, extended = finish(rep), finish(ext)

        assert reaped.code == 0, (i, reaped.out, reaped.err)
        assert "database is locked" not in reaped.err + extended.err
        state = state_of(sbx.home, box["id"])
        if extended.code == 0:
            outcomes["extended"] += 1
            assert state == "running", (i, state)
            assert running(docker_api, box["backend_ref"]), i
            assert box["id"] not in reaped.json()["destroyed"]
        elif extended.code == 4:
            outcomes["reaped"] += 1
            assert state == "destroyed", (i, state)
            assert not exists(docker_api, box["backend_ref"]), i
            assert box["id"] in reaped.json()["destroyed"]
        else:
            raise AssertionError(f"round {i}: extend exited {extended.code}: {extended.err}")
    print(f"extend-vs-reap outcomes: {dict(outcomes)}")
    assert sum(outcomes.values()) == 16
    assert query(sbx.home, "SELECT id FROM sandboxes WHERE state IN ('creating', 'destroying')") == []
    chain_verifies(sbx)


# == 3. Concurrent reapers: each sandbox destroyed exactly once ==============================


def test_concurrent_reapers_destroy_each_sandbox_exactly_once(sbx, docker_api):
    boxes = create_many(sbx, 30, "--ttl", "1m")
    install = install_id_of(sbx.home)
    refs = {b["backend_ref"] for b in boxes}
    assert len(refs) == 30

    since = int(time.time()) - 1
    reapers = [popen(sbx, "reap", "--json", env={"SBX_CLOCK_OFFSET": "2m"}) for _ in range(4)]
    results = [finish(p) for p in reapers]
    until = int(time.time()) + 2

    for result in results:
        assert result.code == 0, (result.out, result.err)
        assert "database is locked" not in result.err
        assert result.json()["failed"] == []
    reported = [sid for r in results for sid in r.json()["destroyed"]]
    assert sorted(reported) == sorted(b["id"] for b in boxes), "each reported destroyed once"

    destroys = Counter(
        ev["Actor"]["ID"]
        for ev in docker_api.events(
            decode=True, since=since, until=until,
            filters={"label": [f"sbx.install={install}"], "type": "container",
                     "event": "destroy"})
    )
    assert set(destroys) == refs
    assert all(n == 1 for n in destroys.values()), destroys
    assert containers_of(docker_api, install) == []

    states = Counter(r["state"] for r in query(sbx.home, "SELECT state FROM sandboxes"))
    assert states == {"destroyed": 30}
    for type_ in ("sandbox.destroying", "sandbox.destroyed"):
        per_box = Counter(r["sandbox_id"] for r in query(
            sbx.home, "SELECT sandbox_id FROM events WHERE type = ?", type_))
        assert per_box == {b["id"]: 1 for b in boxes}, type_
    chain_verifies(sbx)


# == 4. kill -9 at every failpoint: the next reaps finish the job ============================


CRASHES = [
    ("create.after-intent", "create"),
    ("create.after-backend", "create"),
    ("destroy.after-intent", "destroy"),
    ("destroy.after-backend", "destroy"),
    ("destroy.after-intent", "reap"),
    ("destroy.after-backend", "reap"),
]


@pytest.mark.parametrize(("point", "command"), CRASHES, ids=[f"{c}-{p}" for p, c in CRASHES])
def test_kill_9_at_a_failpoint_leaves_nothing_behind(sbx, docker_api, point, command):
    warm_up(sbx)
    install = install_id_of(sbx.home)
    crash_env = {"SBX_FAILPOINT": point, "SBX_LEASE_TTL": "1s"}
    recover_env = {"SBX_RECONCILE_GRACE": "1s"}

    if command == "create":
        crashed = sbx("create", "--label", RUN_LABEL, "--ttl", "10m", env=crash_env)
        rows = query(sbx.home, "SELECT * FROM sandboxes")
        assert len(rows) == 1
        sandbox_id = rows[0]["id"]
    else:
        box = sbx.create("--ttl", "10m")
        sandbox_id = box["id"]
        if command == "destroy":
            crashed = sbx("destroy", sandbox_id, env=crash_env)
        else:  # a reaper past the deadline
            crashed = reap(sbx, offset="11m", env=crash_env)
    assert crashed.code == -signal.SIGKILL, (crashed.code, crashed.out, crashed.err)
    assert state_of(sbx.home, sandbox_id) == ("creating" if command == "create" else "destroying")
    integrity_ok(sbx.home)

    time.sleep(1.5)  # the dead process's lease (1s) and the reconcile grace (1s) pass
    if command == "create":
        # The next reap reconciles now, before any deadline.
        reap_ok(sbx, env=recover_env)
        objects = containers_of(docker_api, install)
        if point == "create.after-backend":
            # The half-made container is adopted as running (it has a deadline): not a leak.
            assert state_of(sbx.home, sandbox_id) == "running"
            assert len(objects) == 1 and objects[0]["State"] == "running"
            assert objects[0]["Labels"]["sbx.id"] == sandbox_id
        else:
            assert state_of(sbx.home, sandbox_id) == "failed"
            assert objects == []

    # A reap past the deadline (and past a crashed reaper's lease, taken at +11m).
    reap_ok(sbx, offset="12m", env=recover_env)

    assert containers_of(docker_api, install) == []
    assert query(sbx.home,
                 "SELECT id, state FROM sandboxes WHERE state IN ('creating', 'destroying')") == []
    # every one ends destroyed (a failed create too, reason failed, settled past the grace)
    assert state_of(sbx.home, sandbox_id) == "destroyed"
    destroyed = query(sbx.home, "SELECT * FROM events WHERE type = 'sandbox.destroyed'")
    assert len(destroyed) == 1
    integrity_ok(sbx.home)
    chain_verifies(sbx)


def test_interrupted_create_is_destroyed_by_the_first_reap_past_its_deadline(sbx, docker_api):
    """Guarantee 2 read literally: a create killed after the backend made the container, then
    no reap until after the deadline. The next completed reap must leave no container: it may
    adopt the sandbox, but it must not leave it running past its deadline for another cycle."""
    warm_up(sbx)
    install = install_id_of(sbx.home)
    crashed = sbx("create", "--label", RUN_LABEL, "--ttl", "10m",
                  env={"SBX_FAILPOINT": "create.after-backend", "SBX_LEASE_TTL": "1s"})
    assert crashed.code == -signal.SIGKILL, (crashed.code, crashed.err)
    (sandbox_id,) = [r["id"] for r in query(sbx.home, "SELECT id FROM sandboxes")]
    time.sleep(1.5)

    reap_ok(sbx, offset="12m", env={"SBX_RECONCILE_GRACE": "1s"})
    assert containers_of(docker_api, install) == [], "an expired container outlived a reap"
    assert state_of(sbx.home, sandbox_id) == "destroyed"


def test_kill_9_during_setup_is_failed_by_reconcile_never_made_running(sbx, docker_api,
                                                                       tmp_path):
    """A sandbox says creating while its profile's setup runs: killed between two setup
    commands, reconcile fails it (its setup may not have finished) and reap removes its
    container; it is never made running half set up."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    write_profile(folder, "prepared", "backend: docker\n"
                  "setup: ['touch /tmp/first', 'touch /tmp/second']\n")
    env = {"SBX_PROFILE_PATH": str(folder)}
    crashed = sbx("create", "--profile", "prepared", "--label", RUN_LABEL,
                  env={**env, "SBX_FAILPOINT": "create.during-setup"})
    assert crashed.code == -signal.SIGKILL, (crashed.code, crashed.err)
    (row,) = query(sbx.home, "SELECT * FROM sandboxes")
    assert row["state"] == "creating" and row["backend_ref"]
    reap_ok(sbx, env=env)  # its maker is dead: failed at once, and its container removed
    reap_ok(sbx, env=env)
    settled = query(sbx.home, "SELECT state, error, started_at FROM sandboxes")
    assert settled == [{"state": "destroyed", "started_at": None,
                        "error": "the process making it stopped before it was ready"}]
    assert containers_of(docker_api, install_id_of(sbx.home)) == []
    chain_verifies(sbx)


# == 5. A reaper paused past its lease cannot commit its stale result ========================


def test_reaper_paused_past_its_lease_cannot_commit(sbx, docker_api):
    box = sbx.create("--ttl", "1m")
    sandbox_id = box["id"]
    reaper_a = popen(sbx, "reap", "--json", env={
        "SBX_CLOCK_OFFSET": "2m", "SBX_FAILPOINT": "destroy.after-backend:stop",
        "SBX_LEASE_TTL": "2s"})
    try:
        wait_until(lambda: process_state(reaper_a.pid) == "T", 30, "reaper A to stop itself")
        # A removed the container and stopped before recording it.
        assert not exists(docker_api, box["backend_ref"])
        held = row_of(sbx.home, sandbox_id)
        assert held["state"] == "destroying" and held["lease_owner"]
        a_fence = held["fence"]

        time.sleep(2.5)  # A's lease (2s) runs out while it is stopped
        reaper_b = reap(sbx, "--json", offset="2m")
        assert reaper_b.code == 0, (reaper_b.out, reaper_b.err)
        done = row_of(sbx.home, sandbox_id)
        assert done["state"] == "destroyed"
        assert done["fence"] > a_fence
        b_fence = done["fence"]
    finally:
        if reaper_a.poll() is None:
            os.kill(reaper_a.pid, signal.SIGCONT)
    result_a = finish(reaper_a, timeout=60)

    # A resumes with a stale lease: it reports the sandbox as skipped and writes nothing.
    assert result_a.code == 0, (result_a.code, result_a.out, result_a.err)
    report_a = result_a.json()
    assert sandbox_id not in report_a["destroyed"]
    skipped = [s for s in report_a["skipped"] if s["id"] == sandbox_id]
    assert skipped and "took it over" in skipped[0]["error"], report_a

    final = row_of(sbx.home, sandbox_id)
    assert final["state"] == "destroyed"
    assert final["fence"] == b_fence
    assert final["lease_owner"] is None
    events = events_of(sbx, sandbox_id)
    assert len(of_type(events, "sandbox.destroyed")) == 1, [e["type"] for e in events]
    assert len(of_type(events, "sandbox.destroying")) == 1
    chain_verifies(sbx)
    integrity_ok(sbx.home)


# == 6. Reconcile touches only this installation's objects ===================================


def make_foreign(docker_api, labels: dict[str, str]) -> str:
    created = docker_api.create_container(
        image=BASE_IMAGE, command=list(KEEPALIVE), labels={"sbx-test-run": RUN_ID, **labels},
        host_config=docker_api.create_host_config(network_mode="none"), detach=True)
    docker_api.start(created["Id"])
    return created["Id"]


def test_reconcile_and_orphan_sweep_leave_other_installations_alone(sbx, docker_api):
    foreign: list[str] = []
    try:
        foreign.append(make_foreign(docker_api, {
            "sbx.install": f"inst-other-{uuid.uuid4().hex[:12]}",
            "sbx.id": f"sbx-{uuid.uuid4().hex[:26]}",
            "sbx.hard-deadline": "2020-01-01T00:00:00.000000Z",
        }))
        foreign.append(make_foreign(docker_api, {}))
        mine = sbx.create("--ttl", "10m")

        reconciled = sbx("reconcile", "--json", env={"SBX_RECONCILE_GRACE": "1s"})
        assert reconciled.code == 0, reconciled.err
        swept = reap(sbx, "--orphans", "--json", offset="5h",
                     env={"SBX_RECONCILE_GRACE": "1s"})
        assert swept.code == 0, swept.err
        # Our own sandbox was past its hard deadline at +5h and went...
        assert state_of(sbx.home, mine["id"]) == "destroyed"
        assert not exists(docker_api, mine["backend_ref"])
        # ...the others' containers did not.
        for ref in foreign:
            assert running(docker_api, ref), ref
        report = swept.json()
        assert all(ref not in json.dumps(report) for ref in foreign)
        again = sbx("reconcile", env={"SBX_CLOCK_OFFSET": "5h", "SBX_RECONCILE_GRACE": "1s"})
        assert again.code == 0, again.err
        for ref in foreign:
            assert running(docker_api, ref), ref
    finally:
        for ref in foreign:
            docker_api.remove_container(ref, force=True, v=True)


def test_unreadable_database_means_nothing_destructive(sbx, docker_api):
    boxes = create_many(sbx, 2, "--ttl", "1m")
    db = sbx.home / "sbx.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    with open(db, "r+b") as f:  # overwrite the SQLite header
        f.write(b"this is not a database at all!!!" * 4)

    for args in (("reap",), ("reap", "--orphans"), ("reconcile",)):
        result = sbx(*args, env={"SBX_CLOCK_OFFSET": "5h", "SBX_RECONCILE_GRACE": "1s"})
        assert result.code == 5, (args, result.code, result.out, result.err)
        assert result.out == ""
        assert len(result.err.strip().splitlines()) == 1, (args, result.err)
        for box in boxes:
            assert running(docker_api, box["backend_ref"]), (args, box["id"])


# == 7. Out-of-band changes: one reconcile notices, a second changes nothing =================


def reconcile_json(sbx) -> dict:
    result = sbx("reconcile", "--json")
    assert result.code == 0, (result.out, result.err)
    return result.json()


def assert_nothing_to_do(report: dict) -> None:
    assert not any(report.values()), report  # every list (and the reasons) empty


def test_out_of_band_changes_are_noticed_once(sbx, docker_api):
    removed, stopped, paused = create_many(sbx, 3)
    docker_api.remove_container(removed["backend_ref"], force=True)
    docker_api.stop(stopped["backend_ref"], timeout=10)
    docker_api.pause(paused["backend_ref"])
    before = {b["id"]: row_of(sbx.home, b["id"])["fence"] for b in (removed, stopped, paused)}

    first = reconcile_json(sbx)
    assert first["failed"] == []
    assert {r["id"]: r["state"] for r in first["reconciled"]} == {
        removed["id"]: "lost", stopped["id"]: "lost", paused["id"]: "paused"}
    assert state_of(sbx.home, removed["id"]) == "lost"
    assert state_of(sbx.home, stopped["id"]) == "lost"
    assert state_of(sbx.home, paused["id"]) == "paused"
    assert show(sbx, paused["id"])["state"] == "paused"
    assert [e["type"] for e in events_of(sbx, paused["id"])][-1] == "sandbox.paused"
    assert [e["type"] for e in events_of(sbx, removed["id"])][-1] == "sandbox.lost"

    snap = snapshot(sbx.home)
    assert_nothing_to_do(reconcile_json(sbx))
    assert snapshot(sbx.home) == snap

    docker_api.unpause(paused["backend_ref"])
    resumed = reconcile_json(sbx)
    assert {r["id"]: r["state"] for r in resumed["reconciled"]} == {paused["id"]: "running"}
    assert state_of(sbx.home, paused["id"]) == "running"
    assert [e["type"] for e in events_of(sbx, paused["id"])][-1] == "sandbox.resumed"

    snap = snapshot(sbx.home)
    assert_nothing_to_do(reconcile_json(sbx))
    assert snapshot(sbx.home) == snap
    assert all(row_of(sbx.home, sid)["fence"] > fence for sid, fence in before.items())
    chain_verifies(sbx)


# == 8. Database deleted: the orphan sweep still ends what is past its hard deadline =========


def test_orphan_sweep_without_database_uses_hard_deadline_labels(sbx, docker_api, tmp_path):
    old = sbx.create()  # default profile: max 4h
    path = write_profile(tmp_path, "long", "extends: default\nttl:\n  max: 8h\n")
    young = sbx.create("--profile-file", str(path))
    for suffix in ("", "-wal", "-shm"):
        (sbx.home / f"sbx.db{suffix}").unlink(missing_ok=True)

    swept = reap(sbx, "--orphans", "--json", offset="5h")
    assert swept.code == 0, (swept.out, swept.err)
    assert swept.json()["orphans"] == [old["id"]]
    assert not exists(docker_api, old["backend_ref"])
    assert running(docker_api, young["backend_ref"])

    # Reconcile may adopt the younger one (it is ours, before its hard deadline): it stays.
    again = sbx("reconcile", env={"SBX_CLOCK_OFFSET": "5h"})
    assert again.code == 0, again.err
    swept_again = reap(sbx, "--orphans", offset="5h")
    assert swept_again.code == 0, swept_again.err
    assert running(docker_api, young["backend_ref"])


# == 9. Cron-safety ==========================================================================


def test_reap_with_nothing_to_do_is_silent_and_json_is_one_object(sbx):
    fresh = sbx("reap")
    assert (fresh.code, fresh.out, fresh.err) == (0, "", "")

    sbx.create("--ttl", "30m")
    quiet = sbx("reap")
    assert (quiet.code, quiet.out, quiet.err) == (0, "", "")

    as_json = sbx("reap", "--json")
    assert as_json.code == 0, as_json.err
    assert as_json.err == ""
    report = one_json(as_json.out)
    assert isinstance(report, dict)
    assert REAP_KEYS <= set(report), report
    assert all(report[k] == [] for k in REAP_KEYS), report


def test_reap_with_engine_unreachable_exits_5_with_one_line(sbx, docker_api):
    box = sbx.create("--ttl", "1m")
    nope = f"/tmp/nope-{uuid.uuid4().hex}.sock"
    assert not Path(nope).exists()
    result = reap(sbx, offset="2m", env={"DOCKER_HOST": f"unix://{nope}"})
    assert result.code == 5, (result.code, result.out, result.err)
    assert result.out == ""
    assert len(result.err.strip().splitlines()) == 1, result.err
    assert_alive(sbx, docker_api, box)


class SilentEngine:
    """A unix socket that accepts connections and never answers: an engine that hangs."""

    def __init__(self) -> None:
        self.path = f"/tmp/sbx-silent-{uuid.uuid4().hex[:12]}.sock"
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(64)
        self.server.settimeout(0.1)
        self.held: list[socket.socket] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        for conn in self.held:
            conn.close()
        self.server.close()
        Path(self.path).unlink(missing_ok=True)


def test_reap_timeout_bounds_the_run(sbx, docker_api):
    box = sbx.create("--ttl", "1m")
    engine = SilentEngine()
    try:
        started = time.monotonic()
        result = reap(sbx, "--timeout", "2s", offset="2m",
                      env={"DOCKER_HOST": f"unix://{engine.path}"}, timeout=150)
        elapsed = time.monotonic() - started
    finally:
        engine.close()
    assert result.code == 1, (result.code, result.out, result.err)
    assert "timed out" in result.err
    assert len(result.err.strip().splitlines()) == 1, result.err
    assert elapsed < 10, f"`sbx reap --timeout 2s` took {elapsed:.1f}s"
    assert_alive(sbx, docker_api, box)


def test_reap_every_keeps_running_and_stops_cleanly_on_sigterm(sbx):
    sbx.create("--ttl", "30m")
    proc = popen(sbx, "reap", "--every", "1s", "--json")
    try:
        # two cycles reported (however long the start takes on a busy machine), then SIGTERM
        seen = [proc.stdout.readline() for _ in range(2)]
        assert all(line.strip() for line in seen), (seen, proc.poll())
        assert proc.poll() is None, "reap --every exited on its own"
        proc.send_signal(signal.SIGTERM)
        result = finish(proc, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert result.code == 0, (result.code, result.out, result.err)
    assert result.err == ""
    cycles = [json.loads(line) for line in [*seen, *result.out.splitlines()] if line.strip()]
    assert len(cycles) >= 2, result.out
    for report in cycles:
        assert REAP_KEYS <= set(report)
        assert report["failed"] == []


# == 10. The expiry warning ==================================================================


def test_expiry_warning_once_per_deadline_and_again_after_extend(sbx, docker_api):
    warn = {"SBX_EXPIRY_WARNING": "5m"}
    box = sbx.create("--ttl", "10m")

    first = reap_ok(sbx, offset="6m", env=warn)
    assert first["warned"] == [box["id"]]
    expiring = of_type(events_of(sbx, box["id"]), "sandbox.expiring")
    assert len(expiring) == 1
    assert expiring[0]["payload"]["deadline"] == box["deadline"]

    second = reap_ok(sbx, offset="7m", env=warn)
    assert second["warned"] == []
    assert len(of_type(events_of(sbx, box["id"]), "sandbox.expiring")) == 1

    extended = sbx("extend", box["id"], "10m", "--json")
    assert extended.code == 0, extended.err
    new_deadline = extended.json()["deadline"]

    third = reap_ok(sbx, offset="16m", env=warn)
    assert third["warned"] == [box["id"]]
    assert third["destroyed"] == []
    expiring = of_type(events_of(sbx, box["id"]), "sandbox.expiring")
    assert len(expiring) == 2
    assert expiring[1]["payload"]["deadline"] == new_deadline
    assert_alive(sbx, docker_api, box)


# == 11. A dead lease holder is taken over at once; a live one is not ========================


@pytest.mark.parametrize("point", ["create.after-intent", "create.after-backend"])
def test_a_create_killed_9_is_recovered_by_the_next_reap_at_once(sbx, docker_api, point):
    """No clock offset, the default lease (2m) and reconcile grace (60s): the lease's holder
    is a process of this host that no longer exists, so its lease has lapsed already."""
    warm_up(sbx)
    install = install_id_of(sbx.home)
    crashed = sbx("create", "--label", RUN_LABEL, "--ttl", "10m", env={"SBX_FAILPOINT": point})
    assert crashed.code == -signal.SIGKILL, (crashed.code, crashed.out, crashed.err)
    (row,) = query(sbx.home, "SELECT * FROM sandboxes")
    assert row["state"] == "creating"
    assert row["lease_owner"] and row["lease_expires_at"] > show(sbx, row["id"])["created_at"]

    report = reap_ok(sbx)
    objects = containers_of(docker_api, install)
    if point == "create.after-backend":  # the container it made is adopted as running
        assert state_of(sbx.home, row["id"]) == "running", report
        assert [o["Labels"]["sbx.id"] for o in objects] == [row["id"]]
        assert objects[0]["State"] == "running"
    else:  # it made nothing: the create failed
        assert state_of(sbx.home, row["id"]) == "failed", report
        assert objects == []
    assert row_of(sbx.home, row["id"])["lease_owner"] is None
    chain_verifies(sbx)


def test_a_live_process_keeps_its_lease(sbx, docker_api):
    """A create stopped (SIGSTOP) after writing its intent is alive: reap and reconcile
    leave its row alone, and once continued it finishes the create itself."""
    warm_up(sbx)
    proc = popen(sbx, "create", "--label", RUN_LABEL, "--ttl", "10m", "--json",
                 env={"SBX_FAILPOINT": "create.after-intent:stop"})
    try:
        wait_until(lambda: process_state(proc.pid) == "T", 30, "the create to stop itself")
        (before,) = query(sbx.home, "SELECT * FROM sandboxes")
        assert before["state"] == "creating"
        reap_ok(sbx)
        reconciled = sbx("reconcile", "--json")
        assert reconciled.code == 0, reconciled.err
        assert row_of(sbx.home, before["id"]) == before  # same state, lease and fence
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
    result = finish(proc)
    assert result.code == 0, (result.code, result.out, result.err)
    box = result.json()
    assert box["id"] == before["id"]
    assert_alive(sbx, docker_api, box)


# == 12. A failed sandbox is settled by reap, once ===========================================


def mark_failed(home: Path, sandbox_id: str, error: str) -> None:
    """Record what Manager.create records when the backend call fails after the engine made
    the container (a create that gave up while the engine went on): failed, its error, ended,
    no lease."""
    with sqlite3.connect(home / "sbx.db") as conn:
        conn.execute("UPDATE sandboxes SET state = 'failed', error = ?, ended_at = "
                     "strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), lease_owner = NULL, "
                     "lease_expires_at = NULL WHERE id = ?", (error, sandbox_id))
    conn.close()


def reported(report: dict, sandbox_id: str) -> list:
    """Every entry of a reap report that names this sandbox."""
    return [entry for key in ("destroyed", "failed", "orphans", "skipped", "reconciled",
                              "warned")
            for entry in report[key]
            if sandbox_id in (entry, entry.get("id") if isinstance(entry, dict) else None)]


def assert_settled_as_failed(sbx, sandbox_id: str, error: str) -> None:
    """Destroyed with reason failed, the row and its error kept: out of `ls`, in `ls --all`."""
    row = row_of(sbx.home, sandbox_id)
    assert (row["state"], row["error"]) == ("destroyed", error)
    events = events_of(sbx, sandbox_id)
    assert [e["reason"] for e in of_type(events, "sandbox.destroying")] == ["failed"]
    assert len(of_type(events, "sandbox.destroyed")) == 1
    assert sandbox_id not in {b["id"] for b in sbx("ls", "--json").json()}
    (kept,) = [b for b in sbx("ls", "--all", "--json").json() if b["id"] == sandbox_id]
    assert (kept["state"], kept["error"]) == ("destroyed", error)


def test_a_failed_sandbox_with_a_container_is_settled_by_reap_and_then_left_alone(sbx,
                                                                                 docker_api):
    box = sbx.create("--ttl", "10m")
    other = sbx.create("--ttl", "10m")  # a running one beside it: reap leaves it alone
    mark_failed(sbx.home, box["id"], "docker refused to start it")
    assert exists(docker_api, box["backend_ref"])

    first = reap_ok(sbx)
    assert not exists(docker_api, box["backend_ref"])  # by id, on the engine
    assert [(e["action"], e["reason"], e["state"]) for e in reported(first, box["id"])] == [
        ("destroy", "failed", "destroyed")]
    assert_settled_as_failed(sbx, box["id"], "docker refused to start it")
    assert_alive(sbx, docker_api, other)

    for offset in (None, "5m", "11m"):  # settled: no reap counts it again, due or not
        assert reported(reap_ok(sbx, offset=offset), box["id"]) == []
    assert_settled_as_failed(sbx, box["id"], "docker refused to start it")
    chain_verifies(sbx)


def test_a_failed_sandbox_without_an_object_is_settled_once_after_the_grace(sbx, docker_api):
    """A create killed before the backend was asked: reconcile fails it; it needs nothing
    removed, and once the grace has passed one reap settles it, and no later one counts it."""
    warm_up(sbx)
    crashed = sbx("create", "--label", RUN_LABEL, "--ttl", "10m",
                  env={"SBX_FAILPOINT": "create.after-intent"})
    assert crashed.code == -signal.SIGKILL, (crashed.code, crashed.err)
    (row,) = query(sbx.home, "SELECT * FROM sandboxes")
    first = reap_ok(sbx)  # its maker is dead: failed at once
    assert [e["action"] for e in reported(first, row["id"])] == ["fail"]
    assert state_of(sbx.home, row["id"]) == "failed"
    # within the grace (60s) it stays failed, in `ls`, for whoever looks now
    assert reported(reap_ok(sbx), row["id"]) == []
    assert [b["state"] for b in sbx("ls", "--json").json()] == ["failed"]

    settled = reap_ok(sbx, offset="2m")
    assert [(e["action"], e["reason"], e["state"]) for e in reported(settled, row["id"])] == [
        ("destroy", "failed", "destroyed")]
    assert_settled_as_failed(sbx, row["id"],
                             "the process making it stopped before it was ready")
    for offset in ("3m", "11m", "5h"):
        assert reported(reap_ok(sbx, offset=offset), row["id"]) == []
    assert containers_of(docker_api, install_id_of(sbx.home)) == []
    chain_verifies(sbx)
