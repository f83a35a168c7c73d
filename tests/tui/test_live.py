"""The dashboard is live: other processes' changes show within 2 s, countdowns tick and
change colour, metrics stream into the sparklines."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

from sandboxer.adapters.base import MetricSample
from sandboxer.core.lifecycle.manager import Manager
from sandboxer.core.rules.clock import Clock
from sandboxer.core.store.db import Database

from .helpers import FullStub, make_dashboard, opened, select, wait_for


def sbx(home, profiles, *args: str, offset: str | None = None) -> subprocess.CompletedProcess:
    """The real CLI in another process, on the same SBX_HOME."""
    env = {"SBX_HOME": str(home), "SBX_PROFILE_PATH": str(profiles), "PATH": "/usr/bin:/bin",
           "XDG_CONFIG_HOME": str(home.parent / "xdg-config")}
    if offset:
        env["SBX_CLOCK_OFFSET"] = offset
    done = subprocess.run([sys.executable, "-m", "sandboxer_tui.cli", *args], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done


async def within(pilot, predicate, seconds: float, what: str) -> float:
    started = time.monotonic()
    await wait_for(pilot, predicate, within=seconds, step=0.02, what=what)
    return time.monotonic() - started


def test_changes_by_other_processes_show_within_two_seconds(sbx_home, profiles):
    FullStub.reset()
    mgr = Manager(Database(f"sqlite:///{sbx_home / 'sbx.db'}"), Clock(), actor="alice")
    dashboard = make_dashboard(mgr, backends=["stub"], sample_metrics=False)

    async def scenario():
        async with opened(dashboard) as (app, pilot):
            table = app.main.table
            assert table.shown_ids == []
            made = await asyncio.to_thread(sbx, sbx_home, profiles, "create", "--profile",
                                           "stub", "--name", "from-elsewhere", "--json")
            box = json.loads(made.stdout)
            took = await within(pilot, lambda: table.is_shown(box["id"]), 2.0, "the new row")
            assert table.cell_text(box["id"], "name") == "from-elsewhere"
            assert table.cell_text(box["id"], "state") == "running"
            await asyncio.to_thread(sbx, sbx_home, profiles, "extend", box["id"], "1h")
            await within(pilot, lambda: table.cell_text(box["id"], "ttl").startswith("1h29m"),
                         2.0, "the extended countdown")
            # a cron `sbx reap` an hour and a half later: expired, destroyed, gone
            await asyncio.to_thread(sbx, sbx_home, profiles, "reap", offset="2h")
            await within(pilot, lambda: not table.is_shown(box["id"]), 2.0, "the reaped row")
            assert mgr.resolve(box["id"])["state"] == "destroyed"
            print(f"new row shown {took:.2f}s after `sbx create` returned")

    asyncio.run(scenario())


def test_countdown_ticks_and_turns_yellow_then_red_then_expired(dashboard, mgr, clock):
    from sandboxer.core.rules.profiles import ProfileLoader

    box = asyncio.run(mgr.create(ProfileLoader().load("stub"), ttl=timedelta(minutes=6)))

    async def scenario():
        async with opened(dashboard) as (app, pilot):
            table = app.main.table

            def ttl():
                cell = table.get_cell(box["id"], "ttl")
                return cell.plain, str(cell.style)

            assert ttl() == ("6m00s", "")
            for advance, expect in ((1, ("5m59s", "")), (59, ("5m00s", "yellow")),
                                    (240, ("1m00s", "bold red")), (59, ("1s", "bold red")),
                                    (1, ("expired", "bold white on red"))):
                clock.advance(timedelta(seconds=advance))
                await within(pilot, lambda e=expect: ttl() == e, 1.5, f"TTL {expect}")
            assert table.cell_text(box["id"], "age") == "6m"

    asyncio.run(scenario())


class StreamingStub(FullStub):
    """Metrics as a real backend sends them: a new sample every 100 ms, forever."""

    async def metrics(self, ref: str) -> AsyncIterator[MetricSample]:
        n = 0
        while True:
            n += 1
            yield MetricSample(datetime.now(UTC), cpu_pct=float(10 * (n % 9)),
                               memory_bytes=(100 + n) * 1024 * 1024,
                               memory_limit=512 * 1024 * 1024, pids=2)
            await asyncio.sleep(0.1)


def test_metrics_stream_into_the_sparklines(sbx_home, profiles):
    from sandboxer.core.rules.profiles import ProfileLoader

    FullStub.reset()
    mgr = Manager(Database(f"sqlite:///{sbx_home / 'sbx.db'}"), Clock(), actor="alice",
                  adapters={"stub": StreamingStub()})
    box = asyncio.run(mgr.create(ProfileLoader().load("stub")))
    dashboard = make_dashboard(mgr, backends=["stub"], sample_metrics=True)

    async def scenario():
        async with opened(dashboard) as (app, pilot):
            table = app.main.table
            await within(pilot, lambda: table.cell_text(box["id"], "mem") != "-", 3.0,
                         "a first sample")
            first = table.cell_text(box["id"], "mem")
            await within(pilot, lambda: table.cell_text(box["id"], "mem") != first, 3.0,
                         "a later sample")
            cpu = table.cell_text(box["id"], "cpu")
            spark, percent = cpu.split()
            assert 1 <= len(spark) <= 5 and percent.endswith("%")
            assert table.cell_text(box["id"], "mem").endswith("MB")
            await select(pilot, box["id"])
            await pilot.press("4")
            await within(pilot, lambda: "samples over" in str(
                app.main.query_one("#cpu-label").render()), 3.0, "the metrics tab")

    asyncio.run(scenario())
