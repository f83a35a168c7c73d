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
