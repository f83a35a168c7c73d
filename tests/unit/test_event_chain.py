"""The hash chain detects a changed, removed or reordered event and names it."""

import json

import sqlalchemy as sa

from sandboxer.core.store import events
from sandboxer.core.store.db import Database


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


def test_events_cut_from_the_end_are_caught_by_the_anchor(tmp_path):
    from sandboxer.core.store.anchor import read_anchor

    db = _db(tmp_path)
    _fill(db)
    anchor = read_anchor(db.anchor_path)
    assert anchor == (5, _rows(db)[-1]["hash"])
    assert events.verify(iter(_rows(db)), anchor).intact
    with db.engine.begin() as conn:  # the newest two rows vanish, the chain itself still holds
        conn.execute(events.EVENTS.delete().where(events.EVENTS.c.id >= 4))
    assert events.verify(iter(_rows(db))).intact  # the chain alone cannot see it...
    report = events.verify(iter(_rows(db)), anchor)  # ...the anchor does
    assert not report.intact and report.broken_at == 4 and "cut from the end" in report.problem


def test_anchor_never_moves_back(tmp_path):
    from sandboxer.core.store.anchor import move_anchor, read_anchor

    path = tmp_path / "head"
    move_anchor(path, (7, "b"))
    move_anchor(path, (3, "a"))
    assert read_anchor(path) == (7, "b")


def test_a_rolled_back_event_never_reaches_the_anchor(tmp_path):
    """An event appended in a transaction that then fails is gone; the next transaction on
    the same pooled connection, with no event of its own, must not anchor it."""
    import pytest

    from sandboxer.core.store.anchor import read_anchor

    db = _db(tmp_path)
    _fill(db, 2)
    with pytest.raises(RuntimeError), db.write() as conn:
        events.append(conn, time="2026-01-01T00:00:09.000000Z", type="sandbox.exec",
                      actor="t", sandbox_id="sbx-x", payload={"lost": True})
        raise RuntimeError("the transaction fails after its event")
    with db.write() as conn:  # a write with no event (a lease given back, say)
        conn.execute(sa.text("SELECT 1"))
    rows = _rows(db)
    assert len(rows) == 2
    assert read_anchor(db.anchor_path) == (2, rows[-1]["hash"])
    assert events.verify(iter(rows), read_anchor(db.anchor_path)).intact


def test_an_anchor_of_an_older_sbx_keeps_its_head_and_then_moves_in_place(tmp_path):
    """An anchor written by an sbx that renamed a short file into place is brought to the
    full width once, before a commit, with the head it had; later moves overwrite it."""
    from sandboxer.core.store.anchor import WIDTH, read_anchor

    db = _db(tmp_path)
    _fill(db, 2)
    head = read_anchor(db.anchor_path)
    db.anchor_path.write_text(f"{head[0]} {head[1]}\n")  # the older, short form
    assert read_anchor(db.anchor_path) == head
    _fill(db, 1)
    inode = db.anchor_path.stat().st_ino
    assert db.anchor_path.stat().st_size == WIDTH
    assert read_anchor(db.anchor_path) == (3, _rows(db)[-1]["hash"])
    _fill(db, 1)
    assert db.anchor_path.stat().st_ino == inode  # moved in place, not replaced
    assert read_anchor(db.anchor_path) == (4, _rows(db)[-1]["hash"])
    assert events.verify(iter(_rows(db)), read_anchor(db.anchor_path)).intact


def test_a_link_planted_as_the_anchor_is_not_followed_and_is_replaced(tmp_path):
    import os

    from sandboxer.core.store.anchor import read_anchor

    db = _db(tmp_path)
    _fill(db, 1)
    target = tmp_path / "elsewhere"
    target.write_text("7 planted\n")
    db.anchor_path.unlink()
    os.symlink(target, db.anchor_path)
    assert read_anchor(db.anchor_path) is None  # a link reads as no anchor
    _fill(db, 1)
    assert not db.anchor_path.is_symlink()
    assert read_anchor(db.anchor_path) == (2, _rows(db)[-1]["hash"])
    assert target.read_text() == "7 planted\n"  # what the link pointed at is untouched


def test_a_hard_link_planted_as_the_anchor_is_replaced_not_written_through(tmp_path):
    import os

    from sandboxer.core.store.anchor import WIDTH, read_anchor

    db = _db(tmp_path)
    _fill(db, 1)
    victim = tmp_path / "victim"
    victim.write_text("x" * (2 * WIDTH))
    db.anchor_path.unlink()
    os.link(victim, db.anchor_path)
    assert read_anchor(db.anchor_path) is None  # a file with another name is not the anchor
    _fill(db, 1)
    assert victim.read_text() == "x" * (2 * WIDTH)  # never written through the link
    assert db.anchor_path.stat().st_nlink == 1
    assert read_anchor(db.anchor_path) == (2, _rows(db)[-1]["hash"])


def test_a_head_too_long_for_the_anchor_fails_before_the_commit(tmp_path):
    import pytest

    from sandboxer.core.store.anchor import WIDTH, move_anchor, read_anchor

    path = tmp_path / "head"
    move_anchor(path, (7, "b"))
    with pytest.raises(ValueError):
        move_anchor(path, (8, "h" * WIDTH))
    assert read_anchor(path) == (7, "b")
