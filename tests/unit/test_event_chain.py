"""The hash chain detects a changed, removed or reordered event and names it."""

import json

import sqlalchemy as sa

from core import events
from core.db import Database


def _db(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'chain.db'}")
    db.migrate()
    return db


def _fill(db, n=5):
    for i in range(n):
        with db.write() as conn:
            events.append(conn, time=f"2026-01-01T00:00:0{i}.000000Z", type="sandbox.exec",
                          actor="t", sandbox_id="sbx-x", payload={"i": i})


def _rows(db):
    with db.read() as conn:
        return [dict(r) for r in conn.execute(
            sa.select(events.EVENTS).order_by(events.EVENTS.c.id)).mappings()]


def test_intact_chain_verifies(tmp_path):
    db = _db(tmp_path)
    _fill(db)
    rows = _rows(db)
    assert rows[0]["prev_hash"] == events.GENESIS
    assert all(b["prev_hash"] == a["hash"] for a, b in zip(rows, rows[1:], strict=False))
    report = events.verify(iter(rows))
    assert report.intact and report.checked == 5


def test_changed_payload_is_named(tmp_path):
    db = _db(tmp_path)
    _fill(db)
    with db.engine.begin() as conn:
        conn.execute(events.EVENTS.update().where(events.EVENTS.c.id == 3)
                     .values(payload_json=json.dumps({"i": 99})))
    report = events.verify(iter(_rows(db)))
    assert (report.broken_at, report.checked) == (3, 2)
    assert "changed" in report.problem


def test_deleted_event_is_named(tmp_path):
    db = _db(tmp_path)
    _fill(db)
    with db.engine.begin() as conn:
        conn.execute(events.EVENTS.delete().where(events.EVENTS.c.id == 2))
    report = events.verify(iter(_rows(db)))
    assert report.broken_at == 3 and "missing" in report.problem


def test_rehashed_forgery_still_breaks_the_next_link(tmp_path):
    db = _db(tmp_path)
    _fill(db)
    rows = _rows(db)
    forged = dict(rows[1], payload_json='{"i":42}')
    forged["hash"] = events.event_hash(forged)  # the forger recomputes this row's hash...
    rows[1] = forged
    report = events.verify(iter(rows))
    assert report.broken_at == 3  # ...but the next row still points at the original
