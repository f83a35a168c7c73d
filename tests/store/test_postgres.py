"""Fleet mode on a real PostgreSQL server (`make test` starts one: scripts/ensure-postgres.sh).

Each test gets its own database on the server, made and dropped by the `pg_url` fixture.
"Hosts" are separate SBX_HOMEs (their own installation id and host name) sharing that one
database and the one local Docker engine. Everything is read back the way a user would:
through `sbx` commands.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import RUN_ID, RUN_LABEL, SbxRunner, containers_of, events_of, install_id_of, show

from tests.reliability.test_reliability import create_many, exists, finish, popen, running

pytestmark = [pytest.mark.docker, pytest.mark.postgres]

PG = os.environ.get("SBX_TEST_PG", "sbx_test:sbx_test@127.0.0.1:5432")


def _admin():
    import psycopg

    return psycopg.connect(f"postgresql://{PG}/postgres", autocommit=True, connect_timeout=10)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A new, empty database of this test's own; dropped afterwards. No server fails the test:
    `make test` starts one."""
    name = f"sbx_{RUN_ID}_{uuid.uuid4().hex[:8]}"
    with _admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"postgresql+psycopg://{PG}/{name}"
    _drop(name)


def _drop(name: str) -> None:
    """Drop a test's database. FORCE ends the sessions left on it; an autovacuum worker there
    may be ended only by pg_signal_backend (scripts/ensure-postgres.sh grants it), so without
    that grant wait for the worker to finish instead."""
    import psycopg

    deadline = time.monotonic() + 60
    with _admin() as conn:
        while True:
            try:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                return
            except psycopg.errors.InsufficientPrivilege:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


class Host(SbxRunner):
    """One simulated host of the fleet: its own SBX_HOME, host name, the shared database."""

    def __init__(self, home: Path, cwd: Path, url: str, host: str) -> None:
        super().__init__(home, cwd)
        self.url, self.host = url, host

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return super().env({"SBX_DATABASE_URL": self.url, "SBX_HOST_NAME": self.host,
                            **(extra or {})})


@pytest.fixture
def hosts(sbx: SbxRunner, pg_url: str, tmp_path: Path) -> Iterator[list[Host]]:
    from support import remove_test_containers

    made = [Host(sbx.home, sbx.cwd, pg_url, "host-a"),
            Host(tmp_path / "home-b", sbx.cwd, pg_url, "host-b")]
    yield made
    remove_test_containers(made[1].home)  # the `sbx` fixture cleans host-a's


def all_sandboxes(host: Host) -> list[dict]:
    result = host("ls", "--all", "--json")
    assert result.code == 0, result.err
    return result.json()


def test_postgres_store_is_used_and_shown(hosts: list[Host], docker_api) -> None:
    a, b = hosts
    box_a, box_b = a.create("--ttl", "10m"), b.create("--ttl", "10m")
    # one inventory: each host sees both, and which host made each
    for host in hosts:
        seen = {s["id"]: s["host"] for s in all_sandboxes(host)}
        assert seen == {box_a["id"]: "host-a", box_b["id"]: "host-b"}
    table = a("ls").out
    assert "HOST" in table.splitlines()[0] and "host-b" in table
    doctor = a("doctor", "--json").json()["database"]
    assert doctor["dialect"] == "postgresql" and doctor["ok"] is True
    assert "sbx_test:***@" in doctor["url"]  # the password is never shown
    assert not (a.home / "sbx.db").exists()  # nothing went to SQLite
    assert a("events", "verify").code == 0


def test_migrations_run_up_from_empty_and_from_the_previous_release(pg_url: str, sbx) -> None:
    import sqlalchemy as sa

    from sandboxer.core.store.migrations import SCHEMA_HEAD, upgrade

    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:  # the previous release's schema, with a sandbox in it
        upgrade(conn, "0006")
        conn.execute(sa.text(
            "INSERT INTO sandboxes (id, profile, profile_json, backend, install_id, state, owner,"
            " labels_json, created_at, deadline, hard_deadline, last_activity_at, fence) VALUES"
            " ('sbx-old', 'default', '{}', 'docker', 'inst-old', 'destroyed', 'me', '{}',"
            " '2026-01-01T00:00:00.000000Z', '2026-01-01T00:30:00.000000Z',"
            " '2026-01-01T04:00:00.000000Z', '2026-01-01T00:00:00.000000Z', 0)"))
    engine.dispose()
    host = Host(sbx.home, sbx.cwd, pg_url, "host-a")
    listed = host("ls", "--all", "--json")  # the first command migrates
    assert listed.code == 0, listed.err
    assert [(s["id"], s["host"]) for s in listed.json()] == [("sbx-old", None)]
    assert host("doctor", "--json").json()["database"]["schema"] == SCHEMA_HEAD
    # four processes meeting an empty database at once: one migrates, all succeed
    other = pg_url.rsplit("/", 1)[0] + "/" + pg_url.rsplit("/", 1)[1] + "_x"
    with _admin() as conn:
        conn.execute(f'CREATE DATABASE "{other.rsplit("/", 1)[1]}"')
    try:
        fresh = Host(sbx.home, sbx.cwd, other, "host-a")
        results = [finish(p) for p in [popen(fresh, "ls", "--json") for _ in range(4)]]
        assert [r.code for r in results] == [0] * 4, [r.err for r in results]
    finally:
        with _admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{other.rsplit("/", 1)[1]}" WITH (FORCE)')


def test_four_reapers_on_two_hosts_destroy_each_of_40_exactly_once(hosts, docker_api) -> None:
    a, b = hosts
    boxes = create_many(a, 20, "--ttl", "1m") + create_many(b, 20, "--ttl", "1m")
    refs = {box["backend_ref"] for box in boxes}
    assert len(refs) == 40
    since = int(time.time()) - 1
    reapers = [popen(h, "reap", "--json", env={"SBX_CLOCK_OFFSET": "2m"})
               for h in (a, b, a, b)]
    results = [finish(p) for p in reapers]
    until = int(time.time()) + 2
    for r in results:
        assert r.code == 0, (r.out, r.err)
        assert r.json()["failed"] == []
    reported = [sid for r in results for sid in r.json()["destroyed"]]
    assert sorted(reported) == sorted(box["id"] for box in boxes), "each reported once"
    destroys = Counter()
    for host in hosts:
        for ev in docker_api.events(decode=True, since=since, until=until, filters={
                "label": [f"sbx.install={install_id_of(host.home)}"], "type": "container",
                "event": "destroy"}):
            destroys[ev["Actor"]["ID"]] += 1
    assert set(destroys) == refs and set(destroys.values()) == {1}, destroys
    assert {s["state"] for s in all_sandboxes(a)} == {"destroyed"}
    for box in boxes:
        types = Counter(e["type"] for e in events_of(a, box["id"]))
        assert types["sandbox.destroying"] == 1 and types["sandbox.destroyed"] == 1, box["id"]
    assert a("events", "verify").code == 0


def test_extend_racing_reap_never_loses_the_sandbox(hosts, docker_api) -> None:
    a, b = hosts
    outcomes = Counter()
    for i in range(8):
        box = a.create("--ttl", "1m")
        env = {"SBX_CLOCK_OFFSET": "61s"}
        racers = [popen(a, "extend", box["id"], "10m", env=env), popen(b, "reap", "--json", env=env)]
        if i % 2:
            racers.reverse()
        done = {tuple(p.args[3:5]): finish(p) for p in racers}
        extended = next(r for k, r in done.items() if k[0] == "extend")
        reaped = next(r for k, r in done.items() if k[0] == "reap")
        assert reaped.code == 0, reaped.err
        state = show(a, box["id"])["state"]
        if extended.code == 0:
            outcomes["extended"] += 1
            assert state == "running" and running(docker_api, box["backend_ref"])
        else:
            outcomes["reaped"] += 1
            assert extended.code == 4, extended.err
            assert state == "destroyed" and not exists(docker_api, box["backend_ref"])
    print(f"extend-vs-reap on PostgreSQL: {dict(outcomes)}")
    assert a("events", "verify").code == 0


def test_reaper_killed_holding_a_lease_is_taken_over_without_double_destroy(
        hosts, docker_api) -> None:
    a, b = hosts
    box = a.create("--ttl", "1m")
    crashed = a("reap", env={"SBX_CLOCK_OFFSET": "2m", "SBX_FAILPOINT": "destroy.after-intent",
                             "SBX_LEASE_TTL": "1s"})
    assert crashed.code == -signal.SIGKILL
    assert show(a, box["id"])["state"] == "destroying"
    early = b("reap", "--json", env={"SBX_CLOCK_OFFSET": "2m"})  # a's lease is still live
    assert early.code == 0 and box["id"] not in early.json()["destroyed"]
    time.sleep(1.2)
    later = a("reap", "--json", env={"SBX_CLOCK_OFFSET": "2m", "SBX_RECONCILE_GRACE": "1s"})
    assert later.code == 0, later.err
    assert show(a, box["id"])["state"] == "destroyed"
    assert not exists(docker_api, box["backend_ref"])
    types = Counter(e["type"] for e in events_of(a, box["id"]))
    assert types["sandbox.destroying"] == 1 and types["sandbox.destroyed"] == 1, types
    assert containers_of(docker_api, install_id_of(a.home)) == []


def test_db_copy_moves_1000_sandboxes_and_the_chain_verifies(sbx, pg_url, tmp_path) -> None:
    import asyncio
    import sqlite3

    from sandboxer.core.lifecycle.manager import Manager
    from sandboxer.core.rules.profiles import ProfileLoader
    from sandboxer.core.store.db import Database

    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "stubby.yaml").write_text("backend: stub\n")
    os.environ["SBX_PROFILE_PATH"] = str(tmp_path / "profiles")
    sbx.home.mkdir(parents=True, exist_ok=True)

    async def seed() -> None:
        mgr = Manager(Database(f"sqlite:///{sbx.home / 'sbx.db'}"), actor="seed@test",
                      install_id="inst-seed")
        profile = ProfileLoader().load("stubby")
        for i in range(1000):
            row = await mgr.create(profile, labels={"n": str(i)})
            if i % 4 == 0:
                await mgr.destroy(row["id"])
        await mgr.close()

    try:
        asyncio.run(seed())
    finally:
        del os.environ["SBX_PROFILE_PATH"]
    source = sqlite3.connect(sbx.home / "sbx.db")
    counts = {t: source.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
              for t in ("sandboxes", "events")}
    source.close()
    assert counts["sandboxes"] == 1000

    bad = sbx("db", "copy", "--to", "mysql://x@127.0.0.1/y")
    assert bad.code == 2 and "mysql is not supported" in bad.err
    copied = sbx("db", "copy", "--to", pg_url, "--json")
    assert copied.code == 0, copied.err
    report = copied.json()
    assert report["rows"]["sandboxes"] == 1000 and report["rows"]["events"] == counts["events"]
    assert report["events_verified"] == counts["events"]
    # a second copy into the now full database is refused and changes nothing
    again = sbx("db", "copy", "--to", pg_url)
    assert again.code == 4 and "already holds" in again.err
    on_pg = Host(sbx.home, sbx.cwd, pg_url, "host-a")
    assert on_pg("events", "verify").code == 0
    one_shot = SbxRunner(sbx.home, sbx.cwd)
    def listing(runner: SbxRunner) -> list[dict]:  # ttl_left_s moves with the clock
        return [{k: v for k, v in s.items() if k != "ttl_left_s"}
                for s in runner("ls", "--all", "--json").json()]

    assert listing(on_pg) == listing(one_shot)
    assert on_pg("events", "verify").out.startswith(f"{counts['events']} events, chain intact")


def test_unreachable_postgres_is_exit_5_in_one_line(sbx) -> None:
    result = sbx("ls", env={"SBX_DATABASE_URL":
                            "postgresql+psycopg://sbx_test:hunter2@127.0.0.1:1/nothing"})
    assert result.code == 5, (result.code, result.err)
    assert len(result.err.strip().splitlines()) == 1
    assert "hunter2" not in result.err and "127.0.0.1:1" in result.err


def test_the_settings_file_can_name_the_store(sbx, pg_url) -> None:
    config = sbx.cwd / "xdg-config" / "sandboxer"
    config.mkdir(parents=True)
    (config / "settings.toml").write_text(f'[database]\nurl = "{pg_url}"\n')
    doctor = sbx("doctor", "--json")
    assert doctor.code == 0, doctor.err
    assert doctor.json()["database"]["dialect"] == "postgresql"
    assert not (sbx.home / "sbx.db").exists()
    (config / "settings.toml").write_text("[database]\nurl = 5\n")
    bad = sbx("ls")
    assert bad.code == 2 and "database.url" in bad.err and "settings.toml" in bad.err


def test_a_fleet_host_judges_only_its_own_checkpoints(hosts: list[Host], docker_api) -> None:
    """Host B finds host A's checkpoint image missing from its engine: that is not B's to
    judge. B's reconcile leaves the checkpoint ready and B's restore is refused (exit 4)
    without marking it lost; only A, which holds it, records it lost."""
    a, b = hosts
    box = a.create("--ttl", "10m")
    made = a("snapshot", box["id"], "--json")
    assert made.code == 0, made.err
    ckpt = made.json()
    docker_api.remove_image(ckpt["backend_ref"])  # as if it lived on another engine

    def state() -> str:
        (row,) = [c for c in a("checkpoints", "--json").json() if c["id"] == ckpt["id"]]
        return row["state"]

    assert b("reconcile").code == 0
    assert state() == "ready"
    refused = b("restore", ckpt["id"], "--label", RUN_LABEL)
    assert refused.code == 4 and "another installation" in refused.err, refused.err
    assert state() == "ready"
    assert a("reconcile").code == 0
    assert state() == "lost"
