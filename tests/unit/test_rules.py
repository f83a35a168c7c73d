"""Durations, labels, names and the state table: the single places those rules live."""

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandboxer.core.rules.durations import format_duration, parse_duration
from sandboxer.core.rules.errors import BadInput, Conflict
from sandboxer.core.rules.ids import new_sandbox_id, validate_name
from sandboxer.core.rules.labels import parse_label
from sandboxer.core.rules.states import LIVE, TRANSITIONS, State, can_transition, transition_event


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400), ("1h30m", 5400),
     ("1d2h3m4s", 93784), (" 5M ", 300)],
)
def test_durations_parse(text, seconds):
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["0s", "-5m", "abc", "", "5", "1x", "1.5h", "30m1h", "1h1h", "0h0m"])
def test_bad_durations_are_refused_by_name(text):
    with pytest.raises(BadInput, match="--ttl"):
        parse_duration(text, "--ttl")


@given(st.integers(min_value=1, max_value=10**8))
def test_format_duration_round_trips(seconds):
    assert parse_duration(format_duration(timedelta(seconds=seconds))).total_seconds() == seconds


@pytest.mark.parametrize("text", ["team=a", "a.b_c-d=", "x=with spaces", "0=0"])
def test_good_labels(text):
    key, value = parse_label(text)
    assert f"{key}={value}" == text


@pytest.mark.parametrize(
    ("text", "why"),
    [("noequals", "K=V"), ("Bad=1", "lower-case"), ("sbx.id=x", "reserved"), ("-x=1", "starting"),
     ("k" * 64 + "=v", "63"), ("=v", "label key")],
)
def test_bad_labels(text, why):
    with pytest.raises(BadInput, match=why):
        parse_label(text)


def test_ids_and_names():
    sid = new_sandbox_id()
    assert sid.startswith("sbx-") and len(sid) == 30 and sid == sid.lower()
    assert validate_name("web-1") == "web-1"
    for bad in ["", "-x", "sbx-mine", "a b", "x" * 64]:
        with pytest.raises(BadInput):
            validate_name(bad)


def test_state_table_is_closed_and_events_named():
    for (src, dst), event in TRANSITIONS.items():
        assert event.startswith("sandbox.")
        assert src != dst
    assert not any(src == State.DESTROYED for src, _ in TRANSITIONS)  # terminal
    assert all(can_transition(s, State.LOST) for s in LIVE)


@pytest.mark.parametrize(("src", "dst"), [("destroyed", "running"), ("creating", "paused"),
                                          ("failed", "running"), ("destroyed", "destroying")])
def test_illegal_transition_is_a_conflict(src, dst):
    with pytest.raises(Conflict, match=f"is {src}: it cannot become {dst}"):
        transition_event(src, dst)
