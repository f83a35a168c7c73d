"""The dashboard's headless rules (sandboxer_tui.dashboard.model and .formatting), without any UI: the
countdown levels, compact durations, filter and raw-value sorting, which action applies, the
equivalent commands; and the inventory watch (sandboxer.core.follow.watch, through the library) that notices
another process's change and reads nothing when nobody changed anything."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta

import pytest

from sandboxer import MetricSample
from sandboxer.core.follow.watch import InventoryWatcher
from sandboxer.core.rules.errors import BadInput
from sandboxer_tui.dashboard.model import (
    MetricsBuffer,
    SandboxRow,
    available,
    equivalent_command,
    matches,
    parse_create_args,
    short_id_length,
    sort_key,
    sparkline,
    ttl_level,
)
from sandboxer_tui.formatting import compact_age as human_age
from sandboxer_tui.formatting import compact_duration as human_duration
from sandboxer_tui.formatting import human_bytes

from .helpers import make_dashboard


def test_compact_durations_and_sizes():
    assert [human_duration(s) for s in (None, -5, 0, 42, 60, 1799, 3600, 5400, 90000)] == \
        ["-", "0s", "0s", "42s", "1m00s", "29m59s", "1h00m", "1h30m", "1d1h"]
    assert [human_age(s) for s in (42, 720, 11520)] == ["42s", "12m", "3h12m"]
    assert human_bytes(None) == "-" and human_bytes(512) == "512B"
    assert human_bytes(64 * 1024**2) == "64.0MB" and human_bytes(3 * 1024**3) == "3.0GB"


def test_countdown_turns_yellow_in_the_warning_window_then_red():
    warn = 300
    assert ttl_level(None, warn) is None  # not on the clock (failed, destroyed)
    assert ttl_level(3600, warn) == "ok"
    assert ttl_level(301, warn) == "ok"
    assert ttl_level(300, warn) == "warning"
    assert ttl_level(61, warn) == "warning"
    assert ttl_level(60, warn) == "critical"
    assert ttl_level(0, warn) == "expired"


def test_sparkline_scales_to_a_top_and_keeps_the_last_values():
    assert sparkline([], 5) == ""
    assert sparkline([0, 50, 100], 5, top=100) == "▁▅█"
    assert sparkline(list(range(20)), 5) == sparkline(list(range(15, 20)), 5)
    assert sparkline([None, 10.0], 5, top=100) == "▂"


def test_short_ids_are_unique_prefixes():
    ids = ["sbx-01aaaaaaaaaaxx", "sbx-01aaaaaaaaabyy", "sbx-01bbbbbbbbbbzz"]
    n = short_id_length(ids, minimum=8)
    assert n == 16 and len({i[:n] for i in ids}) == 3
    assert short_id_length(["sbx-1", "sbx-2"], minimum=14) == 14


def row(mgr, **over):
    """A row as the dashboard makes it from the library's record of a sandbox."""
    from sandboxer import AsyncSandbox

    view = {"id": "sbx-01abc", "name": "web", "profile": "default", "backend": "docker",
            "backend_ref": "c0ffee", "state": "running", "owner": "alice@host",
            "task": "fix the bug", "labels": {"team": "core"}, "install": "i", "host": "h",
            "created_at": "2026-03-02T09:00:00.000000Z", "started_at": None,
            "deadline": "2026-03-02T10:00:00.000000Z",
            "hard_deadline": "2026-03-02T13:00:00.000000Z",
            "last_activity_at": "2026-03-02T09:00:00.000000Z", "idle_timeout_s": None,
            "idle_deadline": None, "ended_at": None, "error": None}
    view.update(over)
    return SandboxRow.from_record(AsyncSandbox(None, view))


def test_filter_words_fields_and_labels(clock):
    web = row(None)
    assert matches(web, "")
    assert matches(web, "WEB") and matches(web, "alice") and matches(web, "team=core")
    assert matches(web, "state:run") and not matches(web, "state:paused")
    assert matches(web, "label:team=core") and not matches(web, "label:team=ops")
    assert matches(web, "web alice") and not matches(web, "web bob")
    assert not matches(web, "name:alice")  # a field filter looks only at that field


def test_sort_keys_use_raw_values_not_text(clock):
    now = clock.now().replace(hour=9, minute=30)
    short = row(None, id="sbx-2", deadline="2026-03-02T09:35:00.000000Z")  # 5m left: "5m00s"
    long = row(None, id="sbx-3", deadline="2026-03-02T19:00:00.000000Z")  # 9h30m: "9h30m"
    dead = row(None, id="sbx-4", state="failed")
    ordered = sorted([long, dead, short], key=lambda r: sort_key(r, "ttl", now))
    assert [r.id for r in ordered] == ["sbx-2", "sbx-3", "sbx-4"]  # "5m00s" > "9h30m" as text

    def sample(cpu):
        return MetricSample("x", datetime(2026, 3, 2, tzinfo=UTC), cpu, None, None, None, None,
                            None)

    latest = {"sbx-2": sample(9.0), "sbx-3": sample(80.0)}
    busiest = sorted([short, long, dead],
                     key=lambda r: sort_key(r, "cpu", now, latest.get(r.id)))
    assert [r.id for r in busiest] == ["sbx-3", "sbx-2", "sbx-4"]  # unknown last


def test_which_action_applies_to_which_sandbox():
    caps = frozenset({"exec", "logs", "pause", "snapshot"})
    running, paused, failed = row(None), row(None, state="paused"), row(None, state="failed")
    destroyed = row(None, state="destroyed")
    assert available("pause", running, caps) and available("pause", paused, caps)
    assert not available("pause", running, frozenset({"exec"}))
    assert available("exec", running, caps) and not available("exec", paused, caps)
    assert available("extend", paused, caps) and not available("extend", failed, caps)
    assert available("destroy", failed, caps) and not available("destroy", destroyed, caps)
    assert available("touch", paused, caps) and not available("touch", failed, caps)
    assert available("shell", running, caps | {"shell"})  # the backend has one here
    assert not available("shell", running, caps)


def test_equivalent_commands_are_quoted_command_lines():
    assert equivalent_command("destroy", ["sbx-1", "sbx-2"]) == "sbx destroy sbx-1 sbx-2"
    assert equivalent_command("extend", ["sbx-1"], "30m") == "sbx extend sbx-1 30m"
    args = parse_create_args("default", "1h", "web-1", "team=core, note=a b")
    assert args.command == ("sbx create --profile default --ttl 1h --name web-1 "
                            "--label team=core --label 'note=a b'")


@pytest.mark.parametrize("field,kwargs,message", [
    ("ttl", {"ttl": "soon"}, "bad ttl 'soon'"),
    ("ttl", {"ttl": "0s"}, "must be longer than zero"),
    ("name", {"name": "[red]x"}, "bad name"),
    ("labels", {"labels": "novalue"}, "bad label 'novalue'"),
    ("labels", {"labels": "sbx.id=1"}, "reserved"),
])
def test_picker_fields_are_checked_like_the_cli(field, kwargs, message):
    with pytest.raises(BadInput, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_create_args("default", **kwargs)


def test_metrics_buffer_keeps_the_last_samples_and_reports_changes():
    buffer = MetricsBuffer(size=3)

    def sample(second, cpu):
        return MetricSample("a", datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC), cpu, 1, None,
                            None, None, None)

    for second in range(5):
        buffer.add(sample(second, float(second)))
    buffer.add(sample(1, 99.0))  # older than the last: a replay, ignored
    assert [s.cpu_pct for s in buffer.series("a")] == [2.0, 3.0, 4.0]
    assert buffer.take_changed() == {"a"} and buffer.take_changed() == set()
    buffer.forget(["b"])
    assert buffer.series("a") == []


def test_closing_the_reader_waits_for_the_read_in_progress(mgr, profiles, monkeypatch):
    """The dashboard closes its reader on one worker thread while a refresh may be reading on
    another; closing the SQLite connection under that read crashed the whole process."""
    from sandboxer.core.rules.profiles import ProfileLoader

    asyncio.run(mgr.create(ProfileLoader().load("stub"), name="one"))
    reader = InventoryWatcher(mgr.db.url)
    reading, go_on = threading.Event(), threading.Event()
    select = InventoryWatcher._select

    def slow_select(self, *args):
        reading.set()
        go_on.wait(10)
        return select(self, *args)

    monkeypatch.setattr(InventoryWatcher, "_select", slow_select)
    results = []
    refresh = threading.Thread(target=lambda: results.append(reader.read()))
    refresh.start()
    assert reading.wait(10)
    closer = threading.Thread(target=reader.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive(), "close() did not wait for the read in progress"
    go_on.set()
    refresh.join(10)
    closer.join(10)
    assert [len(r.added) for r in results] == [1]  # the first read: every row
    assert reader._conn is None
    assert not reader.read().any_change and reader._conn is None  # closed stays closed


def test_reader_sees_another_process_change_and_reads_nothing_otherwise(mgr, sbx_home,
                                                                        profiles, monkeypatch):
    from sandboxer.core.rules.profiles import ProfileLoader

    box = asyncio.run(mgr.create(ProfileLoader().load("stub"), name="one"))
    dash = make_dashboard(mgr, backends=["stub"], sample_metrics=False)
    calls = []
    select = InventoryWatcher._select

    def counting(self, *args):
        calls.append(True)
        return select(self, *args)

    async def scenario():
        try:
            first = await dash.read_inventory()
            assert first.added == [box["id"]] and first.rows[box["id"]].name == "one"
            monkeypatch.setattr(InventoryWatcher, "_select", counting)
            idle = await dash.read_inventory()
            assert not idle.any_change and calls == []  # nobody wrote: no rows were read
            same_row = idle.rows[box["id"]]
            # another process extends it (the real `sbx extend`, in a subprocess)
            env = {"SBX_HOME": str(sbx_home), "SBX_PROFILE_PATH": str(profiles),
                   "PATH": "/usr/bin:/bin"}
            done = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "sandboxer_tui.cli", "extend",
                                 box["id"], "10m"], env=env, capture_output=True, text=True,
                timeout=60)
            assert done.returncode == 0, done.stderr
            after = await dash.read_inventory()
            assert after.changed == [box["id"]] and not after.added and not after.removed
            assert after.rows[box["id"]].deadline - same_row.deadline == timedelta(minutes=10)
            assert calls == [True]
        finally:
            await dash.close()

    asyncio.run(scenario())


def test_dashboard_actions_report_each_target(mgr, profiles):
    from sandboxer.core.rules.profiles import ProfileLoader

    stub = ProfileLoader().load("stub")
    a = asyncio.run(mgr.create(stub, name="a"))
    dash = make_dashboard(mgr, backends=["stub"], sample_metrics=False)

    async def scenario():
        try:
            outcome = await dash.extend([a["id"], "sbx-nope"], timedelta(hours=10))
            assert outcome.done == [a["id"]]
            assert outcome.failed == [("sbx-nope", "no sandbox 'sbx-nope'")]
            assert any("capped at the hard deadline" in n for n in outcome.notes)
            assert outcome.severity == "error"
            assert [r.command for r in dash.command_log] == [
                f"sbx extend {a['id']} 10h; sbx extend sbx-nope 10h"]
        finally:
            await dash.close()

    asyncio.run(scenario())


def test_first_read_needs_no_manager_and_a_fresh_home_is_migrated(sbx_home, profiles):
    from sandboxer_tui.dashboard.model import Dashboard

    async def first_read(dash):
        try:
            return await dash.read_inventory(), dash.sbx._transport._mgr
        finally:
            await dash.close()

    # no database yet: through the Manager, which migrates
    empty, manager = asyncio.run(first_read(Dashboard(sample_metrics=False)))
    assert empty.rows == {} and manager is not None
    assert (sbx_home / "sbx.db").exists()
    from sandboxer.core.rules.profiles import ProfileLoader

    maker = manager_for(sbx_home)
    box = asyncio.run(maker.create(ProfileLoader().load("stub"), name="later"))
    try:
        seen, manager = asyncio.run(first_read(Dashboard(sample_metrics=False)))
        assert list(seen.rows) == [box["id"]]
        assert manager is None  # read like `sbx ls`: no ORM, no Manager
    finally:
        asyncio.run(maker.close())


def manager_for(home):
    from sandboxer.core.lifecycle.manager import Manager
    from sandboxer.core.store.db import Database

    return Manager(Database(f"sqlite:///{home / 'sbx.db'}"))


def test_one_module_formats_durations_and_sizes_for_the_cli_and_the_dashboard():
    """`sbx ls` keeps every unit (a TTL it prints can be pasted back into `--ttl`); the
    dashboard's cells keep two. Both come from sandboxer_tui.formatting."""
    from sandboxer.core.rules.durations import parse_duration
    from sandboxer_tui.cli import metrics
    from sandboxer_tui.cli import output as cli
    from sandboxer_tui.formatting import exact_duration, megabytes

    seconds = 86400 + 3600 + 60 + 1
    assert cli.human_left(seconds) == exact_duration(seconds) == "1d1h1m1s"
    assert parse_duration(cli.human_left(seconds)) == timedelta(seconds=seconds)
    assert cli.human_left(None) == "-" and cli.human_left(0) == "0s"
    assert cli.human_age("2026-03-01T08:00:00.000000Z", "2026-03-02T09:01:01.000000Z") == \
        "1d1h1m1s"
    assert human_duration(seconds) == "1d1h" and human_age(seconds) == "1d1h"
    line = metrics._metric_line({"time": "t", "cpu_pct": 1.5, "memory_bytes": 64 * 1024**2,
                             "memory_limit": 512 * 1024**2, "pids": 3, "net_rx_bytes": None,
                             "net_tx_bytes": None})
    assert "mem 64.0MB / 512.0MB" in line and megabytes(None) == "-"
