"""A full disk (sandboxer.core.rules.errors.is_disk_full, sandboxer.core.rules.reserve, sandboxer.core.store.db): one error, exit 5, nothing
written; the reserve makes room for what ends sandboxes. On a real SQLite file and the stub
backend (a test double); the full disk itself is simulated here, and real in
tests/reliability/test_hard_faults.py."""

import asyncio
import errno
import sqlite3

import pytest
import sqlalchemy as sa

from sandboxer.adapters.stub import StubAdapter
from sandboxer.core.lifecycle.manager import EVENTS, SANDBOXES, Manager
from sandboxer.core.rules import reserve
from sandboxer.core.rules.clock import FrozenClock
from sandboxer.core.rules.errors import DiskFull, classify, is_disk_full
from sandboxer.core.rules.profiles import ProfileLoader
from sandboxer.core.store.db import Database


def sqlite_error(message: str, code: int) -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError(message)
    exc.sqlite_errorcode = code
    return exc


def test_what_counts_as_a_full_disk(tmp_path, monkeypatch):
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    full = sqlite_error("database or disk is full", 13)
    assert is_disk_full(full)
    assert is_disk_full(sa.exc.OperationalError("INSERT", {}, full))  # as SQLAlchemy wraps it
    try:
        try:
            raise full
        except sqlite3.Error as inner:
            raise RuntimeError("while writing") from inner
    except RuntimeError as outer:
        assert is_disk_full(outer)
    # SQLITE_IOERR_SHMSIZE: full only when the folder has no room
    shm = sqlite_error("disk I/O error", 4874)
    monkeypatch.setattr(reserve, "free_bytes", lambda folder: 0)
    assert is_disk_full(shm, tmp_path) and not is_disk_full(shm)
    monkeypatch.setattr(reserve, "free_bytes", lambda folder: 100 * reserve.LOW_WATER_BYTES)
    assert not is_disk_full(shm, tmp_path)
    assert not is_disk_full(sqlite_error("database is locked", 5), tmp_path)
    assert classify(OSError(errno.ENOSPC, "No space left on device")) == (5, "unavailable")
    message = str(DiskFull.at(tmp_path))
    assert str(tmp_path) in message and "nothing was changed" in message


def test_the_reserve_is_allocated_kept_and_released_only_when_the_disk_is_full(tmp_path,
                                                                             monkeypatch):
    database = tmp_path / "sbx.db"
    path = reserve.reserve_of(database)
    assert reserve.keep(database)
    assert path.stat().st_size == reserve.RESERVE_BYTES
    assert path.stat().st_blocks * 512 >= reserve.RESERVE_BYTES  # not a hole
    url = f"sqlite:///{database}"
    assert not reserve.make_room(url) and path.exists()  # plenty of room: kept
    monkeypatch.setattr(reserve, "free_bytes", lambda folder: reserve.LOW_WATER_BYTES - 1)
    assert reserve.make_room(url) and not path.exists()
    assert not reserve.keep(database)  # no room to make it again
    assert list(tmp_path.iterdir()) == []  # nor a half-made one left behind
    assert not reserve.make_room("postgresql+psycopg://sbx@db/sbx")


@pytest.fixture
def mgr(sbx_home):
    StubAdapter.reset()
    m = Manager(Database(f"sqlite:///{sbx_home / 'sbx.db'}"), FrozenClock(), actor="tester")
    yield m
    asyncio.run(m.close())


@pytest.fixture
def profile(sbx_home, tmp_path):
    path = tmp_path / "stubby.yaml"
    path.write_text("backend: stub\nttl: {default: 10m, max: 1h}\n")
    return ProfileLoader().load_file(path)


def rows(mgr, table):
    with mgr.db.read() as conn:
        return [dict(r) for r in conn.execute(sa.select(table)).mappings()]


def no_room_while_the_reserve_is_there(monkeypatch, mgr):
    """Writes fail with ENOSPC (at the anchor, the last thing a write puts on disk before
    its commit) for as long as the reserve takes the disk's last bytes."""
    import sandboxer.core.store.db

    real = sandboxer.core.store.db.stage_anchor
    path = reserve.reserve_of(mgr.db.anchor_path.with_name("sbx.db"))

    def stage(anchor, head):
        if path.exists():
            raise OSError(errno.ENOSPC, "No space left on device", str(anchor))
        return real(anchor, head)

    monkeypatch.setattr(sandboxer.core.store.db, "stage_anchor", stage)
    return path


def test_a_create_with_no_room_writes_nothing_and_makes_nothing(mgr, profile, monkeypatch):
    made = asyncio.run(mgr.create(profile))  # the database and its reserve exist
    before = rows(mgr, SANDBOXES), rows(mgr, EVENTS), mgr.db.anchor_path.read_text()
    requests = dict(StubAdapter.requests)
    no_room_while_the_reserve_is_there(monkeypatch, mgr)
    with pytest.raises(DiskFull, match="nothing was changed"):
        asyncio.run(mgr.create(profile))
    assert (rows(mgr, SANDBOXES), rows(mgr, EVENTS), mgr.db.anchor_path.read_text()) == before
    assert StubAdapter.requests == requests
    assert made["state"] == "running"


def test_a_create_is_refused_when_the_disk_is_nearly_full(mgr, profile, monkeypatch):
    monkeypatch.setattr(reserve, "free_bytes", lambda folder: reserve.LOW_WATER_BYTES - 1)
    with pytest.raises(DiskFull):
        asyncio.run(mgr.create(profile))
    assert rows(mgr, SANDBOXES) == [] and StubAdapter.requests == {}


def test_a_destroy_with_no_room_releases_the_reserve_and_ends_the_sandbox(mgr, profile,
                                                                        monkeypatch):
    box = asyncio.run(mgr.create(profile))
    path = no_room_while_the_reserve_is_there(monkeypatch, mgr)
    assert path.exists()
    row, done = asyncio.run(mgr.destroy(box["id"]))
    assert done and row["state"] == "destroyed"
    assert not path.exists()
    assert [e["type"] for e in rows(mgr, EVENTS)][-2:] == [
        "sandbox.destroying", "sandbox.destroyed"]
    assert mgr.verify_events().intact


def test_without_a_reserve_a_full_disk_is_reported_not_retried(mgr, profile, monkeypatch):
    box = asyncio.run(mgr.create(profile))
    import sandboxer.core.store.db

    def stage(anchor, head):
        raise OSError(errno.ENOSPC, "No space left on device", str(anchor))

    mgr.db.release_reserve()
    monkeypatch.setattr(sandboxer.core.store.db, "stage_anchor", stage)
    with pytest.raises(DiskFull):
        asyncio.run(mgr.destroy(box["id"]))
    assert rows(mgr, SANDBOXES)[0]["state"] == "running"  # the intent was rolled back
