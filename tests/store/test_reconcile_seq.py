"""`reconcile_seq` (migration 0017): the reaper's fingerprint between full looks moves on
every insert and on every write of a column a reconcile compares, and not on an exec's mark
of activity (docs/reliability.md, 23). On SQLite and PostgreSQL."""

from __future__ import annotations

import importlib

import sqlalchemy as sa

from sandboxer.core.store import inventory
from sandboxer.core.store.models import Sandbox

MIGRATION = importlib.import_module("sandboxer.core.store.migrations.versions.0017_reconcile_seq")


def test_every_column_is_tracked_or_named_as_activity():
    """A column added to sandboxes later must be added to the triggers (or named untracked)."""
    columns = {c.name for c in Sandbox.__table__.columns}
    assert set(MIGRATION.TRACKED) | set(MIGRATION.UNTRACKED) == columns
    assert not set(MIGRATION.TRACKED) & set(MIGRATION.UNTRACKED)


def _row(sid: str) -> dict:
    at = "2026-12-06T10:00:00.000000Z"
    return dict(id=sid, name=None, profile="p", profile_json="{}", backend="stub",
                backend_ref=f"stub-{sid}", install_id="inst", host="h", state="running",
                owner="o", labels_json="{}", created_at=at, started_at=at, deadline=at,
                hard_deadline=at, last_activity_at=at, fence=0)


def test_an_activity_mark_leaves_the_fingerprint_and_other_writes_move_it(database):
    table = Sandbox.__table__

    def fingerprint() -> list:
        with database.read() as conn:
            return inventory.change_fingerprint(conn.connection.driver_connection)

    def write(statement) -> None:
        with database.write() as conn:
            conn.execute(statement)

    write(sa.insert(table).values(**_row("sbx-a")))
    first = fingerprint()
    write(sa.update(table).where(table.c.id == "sbx-a")
          .values(last_activity_at="2026-12-06T11:00:00.000000Z"))
    write(sa.update(table).where(table.c.id == "sbx-a")
          .values(warned_deadline="2026-12-06T11:00:00.000000Z"))
    assert fingerprint() == first
    write(sa.update(table).where(table.c.id == "sbx-a").values(state="paused"))
    paused = fingerprint()
    assert paused != first
    write(sa.update(table).where(table.c.id == "sbx-a").values(backend_ref="elsewhere"))
    moved = fingerprint()
    assert moved != paused
    write(sa.insert(table).values(**_row("sbx-b")))
    assert fingerprint() != moved
