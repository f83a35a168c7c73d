"""A reap cycle between full looks (docs/reliability.md, "Reap cycles between full looks").

After a full look that found nothing to do, the reaper notes the database's change
fingerprint and each backend's change marker in the installation's folder
(`reconcile-mark-*.json`). While both stay the same, and the note is younger than
`SBX_RECONCILE_EVERY`, a cycle reads only the rows due and does not list the backends. These
tests change things in each way a user could, and check that the very next `sbx reap` still
sees it; and that time alone, with nothing changed, makes sandboxes due in such a cycle,
on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from support import RUN_LABEL, install_id_of, show, write_profile

from sandboxer.adapters.docker import BASE_IMAGE, KEEPALIVE
from tests.store.test_postgres import pg_url  # noqa: F401 (the fixture)

pytestmark = pytest.mark.docker

NOTHING = {"destroyed": [], "failed": [], "orphans": [], "skipped": [], "reconciled": [],
           "warned": []}


def note_of(home: Path) -> dict | None:
    notes = list(home.glob("reconcile-mark-*.json"))
    assert len(notes) <= 1, notes
    return json.loads(notes[0].read_text()) if notes else None


def reap(sbx, env: dict[str, str] | None = None) -> dict:
    result = sbx("reap", "--json", env=env)
    assert result.code == 0, result.err or result.out
    return result.json()


def did_nothing(report: dict) -> bool:
    return all(report[k] == v for k, v in NOTHING.items())


def state_of(sbx, sandbox_id: str, env: dict[str, str]) -> str:
    result = sbx("show", sandbox_id, "--json", env=env)
    assert result.code == 0, result.err
    return result.json()["state"]


def actions(report: dict) -> list[tuple[str, str]]:
    return [(r.get("id") or r.get("ref"), r["action"]) for r in report["reconciled"]]


def test_between_full_looks_a_change_on_the_engine_or_in_the_database_is_seen(
        sbx, docker_api, tmp_path):
    a, b = sbx.create(), sbx.create()
    assert did_nothing(reap(sbx))
    noted = note_of(sbx.home)
    assert noted is not None and "docker" in noted["markers"], noted
    assert did_nothing(reap(sbx))
    assert note_of(sbx.home) == noted, "a cycle with nothing changed keeps the note"
    # commands and files in a sandbox change nothing a reconcile compares (migration 0017,
    # docker's QUIET_ACTIONS): the next cycle is still one between full looks
    assert sbx("exec", a["id"], "--", "true").code == 0
    (tmp_path / "x").write_text("x")
    assert sbx("cp", str(tmp_path / "x"), f"{a['id']}:/tmp/x").code == 0
    assert sbx("files", "cat", a["id"], "/tmp/x").out == "x"
    assert did_nothing(reap(sbx))
    assert note_of(sbx.home) == noted, "an exec or a file made the next cycle a full look"

    # 1. a container stopped behind sbx's back
    docker_api.stop(a["backend_ref"], timeout=0)
    assert actions(reap(sbx)) == [(a["id"], "lose")]
    assert show(sbx, a["id"])["state"] == "lost"

    # 2. a row changed behind its back: b recorded paused while its container runs
    assert did_nothing(reap(sbx))
    assert note_of(sbx.home) is not None
    conn = sqlite3.connect(sbx.home / "sbx.db", timeout=30)
    try:
        with conn:
            conn.execute("UPDATE sandboxes SET state = 'paused' WHERE id = ?", (b["id"],))
    finally:
        conn.close()
    assert actions(reap(sbx)) == [(b["id"], "sync")]
    assert show(sbx, b["id"])["state"] == "running"

    # 3. an object of this installation that no row claims, made on the engine directly
    assert did_nothing(reap(sbx))
    assert note_of(sbx.home) is not None
    key, value = RUN_LABEL.split("=", 1)
    made = docker_api.create_container(
        BASE_IMAGE, KEEPALIVE, labels={"sbx.install": install_id_of(sbx.home), key: value},
        host_config=docker_api.create_host_config(network_mode="none"))["Id"]
    try:
        docker_api.start(made)
        # two minutes on (past the 60s grace for young objects), the full look still not due
        report = reap(sbx, env={"SBX_CLOCK_OFFSET": "2m", "SBX_RECONCILE_EVERY": "1h"})
        assert report["orphans"] == [made], report
        assert not docker_api.containers(all=True, filters={"id": made})
    finally:
        if docker_api.containers(all=True, filters={"id": made}):
            docker_api.remove_container(made, force=True)
    assert show(sbx, b["id"])["state"] == "running"


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_time_alone_makes_sandboxes_due_between_full_looks(sbx, request, tmp_path, store):
    # the next full look far off, so these cycles are not one; a 1m warning before a deadline
    env = {"SBX_RECONCILE_EVERY": "1h", "SBX_EXPIRY_WARNING": "1m"}
    if store == "postgresql":
        request.applymarker(pytest.mark.postgres)
        env["SBX_DATABASE_URL"] = request.getfixturevalue("pg_url")
    idler = write_profile(tmp_path, "idler", "extends: default\nttl:\n  idle: 3m\n")
    expiring = sbx.create("--ttl", "5m", env=env)
    idle = sbx.create("--profile-file", str(idler), "--ttl", "1h", env=env)
    keep = sbx.create("--ttl", "1h", env=env)
    first = reap(sbx, env)
    assert did_nothing(first), json.dumps(first)
    noted = note_of(sbx.home)
    assert noted is not None, "a full look that found nothing to do is noted"

    # four minutes on: idle is past its 3m idle limit; expiring is within its warning
    later = reap(sbx, {**env, "SBX_CLOCK_OFFSET": "4m"})
    assert later["destroyed"] == [idle["id"]] and later["reasons"] == {idle["id"]: "idle"}, later
    assert later["warned"] == [expiring["id"]], later
    assert later["failed"] == [] and later["reconciled"] == [], later
    assert note_of(sbx.home) == noted, "the cycle read only what was due (no full look)"
    assert state_of(sbx, idle["id"], env) == "destroyed"
    assert [state_of(sbx, s["id"], env) for s in (expiring, keep)] == ["running", "running"]
    # the cycle after, its own actions being changes, looks in full and destroys on time
    after = reap(sbx, {**env, "SBX_CLOCK_OFFSET": "6m"})
    assert after["destroyed"] == [expiring["id"]] and after["failed"] == [], after
    assert state_of(sbx, keep["id"], env) == "running"
