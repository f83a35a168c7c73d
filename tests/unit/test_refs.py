"""One resolver for sandboxes and checkpoints (sandboxer.core.store.refs): id, name, then a literal prefix."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from sandboxer.core.rules.errors import BadInput, NotFound
from sandboxer.core.store.refs import resolve

META = sa.MetaData()
THINGS = sa.Table("things", META, sa.Column("id", sa.String, primary_key=True),
                  sa.Column("name", sa.String), sa.Column("state", sa.String),
                  sa.Column("created_at", sa.String))


@pytest.fixture
def conn():
    engine = sa.create_engine("sqlite://")
    META.create_all(engine)
    with engine.begin() as connection:
        connection.execute(THINGS.insert(), [
            {"id": "t-abc_1", "name": "alpha", "state": "live", "created_at": "1"},
            {"id": "t-abcx2", "name": None, "state": "live", "created_at": "2"},
            {"id": "t-zzz", "name": "t-abc", "state": "live", "created_at": "3"},
            {"id": "t-old", "name": "beta", "state": "ended", "created_at": "4"},
            {"id": "t-new", "name": "beta", "state": "live", "created_at": "5"},
            {"id": "t-gone1", "name": "gamma", "state": "ended", "created_at": "6"},
            {"id": "t-gone2", "name": "gamma", "state": "ended", "created_at": "7"},
        ])
        yield connection


def find(conn, ref):
    return resolve(conn, THINGS, ref, id_prefix="t-", what="thing",
                   live=lambda row: row["state"] == "live")["id"]


def test_whole_id_with_or_without_its_prefix(conn):
    assert find(conn, "t-abcx2") == "t-abcx2"
    assert find(conn, "ABCX2") == "t-abcx2"


def test_a_name_wins_over_a_prefix_it_also_matches(conn):
    assert find(conn, "t-abc") == "t-zzz"


def test_underscore_in_a_prefix_is_a_character_not_a_wildcard(conn):
    assert find(conn, "abc_") == "t-abc_1"  # as a wildcard it would also match t-abcx2


def test_live_record_of_a_name_wins_then_the_newest(conn):
    assert find(conn, "beta") == "t-new"
    assert find(conn, "gamma") == "t-gone2"


def test_ambiguous_prefix_and_unknown_and_empty(conn):
    with pytest.raises(BadInput, match="ambiguous"):
        find(conn, "abc")
    with pytest.raises(NotFound):
        find(conn, "nothing")
    with pytest.raises(BadInput, match="empty"):
        find(conn, "  ")
