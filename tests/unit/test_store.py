"""The SQLite store: WAL, busy timeout, BEGIN IMMEDIATE writers, 0600, Alembic migrations."""

import os
import stat
import subprocess
import sys
import textwrap

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlmodel import SQLModel

import sandboxer.core.store.models  # noqa: F401
from sandboxer.core.store.db import Database
from sandboxer.core.store.migrations import SCHEMA_HEAD, script_head


def test_schema_head_constant_matches_alembic():
    assert SCHEMA_HEAD == script_head()


def test_migrations_produce_exactly_the_models(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'm.db'}")
    db.migrate()
    with db.engine.connect() as conn:
        diff = compare_metadata(
            MigrationContext.configure(conn, opts={"compare_type": True}), SQLModel.metadata)
    assert diff == []


def test_sqlite_is_private_wal_with_busy_timeout(tmp_path):
    path = tmp_path / "home" / "sbx.db"
    db = Database(f"sqlite:///{path}")
    db.migrate()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    with db.write():
        wal = path.with_name("sbx.db-wal")
        assert not wal.exists() or stat.S_IMODE(wal.stat().st_mode) == 0o600


def test_writers_begin_immediate_and_readers_do_not_block(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'x.db'}")
    db.migrate()
    with db.write():
        # the write lock is held from BEGIN: another writer cannot start...
        other = Database(db.url)
        other.engine = sa.create_engine(db.url, connect_args={"timeout": 0.1})
        with other.engine.connect() as conn:
            try:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
                locked = False
            except sa.exc.OperationalError as exc:
                locked = "locked" in str(exc)
        assert locked
        # ...while a reader still reads (WAL)
        with Database(db.url).read() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM sandboxes").scalar() == 0


RACE = textwrap.dedent("""
    import sys, asyncio
    from sandboxer.core.store.db import Database
    from sandboxer.core.lifecycle.manager import Manager
    from sandboxer.core.rules.clock import Clock
    m = Manager(Database(sys.argv[1]), Clock(), actor=sys.argv[2], install_id="inst-test")
    try:
        lease, _ = m.leases.begin(sys.argv[3], "destroying", reason="manual")
        print("WON", lease.fence, flush=True)
    except Exception as exc:
        print("LOST", type(exc).__name__, flush=True)
    sys.stdin.read()  # alive until every process has tried: a dead holder's lease lapses at once
""")


def test_exactly_one_of_eight_processes_takes_a_lease(sbx_home, tmp_path):
    import asyncio

    from sandboxer.adapters.stub import StubAdapter
    from sandboxer.core.lifecycle.manager import Manager
    from sandboxer.core.rules.profiles import ProfileLoader

    url = f"sqlite:///{tmp_path / 'race.db'}"
    prof = tmp_path / "s.yaml"
    prof.write_text("backend: stub\n")
    StubAdapter.reset()
    mgr = Manager(Database(url), actor="setup", install_id="inst-test")
    sid = asyncio.run(mgr.create(ProfileLoader().load_file(prof)))["id"]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    procs = [subprocess.Popen([sys.executable, "-c", RACE, url, f"p{i}", sid],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
             for i in range(8)]
    said = [p.stdout.readline() for p in procs]  # each has tried, and is still alive
    ended = [p.communicate(timeout=60) for p in procs]
    outcomes = [(line + out, err) for line, (out, err) in zip(said, ended, strict=True)]
    won = [o for o, _ in outcomes if o.startswith("WON")]
    lost = [o for o, _ in outcomes if o.startswith("LOST")]
    assert len(won) == 1, outcomes
    assert len(lost) == 7 and all("Conflict" in o for o in lost), outcomes
    assert not any("locked" in e for _, e in outcomes)


def test_first_start_of_many_processes_migrates_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    code = "import sys; from sandboxer.core.store.db import Database; Database(sys.argv[1]).migrate(); print('ok')"
    procs = [subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outcomes = [p.communicate(timeout=60) for p in procs]
    assert all(o.strip() == "ok" for o, _ in outcomes), outcomes
    assert Database(url).schema_version() == SCHEMA_HEAD
