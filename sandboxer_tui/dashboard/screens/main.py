"""The main view: the health line, the filter, the sandbox table, the detail tabs, the footer.

This module is the layout and the event handling: timers start short workers that read
through the library (`Dashboard`) and post what they found (screens/messages.py); widgets
post their own messages (the table's selection, the filter, the detail's tabs); the handlers
here are the one place each reaches the widgets. The actions, one key each, are in
screens/actions.py. The UI never waits on I/O: the library runs it on a loop of its own.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer

from sandboxer_tui.dashboard.model import Dashboard, SandboxRow, health_state
from sandboxer_tui.dashboard.screens.actions import ActionsMixin
from sandboxer_tui.dashboard.screens.messages import (
    ActionFinished,
    CapabilitiesKnown,
    CheckpointsLoaded,
    DetailLoaded,
    EventsLoaded,
    HealthChecked,
    HistoryLoaded,
    InventoryRead,
    InventoryUnreadable,
    LogsLoaded,
    MetricsArrived,
)
from sandboxer_tui.dashboard.widgets.detail import TABS, DetailPanel
from sandboxer_tui.dashboard.widgets.filter import FilterInput
from sandboxer_tui.dashboard.widgets.header import HealthBar
from sandboxer_tui.dashboard.widgets.table import SandboxTable
from sandboxer_tui.formatting import one_line


class MainScreen(ActionsMixin, Screen):
    AUTO_FOCUS = "#sandboxes"
    BINDINGS = [
        Binding("n", "new", "New"),
        Binding("d", "destroy", "Destroy"),
        Binding("t", "extend", "Extend"),
        Binding("T", "extend_by", "Extend by…", show=False),
        Binding("s", "snapshot", "Snapshot"),
        Binding("r", "restore", "Restore"),
        Binding("p", "pause", "Pause"),
        Binding("x", "exec", "Exec"),
        Binding("e", "shell", "Shell"),
        Binding("k", "touch", "Touch", show=False),
        Binding("l", "logs", "Logs", show=False),
        Binding("slash", "filter", "Filter"),
        Binding("space", "mark", "Mark", show=False),
        Binding("o", "sort", "Sort", show=False),
        Binding("O", "sort_reverse", "Reverse sort", show=False),
        Binding("a", "toggle_all", "Show destroyed", show=False),
        Binding("c", "command_log", "Command log", show=False),
        Binding("escape", "clear_marks", "Clear marks", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
        *(Binding(str(i + 1), f"tab('{tab}')", tab.capitalize(), show=False)
          for i, tab in enumerate(TABS)),
    ]

    def __init__(self, dashboard: Dashboard, *, read_only: bool = False, refresh: float = 1.0,
                 extend_step: timedelta = timedelta(minutes=30), new_labels: str = "") -> None:
        super().__init__()
        self.dashboard = dashboard
        self.read_only = read_only
        self.refresh_s = refresh
        self.extend_step = extend_step
        self.new_labels = new_labels
        self._polling = False
        self._poll_error: str | None = None
        self._first_load = True
        self._ticks = 0
        self._selected: str | None = None
        self._history: dict[str, list[Any]] = {}
        self._metrics_follow: Any = None  # the worker following live samples, while wanted
        self._metrics_failed = False
        self.health_every, self.health_retry = 10.0, 2.0

    # -- layout -----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        warn_s = 300.0
        yield HealthBar(read_only=self.read_only, id="health")
        yield FilterInput(placeholder="filter: words, or field:value (state:running, "
                          "label:team=core); Enter keeps it, Escape clears", id="filter")
        yield SandboxTable(warn_s=warn_s, id="sandboxes")
        yield DetailPanel(warn_s=warn_s, id="detail")
        yield Footer()

    @property
    def table(self) -> SandboxTable:
        return self.query_one("#sandboxes", SandboxTable)

    @property
    def detail(self) -> DetailPanel:
        return self.query_one("#detail", DetailPanel)

    @property
    def health(self) -> HealthBar:
        return self.query_one("#health", HealthBar)

    def on_mount(self) -> None:
        self.table.metrics = self.dashboard.metrics
        self.table.show_destroyed = self.dashboard.include_destroyed
        self.table.loading = True
        self.table.focus()
        self.set_interval(self.refresh_s, self.poll)
        self.set_interval(1.0, self.tick)
        self._spinner = self.set_interval(0.12, self._spin, pause=True)
        self.poll()  # the health check and metrics start after the first inventory

    def on_worker_state_changed(self, event) -> None:
        self.app.report_worker_error(event)  # type: ignore[attr-defined]

    # -- the inventory ----------------------------------------------------------------------

    def poll(self) -> None:
        """Read the inventory now (unless a read is under way)."""
        if not self._polling:
            self._polling = True
            self._read_inventory()

    @work(exit_on_error=False, group="inventory")
    async def _read_inventory(self) -> None:
        try:
            inventory = await self.dashboard.read_inventory()
        except Exception as exc:
            self.post_message(InventoryUnreadable(one_line(exc)))
            return
        finally:
            self._polling = False
        if inventory.any_change or self._first_load:
            self.post_message(InventoryRead(inventory))

    @on(InventoryUnreadable)
    def _inventory_unreadable(self, event: InventoryUnreadable) -> None:
        if event.error != self._poll_error:  # say it once, not every second
            self._poll_error = event.error
            self.notify(f"cannot read the inventory: {event.error}", severity="error",
                        title="database", markup=False, timeout=15)

    @on(InventoryRead)
    def _inventory_read(self, event: InventoryRead) -> None:
        self._poll_error = None
        table = self.table
        if self._first_load:
            table.warn_s = self.detail.warn_s = self.dashboard.warn_seconds()
        table.apply(event.inventory)
        if self._first_load:
            self._first_load = False
            table.loading = False
            self.watch_health()
            self._start_metrics()
        elif self.dashboard.backends_in_use() - self.dashboard.capabilities_known():
            self._load_capabilities()  # a backend newly in use: what can it do?
        self._follow_metrics_if_wanted()
        self.health.set_counts(event.inventory.counts)

    def tick(self) -> None:
        """The clock moved: countdowns, ages, new metric samples, the detail shown."""
        if self._first_load:
            return
        self._ticks += 1
        now = self.dashboard.now()
        self.table.tick(now)
        changed = self.dashboard.metrics.take_changed()
        if changed:
            self.table.refresh_metrics(changed)
        row = self.table.selected_row()
        if row is not None:
            self.detail.show_overview(row, self.dashboard.known_detail(row.id), now)
            self._refresh_tab(row, changed)

    def start_spinner(self) -> None:
        self._spinner.resume()

    def _spin(self) -> None:
        self.table.spin()
        if not self.table.busy:
            self._spinner.pause()

    # -- backends and metrics ---------------------------------------------------------------

    def watch_health(self) -> None:
        self._check_health()

    @work(exit_on_error=False, group="health", exclusive=True)
    async def _check_health(self) -> None:
        """Ask every watched backend; again in 2 s while one is unreachable (so a backend
        coming back shows within seconds), in 10 s otherwise."""
        statuses = []
        try:
            in_use = self.dashboard.backends_in_use()
            await self.dashboard.load_capabilities(in_use)
            self.post_message(CapabilitiesKnown())
            names = await self.dashboard.watched_backends(in_use)
            statuses = await self.dashboard.health(names)
        except Exception as exc:
            self.notify(f"health check failed: {one_line(exc)}", severity="warning",
                        markup=False)
        finally:
            healthy = bool(statuses) and not any(health_state(s) == "down" for s in statuses)
            self.set_timer(self.health_every if healthy else self.health_retry,
                           self.watch_health)
        if statuses:
            self.post_message(HealthChecked(statuses))

    @work(exit_on_error=False, group="capabilities", exclusive=True)
    async def _load_capabilities(self) -> None:
        await self.dashboard.load_capabilities(self.dashboard.backends_in_use())
        self.post_message(CapabilitiesKnown())

    @on(CapabilitiesKnown)
    def _capabilities_known(self) -> None:
        self.refresh_bindings()  # what applies depends on what the backends can do
        self._follow_metrics_if_wanted()

    @on(HealthChecked)
    def _health_checked(self, event: HealthChecked) -> None:
        self.health.set_health(event.statuses)
        self.refresh_bindings()
        self._follow_metrics_if_wanted()

    @work(exit_on_error=False, group="metrics")
    async def _start_metrics(self) -> None:
        """The stored samples, once."""
        await self.dashboard.seed_metrics()
        self.post_message(MetricsArrived(self.dashboard.metrics.take_changed()))

    def _follow_metrics_if_wanted(self) -> None:
        """Follow the live samples (when sampling) while a running sandbox is on a backend
        that reports them; the library's follow looks for running sandboxes every 2 s, a
        read of every row that 10,000 sandboxes that report none would pay for nothing."""
        wanted = (self.dashboard.sample_metrics and not self._metrics_failed
                  and self.dashboard.metrics_to_follow())
        following = self._metrics_follow is not None and not self._metrics_follow.is_finished
        if wanted and not following:
            self._metrics_follow = self._follow_metrics()
        elif following and not wanted:
            self._metrics_follow.cancel()
            self._metrics_follow = None

    @work(exit_on_error=False, group="metrics-follow")
    async def _follow_metrics(self) -> None:
        """Every running sandbox's live samples into the buffer, which the clock's tick
        draws, until cancelled or the app ends."""
        try:
            await self.dashboard.follow_metrics()
        except Exception:
            self._metrics_failed = True  # reported once (the worker's error), not retried
            raise

    @on(MetricsArrived)
    def _metrics_arrived(self, event: MetricsArrived) -> None:
        self.table.refresh_metrics(event.sandbox_ids)

    # -- the filter -------------------------------------------------------------------------

    def action_filter(self) -> None:
        field = self.query_one("#filter", FilterInput)
        field.add_class("visible")
        field.focus()

    @on(FilterInput.FilterChanged)
    def _filter_changed(self, event: FilterInput.FilterChanged) -> None:
        self.table.set_filter(event.text)

    @on(FilterInput.FilterClosed)
    def _filter_closed(self) -> None:
        field = self.query_one("#filter", FilterInput)
        if not field.value:
            field.remove_class("visible")
        self.table.focus()

    # -- the detail area --------------------------------------------------------------------

    @on(SandboxTable.SelectionChanged)
    def _selection_changed(self, event: SandboxTable.SelectionChanged) -> None:
        row = event.row
        new_id = row.id if row else None
        changed = new_id != self._selected
        self._selected = new_id
        detail = self.detail
        detail.select(new_id)
        detail.show_overview(row, self.dashboard.known_detail(new_id) if row else None,
                             self.table.now)
        if row is not None and changed:
            if self.dashboard.known_detail(row.id) is None:
                self._load_detail(row)
            self._load_tab(row)
        self.refresh_bindings()  # what applies depends on the selection's state

    @on(DetailPanel.TabShown)
    def _tab_shown(self) -> None:
        row = self.table.selected_row()
        if row is not None:
            self._load_tab(row)

    def _refresh_tab(self, row: SandboxRow, changed_metrics: set[str]) -> None:
        tab = self.detail.active
        if tab == "events":
            self._load_events(row.id)
        elif tab == "logs" and self.detail.following:
            self._load_logs(row)
        elif tab == "metrics" and row.id in changed_metrics:
            self._show_metrics(row.id)
        elif tab == "checkpoints" and self._ticks % 3 == 0:
            self._load_checkpoints(row)

    def _load_tab(self, row: SandboxRow) -> None:
        tab = self.detail.active
        if tab == "events":
            self._load_events(row.id)
        elif tab == "logs":
            self._load_logs(row)
        elif tab == "metrics":
            self._load_history(row)
        elif tab == "checkpoints":
            self._load_checkpoints(row)

    @work(exit_on_error=False, group="detail", exclusive=True)
    async def _load_detail(self, row: SandboxRow) -> None:
        self.post_message(DetailLoaded(row.id, await self.dashboard.detail(row)))

    @on(DetailLoaded)
    def _detail_loaded(self, event: DetailLoaded) -> None:
        row = self.table.selected_row()
        if row is not None and row.id == event.sandbox_id:
            self.detail.show_overview(row, event.detail, self.table.now)

    @work(exit_on_error=False, group="events", exclusive=True)
    async def _load_events(self, sandbox_id: str) -> None:
        after = self.detail.events_after if self.detail.events_for == sandbox_id else 0
        self.post_message(EventsLoaded(sandbox_id,
                                       await self.dashboard.events(sandbox_id, after)))

    @on(EventsLoaded)
    def _events_loaded(self, event: EventsLoaded) -> None:
        self.detail.add_events(event.sandbox_id, event.events)

    @work(exit_on_error=False, group="logs", exclusive=True)
    async def _load_logs(self, row: SandboxRow) -> None:
        from sandboxer_tui.dashboard.model import available

        caps = self.dashboard.known_capabilities(row.backend)
        if not available("logs", row, caps):
            why = (f"the {row.backend} backend has no logs" if "logs" not in caps
                   else f"no logs: the sandbox is {row.state}")
            self.post_message(LogsLoaded(row.id, "", note=why))
            return
        try:
            text = await self.dashboard.logs_tail(row)
        except Exception as exc:
            self.post_message(LogsLoaded(row.id, "", note=f"logs unavailable: {one_line(exc)}"))
            return
        self.post_message(LogsLoaded(row.id, text))

    @on(LogsLoaded)
    def _logs_loaded(self, event: LogsLoaded) -> None:
        if self.detail.sandbox_id == event.sandbox_id:
            self.detail.set_logs(event.text, note=event.note)

    @work(exit_on_error=False, group="history", exclusive=True)
    async def _load_history(self, row: SandboxRow) -> None:
        self.post_message(HistoryLoaded(row.id, await self.dashboard.metric_history(row)))

    @on(HistoryLoaded)
    def _history_loaded(self, event: HistoryLoaded) -> None:
        self._history[event.sandbox_id] = event.history
        self._show_metrics(event.sandbox_id)

    def _show_metrics(self, sandbox_id: str) -> None:
        if self.detail.sandbox_id == sandbox_id:
            self.detail.set_metrics(self._history.get(sandbox_id, []),
                                    self.dashboard.metrics.series(sandbox_id))

    @work(exit_on_error=False, group="checkpoints", exclusive=True)
    async def _load_checkpoints(self, row: SandboxRow) -> None:
        self.post_message(CheckpointsLoaded(row.id, await self.dashboard.checkpoint_tree(row)))

    @on(CheckpointsLoaded)
    def _checkpoints_loaded(self, event: CheckpointsLoaded) -> None:
        if self.detail.sandbox_id == event.sandbox_id:
            self.detail.set_checkpoints(event.nodes, event.sandbox_id)

    # -- how an action ended ----------------------------------------------------------------

    @on(ActionFinished)
    def _action_finished(self, event: ActionFinished) -> None:
        outcome = event.outcome
        self.notify(outcome.message(), title=event.title,
                    severity=outcome.severity,  # type: ignore[arg-type]
                    markup=False, timeout=12 if outcome.failed else 5)
        self.poll()
        if event.select:
            self._select_when_shown(event.select)

    @work(exit_on_error=False, group="select", exclusive=True)
    async def _select_when_shown(self, sandbox_id: str) -> None:
        for _ in range(50):
            if self.table.is_shown(sandbox_id):
                self.table.move_cursor(row=self.table.get_row_index(sandbox_id))
                return
            await asyncio.sleep(0.1)
