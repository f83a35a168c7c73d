"""What a reap cycle between full looks reads (core/store/inventory.py: due_sandboxes, docs/
design.md "Between full looks"): every row that may be due by a time and no other, on SQLite
and PostgreSQL; and on SQLite through migration 0018's partial indexes of the live rows, so
the read costs what may be due rather than the fleet or its history (issue 36)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import sqlalchemy as sa

from sandboxer.core.store import inventory
from sandboxer.core.store.db import Database
from sandboxer.core.store.models import Sandbox

SOON = "2026-12-06T12:00:00.000000Z"  # the reaper's now plus its warning's lead
PAST = "2026-12-06T11:00:00.000000Z"
LATER = "2026-12-07T12:00:00.000000Z"

# each kind of row, and whether a reap by SOON may act on it
ROWS = {
    "sbx-deadline-passed": (dict(deadline=PAST), True),
    "sbx-deadline-soon": (dict(deadline=SOON), True),
    "sbx-deadline-later": (dict(deadline=LATER), False),
    "sbx-paused-later": (dict(deadline=LATER, state="paused"), False),
    "sbx-warm-later": (dict(deadline=LATER, state="warm"), False),
    "sbx-idle-passed": (dict(deadline=LATER, idle_timeout_s=600,
                             last_activity_at="2026-12-06T11:40:00.000000Z"), True),
    "sbx-idle-not-yet": (dict(deadline=LATER, idle_timeout_s=600,
                              last_activity_at="2026-12-06T11:55:00.000000Z"), False),
    "sbx-creating": (dict(deadline=LATER, state="creating"), True),
    "sbx-destroying": (dict(deadline=LATER, state="destroying"), True),
    "sbx-failed": (dict(deadline=LATER, state="failed"), True),
    "sbx-lost": (dict(deadline=LATER, state="lost"), True),
    "sbx-pool-member": (dict(deadline=LATER, state="warm", pool="py"), True),
    "sbx-destroyed-past": (dict(deadline=PAST, state="destroyed"), False),
    "sbx-destroyed-member": (dict(deadline=PAST, state="destroyed", pool="py",
                                  idle_timeout_s=1), False),
    "sbx-a-state-of-a-newer-sbx": (dict(deadline=LATER, state="hibernating"), True),
    "sbx-due-every-way": (dict(deadline=PAST, state="creating", pool="py", idle_timeout_s=1), True),
}


def _row(sid: str, **values) -> dict:
    at = "2026-12-06T10:00:00.000000Z"
    return {**dict(id=sid, name=None, profile="p", profile_json="{}", backend="stub",
                   backend_ref=f"stub-{sid}", install_id="inst", host="h", state="running",
                   owner="o", labels_json="{}", created_at=at, started_at=at, deadline=at,
                   hard_deadline=LATER, last_activity_at=at, fence=0, pool=None,
                   idle_timeout_s=None), **values}


def test_the_rows_read_are_those_that_may_be_due_and_no_other(database):
    with database.write() as conn:
        conn.execute(sa.insert(Sandbox.__table__),
                     [_row(sid, **values) for sid, (values, _) in ROWS.items()])
    placeholder = "?" if database.url.startswith("sqlite") else "%s"
    with database.read() as conn:
        rows = inventory.due_sandboxes(conn.connection.driver_connection, SOON, placeholder)
    ids = [r["id"] for r in rows]
    assert sorted(ids) == sorted(sid for sid, (_, due) in ROWS.items() if due)
    assert len(ids) == len(set(ids)), "a row that is due two ways is read once"
    assert all(r["state"] != "destroyed" for r in rows)


def test_on_sqlite_every_part_is_read_through_a_partial_index(tmp_path: Path):
    """Written as one condition of ORs, SQLite walked every row: 8 ms a cycle at 10,000. An
    index of every row's deadline would still step through each destroyed sandbox."""
    db = Database(f"sqlite:///{tmp_path / 'sbx.db'}")
    db.migrate()
    db.dispose()
    conn = sqlite3.connect(tmp_path / "sbx.db")
    try:
        steps: list[str] = []

        class Explaining:  # a driver connection that explains the statement it is given
            def cursor(self):
                return self

            def execute(self, sql, params):
                steps.extend(r[-1] for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))
                self.description = [("id",)]

            def fetchall(self):
                return []

            def close(self):
                pass

        assert inventory.due_sandboxes(Explaining(), SOON) == []
        reads = [step for step in steps if "sandboxes" in step]
        used = [re.fullmatch(r"(SEARCH|SCAN) (TABLE )?sandboxes USING (COVERING )?INDEX (\w+).*",
                             step) for step in reads]
        assert all(used), f"a part walks the table: {steps}"
        assert {m.group(4) for m in used} == {
            "sqlite_autoindex_sandboxes_1", "ix_sandboxes_live_deadline",
            "ix_sandboxes_unsettled", "ix_sandboxes_live_pool", "ix_sandboxes_live_idle"}, steps
    finally:
        conn.close()
