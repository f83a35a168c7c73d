"""The widgets tell their screen what happened by message, whatever screen holds them: the
filter line (what to filter by, done with it) and the table (the selected sandbox)."""

from __future__ import annotations

import asyncio

from textual import on
from textual.app import App, ComposeResult

from sandboxer_tui.dashboard.widgets.filter import FilterInput

from .helpers import opened, screen_text, select, wait_for


class FilterHost(App):
    """Any app holding the filter line: it calls nothing on its screen."""

    def __init__(self) -> None:
        super().__init__()
        self.heard: list[tuple[str, object]] = []

    def compose(self) -> ComposeResult:
        yield FilterInput(id="filter")

    @on(FilterInput.FilterChanged)
    def changed(self, event: FilterInput.FilterChanged) -> None:
        self.heard.append(("changed", event.text))

    @on(FilterInput.FilterClosed)
    def closed(self, event: FilterInput.FilterClosed) -> None:
        self.heard.append(("closed", event.kept))


def test_the_filter_line_posts_what_to_filter_by_and_when_it_is_done():
    async def scenario():
        app = FilterHost()
        async with app.run_test() as pilot:
            app.query_one(FilterInput).focus()
            await pilot.press("a", "space", "b", "enter")
            await wait_for(pilot, lambda: ("closed", True) in app.heard)
            assert app.heard == [("changed", "a"), ("changed", "a"), ("changed", "a b"),
                                 ("closed", True)]  # stripped; Enter keeps it
            await pilot.press("escape")
            await wait_for(pilot, lambda: ("closed", False) in app.heard)
            await pilot.pause()
            assert app.query_one(FilterInput).value == ""
            assert set(app.heard[4:]) == {("closed", False), ("changed", "")}

    asyncio.run(scenario())


def test_the_detail_follows_the_sandbox_the_table_selects(dashboard, seeded):
    """The cursor, and a filter that leaves another row under it: the table says which
    sandbox is selected, and the detail shows that one."""

    async def scenario():
        async with opened(dashboard) as (app, pilot):
            table, detail = app.main.table, app.main.detail
            await select(pilot, seeded["ci"]["id"])
            await wait_for(pilot, lambda: detail.sandbox_id == seeded["ci"]["id"])
            await pilot.press("slash", *"batch")
            await wait_for(pilot, lambda: table.selected_id == seeded["paused"]["id"])
            await wait_for(pilot, lambda: detail.sandbox_id == seeded["paused"]["id"],
                           what="the detail to follow the table")
            await pilot.pause(0.1)
            assert any(line.startswith("name") and "batch-7" in line
                       for line in screen_text(app).splitlines())  # the overview's name row

    asyncio.run(scenario())
