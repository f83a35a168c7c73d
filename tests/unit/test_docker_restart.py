"""How the Docker adapter tells a container the engine started again from one that has run
since it was made: the listing's `Status` first (no extra call), then one inspect."""

from datetime import UTC, datetime

import pytest

from sandboxer.adapters.docker import RESTART_SLACK_S, _maybe_restarted, _restarted_at, _up_at_most


@pytest.mark.parametrize(("status", "at_most"), [
    ("Up Less than a second", 1), ("Up 1 second", 2), ("Up 42 seconds", 43),
    ("Up About a minute", 120), ("Up 5 minutes", 360), ("Up About an hour", 5400),
    ("Up 3 hours", 3.5 * 3600), ("Up 2 days", 3 * 86400), ("Up 5 minutes (Paused)", 360),
    ("Up 7 seconds (healthy)", 8), ("Exited (0) 3 seconds ago", None), ("Created", None),
    ("", None), (None, None),
])
def test_how_long_the_listing_says_a_container_is_up(status, at_most):
    assert _up_at_most(status) == at_most


def test_only_a_container_up_for_less_than_its_age_is_inspected():
    now = 1_000_000.0
    fresh = {"Created": int(now - 3), "Status": "Up 2 seconds"}  # made and started together
    assert not _maybe_restarted(fresh, now)
    old = {"Created": int(now - 3600), "Status": "Up About an hour"}
    assert not _maybe_restarted(old, now)
    back = {"Created": int(now - 600), "Status": "Up 4 seconds"}
    assert _maybe_restarted(back, now)
    edge = {"Created": int(now - 5 - RESTART_SLACK_S), "Status": "Up 4 seconds"}
    assert not _maybe_restarted(edge, now)
    assert _maybe_restarted({"Created": int(now), "Status": "Up in some new wording"}, now)


def test_restarted_means_running_after_a_stop():
    never = {"Running": True, "StartedAt": "2026-06-01T12:00:00.123456789Z",
             "FinishedAt": "0001-01-01T00:00:00Z"}
    assert _restarted_at(never) is None
    again = {**never, "FinishedAt": "2026-06-01T11:59:58Z"}
    assert _restarted_at(again) == datetime(2026, 6, 1, 12, 0, 0, 123456, tzinfo=UTC)
    assert _restarted_at({**again, "Running": False}) is None
