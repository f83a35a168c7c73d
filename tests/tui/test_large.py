"""The dashboard on a large inventory (issue 36): the first rows show before the rest are
added, every row ends up shown in order, and a change of one sandbox updates that row's
cells in place (no row added again, no rebuild)."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import timedelta

from tests.tui.helpers import opened, wait_for

COUNT = 1_500  # more than LOAD_FIRST + two LOAD_STEPs


def copies(path, count: int) -> None:
    """`count` copies of the one sandbox row, created a second apart after it, by SQL."""
    from sandboxer.core.rules.clock import from_iso, to_iso
    from sandboxer.core.rules.ids import new_sandbox_id

    conn = sqlite3.connect(path)
    try:
        conn.row_factory = sqlite3.Row
        row = dict(conn.execute("SELECT * FROM sandboxes").fetchone())
        row.pop("change_seq")  # the database sets it
        created = from_iso(row["created_at"])
        rows = [{**row, "id": new_sandbox_id(), "name": f"copy-{i:04d}",
                 "created_at": to_iso(created + timedelta(seconds=i))}
                for i in range(1, count + 1)]
        conn.executemany(f"INSERT INTO sandboxes ({', '.join(row)}) VALUES "
                         f"({', '.join(':' + n for n in row)})", rows)
        conn.commit()
    finally:
        conn.close()


def test_a_large_inventory_shows_first_then_whole_and_a_change_touches_one_row(
        dashboard, mgr, sbx_home, monkeypatch):
    from sandboxer.core.rules.profiles import ProfileLoader
    from sandboxer_tui.dashboard.widgets import table as table_module

    first = asyncio.run(mgr.create(ProfileLoader().load("stub"), name="first"))
    copies(sbx_home / "sbx.db", COUNT - 1)
    painted = []  # rows in the table when the first inventory was applied
    apply = table_module.SandboxTable.apply

    def spy(self, inventory):
        apply(self, inventory)
        painted.append(self.row_count)

    monkeypatch.setattr(table_module.SandboxTable, "apply", spy)

    async def scenario():
        async with opened(dashboard) as (app, pilot):
            table = app.main.table
            assert painted[0] == table_module.LOAD_FIRST  # the rest after the first paint
            await wait_for(pilot, lambda: table.row_count == COUNT, within=60,
                           what="every row added")
            ids = [key.value for key in table.rows_in_order()]
            assert ids[0] == first["id"] and len(set(ids)) == COUNT
            created = [table.sandboxes[i].created_at for i in ids]
            assert created == sorted(created)  # oldest first, as a rebuild at once would
            added, rebuilt = [], []
            monkeypatch.setattr(table, "_add", lambda row: added.append(row.id))
            monkeypatch.setattr(table, "rebuild", lambda: rebuilt.append(1))
            before = table.cell_text(first["id"], "ttl")
            await (await dashboard.sbx.get(first["id"])).extend("20m")
            await wait_for(pilot, lambda: table.cell_text(first["id"], "ttl") != before,
                           within=10, what="the extended TTL")
            assert added == [] and rebuilt == []
            assert [key.value for key in table.rows_in_order()] == ids

    asyncio.run(scenario())


TICK_COUNT = 3_000  # rows in the table; the screen shows a few dozen


def test_a_tick_redraws_the_countdowns_on_screen_only_and_the_rest_when_scrolled_to(
        dashboard, mgr, sbx_home, clock, monkeypatch):
    """Each second the countdowns move; only the rows on screen have their cells made and
    updated (issue 36: a walk of every row each tick cost a core's tenth at 10,000). A row
    scrolled into view shows the countdown of now, before the next tick."""
    from sandboxer.core.rules.profiles import ProfileLoader
    from sandboxer_tui.dashboard.widgets import table as table_module

    asyncio.run(mgr.create(ProfileLoader().load("stub"), name="first", ttl=timedelta(hours=1)))
    copies(sbx_home / "sbx.db", TICK_COUNT - 1)  # the same deadline: every countdown moves

    async def scenario():
        async with opened(dashboard) as (app, pilot):
            table = app.main.table
            await wait_for(pilot, lambda: table.row_count == TICK_COUNT, within=60,
                           what="every row added")
            await pilot.pause()
            on_screen = len(table.visible_ids())
            assert 10 < on_screen < 50  # the test's terminal: a few dozen rows
            made, updated = [], []
            ttl_cell = table_module.ttl_cell
            monkeypatch.setattr(table_module, "ttl_cell",
                                lambda row, *a: made.append(row.id) or ttl_cell(row, *a))
            update_cell = table.update_cell
            monkeypatch.setattr(table, "update_cell", lambda row, column, *a, **k: (
                updated.append((row, column)), update_cell(row, column, *a, **k)))
            top = table.visible_ids()[0]
            before = table.cell_text(top, "ttl")
            for _ in range(3):
                clock.advance(timedelta(seconds=1))
                app.main.tick()
            assert table.cell_text(top, "ttl") != before  # it ticks on screen
            assert set(made) == set(table.visible_ids()) and len(made) == 3 * on_screen
            assert {c for _, c in updated} <= {"ttl", "age"}
            assert len([r for r, c in updated if c == "ttl"]) == 3 * on_screen
            last = table.rows_in_order()[-1].value
            stale = table.cell_text(last, "ttl")
            table.scroll_end(animate=False)
            await wait_for(pilot, lambda: last in table.visible_ids(), within=10,
                           what="the last row on screen")
            assert table.cell_text(last, "ttl") == table.cell_text(
                table.visible_ids()[0], "ttl") != stale  # today's countdown, not the old one

    asyncio.run(scenario())


def test_a_change_off_screen_draws_no_line_on_screen_again(
        dashboard, mgr, sbx_home, clock, monkeypatch):
    """A change of a row off screen makes the table draw again, but the lines on screen are
    the ones already drawn (Textual would draw each again); a tick draws each line once."""
    from textual.widgets import DataTable

    from sandboxer.core.rules.profiles import ProfileLoader

    asyncio.run(mgr.create(ProfileLoader().load("stub"), name="first", ttl=timedelta(hours=1)))
    copies(sbx_home / "sbx.db", TICK_COUNT - 1)

    async def scenario():
        async with opened(dashboard) as (app, pilot):
            table = app.main.table
            await wait_for(pilot, lambda: table.row_count == TICK_COUNT, within=60,
                           what="every row added")
            drawn = []
            draw = DataTable._render_line
            monkeypatch.setattr(DataTable, "_render_line", lambda self, y, *a: (
                drawn.append(y) if self is table else None, draw(self, y, *a))[1])
            clock.advance(timedelta(seconds=1))
            app.main.tick()
            await pilot.pause()
            await pilot.pause()
            on_screen = len(drawn)
            assert len(set(drawn)) == on_screen > 10  # the header is the same: not drawn
            last = table.rows_in_order()[-1].value
            before = table.cell_text(last, "ttl")
            for _ in range(2):
                drawn.clear()
                await (await dashboard.sbx.get(last)).extend("20m")
                await wait_for(pilot, lambda b=before: table.cell_text(last, "ttl") != b,
                               within=10, what="the change applied")
                before = table.cell_text(last, "ttl")
                await pilot.pause()
                assert last not in table.visible_ids() and drawn == []

    asyncio.run(scenario())


def test_metrics_are_followed_only_while_a_running_sandbox_can_report_them(
        sbx_home, profiles, clock, monkeypatch):
    """With none running on a backend that reports metrics the dashboard does not follow
    live metrics (following them listed every running sandbox every 2 s, most of its idle
    CPU at 10,000 sandboxes of a backend without metrics), and it starts as soon as one
    runs."""
    from sandboxer.adapters.stub import StubAdapter
    from sandboxer.core.follow import sampler
    from sandboxer.core.lifecycle.manager import Manager
    from sandboxer.core.rules.profiles import ProfileLoader
    from sandboxer.core.store.db import Database
    from tests.tui.helpers import FullStub, make_dashboard

    started = []  # each start of following every running sandbox's metrics
    follow_all = sampler.follow_all

    def following(*args, **kwargs):
        started.append(1)
        return follow_all(*args, **kwargs)

    monkeypatch.setattr(sampler, "follow_all", following)

    def manager(adapter, db: str):
        return Manager(Database(f"sqlite:///{sbx_home / db}"), clock, actor="alice",
                       adapters={"stub": adapter})

    async def looked_a_while(app, pilot) -> None:
        await wait_for(pilot, lambda: "exec" in app.dashboard.known_capabilities("stub"),
                       within=10, what="the stub's capabilities")
        for _ in range(3):
            app.main.poll()
            await pilot.pause(0.2)

    async def without_metrics():  # running, on a backend that reports no metrics
        mgr = manager(StubAdapter(), "plain.db")
        await mgr.create(ProfileLoader().load("stub"), name="no-metrics")
        async with opened(make_dashboard(mgr, backends=["stub"], sample_metrics=True)) \
                as (app, pilot):
            await looked_a_while(app, pilot)
            assert started == []

    async def paused_then_resumed():  # on one that does: not running, then running
        mgr = manager(FullStub(clock), "full.db")
        box = await mgr.create(ProfileLoader().load("stub"), name="with-metrics")
        await mgr.pause(box["id"])
        dashboard = make_dashboard(mgr, backends=["stub"], sample_metrics=True)
        async with opened(dashboard) as (app, pilot):
            await looked_a_while(app, pilot)
            assert started == []
            await (await dashboard.sbx.get(box["id"])).resume()
            await wait_for(pilot, lambda: started, within=10, what="the metrics followed")

    asyncio.run(without_metrics())
    asyncio.run(paused_then_resumed())
    FullStub.reset()
