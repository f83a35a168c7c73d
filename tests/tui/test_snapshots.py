"""Snapshot tests of the main views (pytest-textual-snapshot): the same seeded inventory,
ids and frozen clock on every run, so the SVGs under __snapshots__/ are stable. Update them
after an intended change with `pytest tests/tui/test_snapshots.py --snapshot-update` and
look at the report."""

from __future__ import annotations

import asyncio

import pytest

from sandboxer_tui.dashboard.app import SandboxerApp
from sandboxer_tui.dashboard.screens.modals import ConfirmScreen

from .helpers import deterministic_ids, make_dashboard, seed_fleet

SIZE = (120, 36)


@pytest.fixture
def fleet(monkeypatch, mgr, clock):
    deterministic_ids(monkeypatch)
    return asyncio.run(seed_fleet(mgr, clock))


@pytest.fixture
def app(mgr, fleet):
    return SandboxerApp(make_dashboard(mgr, backends=["stub"], sample_metrics=False))


async def loaded(pilot) -> None:
    """The first inventory, metrics and health have landed; nothing else is pending."""
    app = pilot.app
    for _ in range(200):
        main = app.main
        if main.table.loaded and main.health.statuses and "5%" in main.table.cell_text(
                main.table.shown_ids[0], "cpu"):
            break
        await pilot.pause(0.05)
    await app.workers.wait_for_complete()
    await pilot.pause()


def on(sandbox_key: str, fleet, *keys: str):
    async def run_before(pilot) -> None:
        await loaded(pilot)
        table = pilot.app.main.table
        table.move_cursor(row=table.get_row_index(fleet[sandbox_key]["id"]), animate=False)
        await pilot.pause()
        if keys:
            await pilot.press(*keys)
        await pilot.pause(0.3)
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
    return run_before


def test_main_view(snap_compare, app, fleet):
    assert snap_compare(app, terminal_size=SIZE, run_before=on("api", fleet))


def test_detail_metrics(snap_compare, app, fleet):
    assert snap_compare(app, terminal_size=SIZE, run_before=on("api", fleet, "4"))


def test_detail_checkpoints_lineage(snap_compare, app, fleet):
    assert snap_compare(app, terminal_size=SIZE, run_before=on("fork", fleet, "5"))


def test_detail_events(snap_compare, app, fleet):
    assert snap_compare(app, terminal_size=SIZE, run_before=on("evil", fleet, "3"))


def test_destroy_confirmation_of_marked_rows(snap_compare, app, fleet):
    async def run_before(pilot) -> None:
        await on("api", fleet, "space", "space")(pilot)
        await pilot.press("d")
        for _ in range(100):
            if isinstance(pilot.app.screen, ConfirmScreen):
                break
            await pilot.pause(0.05)
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
