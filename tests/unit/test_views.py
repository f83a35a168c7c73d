"""The sandbox view (core/rules/views.py): built from the stored time strings without a
datetime per field, it says what the TTL rules (core/rules/ttl.py) say."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta

import pytest

from sandboxer.core.rules.clock import from_iso, to_iso
from sandboxer.core.rules.states import ON_THE_CLOCK
from sandboxer.core.rules.ttl import effective_deadline, idle_deadline
from sandboxer.core.rules.views import (
    VIEW_COLUMNS,
    encode,
    encode_list,
    kept_views_json,
    sandbox_view,
    sandbox_views,
    ttl_end_us,
    view_fragment,
)

NOW = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


def _row(state: str, deadline_in: timedelta, idle_s: int | None, active_ago: timedelta,
         labels: str = '{"team": "a"}') -> dict:
    return dict(id="sbx-1", name=None, profile="p", backend="stub", backend_ref=None,
                state=state, owner="o", task=None, labels_json=labels, install_id="i",
                host=None, created_at=to_iso(NOW - timedelta(hours=1)), started_at=None,
                deadline=to_iso(NOW + deadline_in), hard_deadline=to_iso(NOW + timedelta(days=1)),
                last_activity_at=to_iso(NOW - active_ago), idle_timeout_s=idle_s,
                ended_at=None, error=None, pool=None, launch=None, isolation="container")


CASES = list(itertools.product(
    ["running", "paused", "creating", "destroyed", "failed"],
    [timedelta(minutes=30), timedelta(seconds=-5), timedelta(microseconds=700)],
    [None, 0, 60, 7200],
    [timedelta(0), timedelta(minutes=3), timedelta(hours=5)]))


@pytest.mark.parametrize("state, deadline_in, idle_s, active_ago", CASES)
def test_idle_deadline_and_ttl_left_follow_the_ttl_rules(state, deadline_in, idle_s, active_ago):
    row = _row(state, deadline_in, idle_s, active_ago)
    view = sandbox_view(row, to_iso(NOW))
    assert view["idle_deadline"] == to_iso(idle_deadline(row))
    if state in ON_THE_CLOCK:
        left = max(0, int((effective_deadline(row) - NOW).total_seconds()))
        assert view["ttl_left_s"] == left
    else:
        assert view["ttl_left_s"] is None
    assert "ttl_left_s" not in sandbox_view(row)  # read without a now: no countdown


def test_a_listing_gives_each_view_its_own_labels():
    rows = [_row("running", timedelta(minutes=5), None, timedelta(0)) for _ in range(3)]
    rows.append(_row("running", timedelta(minutes=5), None, timedelta(0), labels="{}"))
    views = sandbox_views([tuple(r[c] for c in VIEW_COLUMNS) for r in rows], to_iso(NOW))
    views[0]["labels"]["mine"] = "1"
    assert [v["labels"] for v in views] == [{"team": "a", "mine": "1"}, {"team": "a"},
                                            {"team": "a"}, {}]
    assert views[1:] == [sandbox_view(r, to_iso(NOW)) for r in rows[1:]]


def test_a_kept_listings_document_is_its_views_encoded_as_of_now():
    """What a listing kept between reads writes (each view encoded once, ttl_left_s added as
    of the read) is byte for byte what encoding the views made as of then gives."""
    rows = [tuple(_row(*case)[c] for c in VIEW_COLUMNS) for case in CASES]
    later = to_iso(NOW + timedelta(seconds=90))
    kept = [(view, ttl_end_us(view), view_fragment(view)) for view in sandbox_views(rows)]
    assert kept_views_json(kept, later) == encode_list(sandbox_views(rows, later))
    assert kept_views_json([], later) == encode_list([]) == b"[]"
    assert json.loads(kept_views_json(kept, later)) == sandbox_views(rows, later)


def test_a_name_that_is_not_utf8_is_written_escaped_as_the_standard_library_writes_it():
    """A file name that is not UTF-8 reaches JSON as a lone surrogate (surrogateescape), which
    orjson refuses: the document is still written, escaped, as before orjson."""
    doc = {"name": b"caf\xff".decode("utf-8", "surrogateescape"), "size": 1}
    assert encode_list([doc]) == b'[\n{"name":"caf\\udcff","size":1}\n]'
    assert encode(doc, indent=True).decode() == json.dumps(doc, indent=2)
    assert json.loads(encode(doc))["name"] == doc["name"]


def test_a_stored_time_not_in_the_stores_form_is_refused_as_from_iso_refuses_it():
    row = _row("running", timedelta(minutes=5), 60, timedelta(0))
    row["last_activity_at"] = "2026-03-01 12:00:00"
    with pytest.raises(ValueError) as listed:
        sandbox_views([tuple(row[c] for c in VIEW_COLUMNS)], to_iso(NOW))
    with pytest.raises(ValueError) as alone:
        from_iso(row["last_activity_at"])
    assert str(listed.value) == str(alone.value)
