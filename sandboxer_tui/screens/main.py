"""The main view: the health line, the sandbox table, the detail tabs, the footer; and every
action, one key each.

Everything that reads the database or calls a backend goes through `core.dashboard`
(the same Manager as the CLI) on the core's background loop, awaited from Textual workers:
the UI never waits on I/O. A failed action ends in a notification, never a traceback.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, TabbedContent

from core.dashboard import (
    MUTATING,
    SORT_COLUMNS,
    Dashboard,
    Inventory,
    Outcome,
    SandboxRow,
    available,
    equivalent_command,
    one_line,
    shell_argv,
)
from sandboxer_tui.screens.exec import ExecScreen
from sandboxer_tui.screens.modals import (
    CommandLogScreen,
    ConfirmScreen,
    DurationScreen,
    HelpScreen,
)
from sandboxer_tui.screens.pickers import CheckpointPicker, ProfilePicker
from sandboxer_tui.widgets.detail import TABS, DetailPanel
from sandboxer_tui.widgets.header import HealthBar
from sandboxer_tui.widgets.table import HEADER_SORT, SandboxTable

# actions that act on the selection (or the marked rows)
ROW_ACTIONS = frozenset({"destroy", "extend", "extend_by", "snapshot", "restore", "pause",
                         "exec", "shell", "touch", "logs", "mark"})
SINGLE_ROW = frozenset({"exec", "shell", "restore", "logs"})


class FilterInput(Input):
    BINDINGS = [Binding("escape", "clear", "Clear filter", show=False)]

    def action_clear(self) -> None:
        self.value = ""
        self.screen.hide_filter()  # type: ignore[attr-defined]


class MainScreen(Screen):
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
        self._history: dict[str, list[dict[str, Any]]] = {}
        self._shell_cache: dict[tuple[str, str], bool] = {}
        self.health_every, self.health_retry = 10.0, 2.0
        self._last_title: Text | None = None

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
        self.table.loading = True
        self._title()
        self.table.focus()
        self.set_interval(self.refresh_s, self.poll)
        self.set_interval(1.0, self.tick)
        self._spinner = self.set_interval(0.12, self._spin, pause=True)
        self.poll()  # the health check and metrics start after the first inventory

    # -- core plumbing ----------------------------------------------------------------------

    async def core(self, coro: Awaitable[Any]) -> Any:
        """Await a coroutine on the core's loop (the UI's loop keeps running)."""
        return await asyncio.wrap_future(self.dashboard.run(coro))

    async def core_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call a blocking core function on the core's thread pool."""
        return await asyncio.wrap_future(self.dashboard.call(fn, *args))

    def on_worker_state_changed(self, event) -> None:
        self.app.report_worker_error(event)  # type: ignore[attr-defined]

    # -- live: inventory, clock, metrics, health --------------------------------------------

    def poll(self) -> None:
        if not self._polling:
            self._polling = True
            self._poll_inventory()

    @work(exit_on_error=False, group="poll")
    async def _poll_inventory(self) -> None:
        try:
            inventory = await self.core_call(self.dashboard.read_inventory)
        except Exception as exc:
            message = one_line(exc)
            if message != self._poll_error:  # say it once, not every second
                self._poll_error = message
                self.notify(f"cannot read the inventory: {message}", severity="error",
                            title="database", markup=False, timeout=15)
            return
        finally:
            self._polling = False
        self._poll_error = None
        self.apply(inventory)

    def apply(self, inventory: Inventory) -> None:
        table = self.table
        before = table.selected_row()
        table.apply(inventory)
        if self._first_load:
            self._first_load = False
            table.loading = False
            table.warn_s = self.detail.warn_s = self.dashboard.warn_seconds()
            self.watch_health()
            self._start_metrics()
        self.health.set_counts(table.counts())
        self._title()
        after = table.selected_row()
        if after is None or before is None or after.id != before.id or after is not before:
            self._selection_changed(after)
            self.refresh_bindings()  # what applies depends on the selection's state

    def _spin(self) -> None:
        self.table.spin()
        if not self.table.busy:
            self._spinner.pause()

    def tick(self) -> None:
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
            self.detail.show_overview(row, now)
            self._refresh_tab(row, changed)

    @work(exit_on_error=False, group="metrics")
    async def _start_metrics(self) -> None:
        await self.core_call(self.dashboard.seed_metrics)
        self.table.refresh_metrics(self.dashboard.metrics.take_changed())
        self.dashboard.start_sampler()

    def watch_health(self) -> None:
        self._check_health()

    @work(exit_on_error=False, group="health", exclusive=True)
    async def _check_health(self) -> None:
        """Ask every watched backend; again in 2 s while one is unreachable (so a backend
        coming back shows within seconds), in 10 s otherwise."""
        statuses = []
        try:
            in_use = {r.backend for r in self.table.sandboxes.values()}
            await self.core_call(self.dashboard.load_capabilities, in_use)
            self.refresh_bindings()
            names = await self.core_call(self.dashboard.watched_backends, in_use)
            statuses = await self.core(self.dashboard.health(names))
        except Exception as exc:
            self.notify(f"health check failed: {one_line(exc)}", severity="warning",
                        markup=False)
        finally:
            healthy = bool(statuses) and not any(s.state in ("down", "connecting")
                                                 for s in statuses)
            self.set_timer(self.health_every if healthy else self.health_retry,
                           self.watch_health)
        if statuses:
            self.health.set_health(statuses)

    def _title(self) -> None:
        table = self.table
        title = Text("sandboxes ", style="bold")
        shown, total = table.row_count, len(table.sandboxes)
        if table.filter_text:
            title.append(f"  {shown} of {total} match ")
            title.append(repr(table.filter_text), style="italic")
        title.append(f"  sorted by {table.sort_column}{' ↓' if table.sort_reverse else ''}",
                     style="dim")
        if table.marked:
            title.append(f"  {len(table.marked)} marked", style="bold yellow")
        if self.dashboard.include_all:
            title.append("  (destroyed shown)", style="dim")
        if title != self._last_title:
            self._last_title = title
            table.border_title = title

    # -- the detail area --------------------------------------------------------------------

    @on(DataTable.RowHighlighted, "#sandboxes")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._selection_changed(self.table.sandboxes.get(event.row_key.value))
        self.refresh_bindings()

    def _selection_changed(self, row: SandboxRow | None) -> None:
        detail = self.detail
        new_id = row.id if row else None
        changed = new_id != self._selected
        self._selected = new_id
        detail.select(new_id)
        detail.show_overview(row, self.table.now)
        if row is not None and changed:
            self._load_tab(row)

    @on(TabbedContent.TabActivated, "#detail-tabs")
    def _tab_activated(self) -> None:
        row = self.table.selected_row()
        if row is not None:
            self._load_tab(row)

    @on(Input.Changed, "#log-filter")
    def _log_filter_changed(self) -> None:
        self.detail.render_logs()

    def _refresh_tab(self, row: SandboxRow, changed_metrics: set[str]) -> None:
        tab = self.detail.active
        if tab == "events":
            self._load_events(row.id)
        elif tab == "logs" and self.detail.following:
            self._load_logs(row)
        elif tab == "metrics" and row.id in changed_metrics:
            self._show_metrics(row.id)
        elif tab == "checkpoints" and self._ticks % 3 == 0:
            self._load_checkpoints(row.id)

    def _load_tab(self, row: SandboxRow) -> None:
        tab = self.detail.active
        if tab == "events":
            self._load_events(row.id)
        elif tab == "logs":
            self._load_logs(row)
        elif tab == "metrics":
            self._load_history(row.id)
        elif tab == "checkpoints":
            self._load_checkpoints(row.id)

    @work(exit_on_error=False, group="events", exclusive=True)
    async def _load_events(self, sandbox_id: str) -> None:
        after = self.detail.events_after if self.detail.events_for == sandbox_id else 0
        events = await self.core_call(self.dashboard.events, sandbox_id, after)
        self.detail.add_events(sandbox_id, events)

    @work(exit_on_error=False, group="logs", exclusive=True)
    async def _load_logs(self, row: SandboxRow) -> None:
        caps = self.dashboard.known_capabilities(row.backend)
        if not available("logs", row, caps):
            why = (f"the {row.backend} backend has no logs" if "logs" not in caps
                   else f"no logs: the sandbox is {row.state}")
            self.detail.set_logs("", note=why)
            return
        try:
            text = await self.core(self.dashboard.logs_tail(row.id))
        except Exception as exc:
            self.detail.set_logs("", note=f"logs unavailable: {one_line(exc)}")
            return
        if self.detail.sandbox_id == row.id:
            self.detail.set_logs(text)

    @work(exit_on_error=False, group="history", exclusive=True)
    async def _load_history(self, sandbox_id: str) -> None:
        self._history[sandbox_id] = await self.core_call(self.dashboard.metric_history,
                                                         sandbox_id)
        self._show_metrics(sandbox_id)

    def _show_metrics(self, sandbox_id: str) -> None:
        if self.detail.sandbox_id == sandbox_id:
            self.detail.set_metrics(self._history.get(sandbox_id, []),
                                    self.dashboard.metrics.series(sandbox_id))

    @work(exit_on_error=False, group="checkpoints", exclusive=True)
    async def _load_checkpoints(self, sandbox_id: str) -> None:
        nodes = await self.core_call(self.dashboard.checkpoint_tree, sandbox_id)
        if self.detail.sandbox_id == sandbox_id:
            self.detail.set_checkpoints(nodes, sandbox_id)

    # -- which actions apply ----------------------------------------------------------------

    def _has_shell(self, row: SandboxRow) -> bool:
        key = (row.id, row.state)
        if key not in self._shell_cache:
            self._shell_cache[key] = shell_argv(row.raw) is not None
        return self._shell_cache[key]

    def applies(self, action: str) -> bool:
        if action in MUTATING and self.read_only:
            return False
        if action not in ROW_ACTIONS:
            return True
        table = self.table
        targets = ([table.selected_row()] if action in SINGLE_ROW else table.targets())
        targets = [t for t in targets if t is not None]
        if action == "mark":
            return bool(targets)
        return any(available(action, t, self.dashboard.known_capabilities(t.backend),
                             self._has_shell(t) if action == "shell" else False)
                   for t in targets)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.applies(action)

    def _targets(self, action: str) -> list[SandboxRow]:
        return [t for t in self.table.targets()
                if available(action, t, self.dashboard.known_capabilities(t.backend))]

    # -- running an action ------------------------------------------------------------------

    def tell(self, outcome: Outcome, title: str) -> None:
        self.notify(outcome.message(), title=title, severity=outcome.severity,  # type: ignore[arg-type]
                    markup=False, timeout=12 if outcome.failed else 5)

    @work(exit_on_error=False, group="actions")
    async def perform(self, title: str, busy: str, ids: list[str],
                         make: Callable[[], Awaitable[Outcome]]) -> Outcome:
        """Show progress in the rows, run the action on the core, tell how it ended."""
        self.table.set_busy(ids, busy)
        self._spinner.resume()
        try:
            outcome = await self.core(make())
        finally:
            self.table.set_busy(ids, None)
        self.tell(outcome, title)
        self.poll()
        return outcome

    # -- the actions ------------------------------------------------------------------------

    @work(exit_on_error=False, group="actions")
    async def action_new(self) -> None:
        if self.read_only:
            return
        from core.dashboard import profile_choices

        choices = await self.core_call(profile_choices)
        args = await self.app.push_screen_wait(ProfilePicker(choices, self.new_labels))
        if args is None:
            return
        self.notify(f"creating a sandbox from profile {args.profile}…", title="New",
                    markup=False, timeout=3)
        outcome = await self.core(self.dashboard.create(args))
        self.tell(outcome, "New")
        self.poll()
        if outcome.result:
            self._select_when_shown(outcome.result["id"])

    @work(exit_on_error=False, group="select", exclusive=True)
    async def _select_when_shown(self, sandbox_id: str) -> None:
        for _ in range(50):
            if self.table.is_shown(sandbox_id):
                self.table.move_cursor(row=self.table.get_row_index(sandbox_id))
                return
            await asyncio.sleep(0.1)

    def action_destroy(self) -> None:
        targets = self._targets("destroy")
        if self.read_only or not targets:
            return
        ids = [t.id for t in targets]
        title = (f"Destroy {targets[0].id}" + (f" ({targets[0].name})" if targets[0].name else "")
                 + "?") if len(ids) == 1 else f"Destroy these {len(ids)} sandboxes?"

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.perform("Destroy", "destroying", ids,
                                lambda: self.dashboard.destroy(ids))
                self.table.clear_marks()
                self._title()

        self.app.push_screen(ConfirmScreen(title, targets, equivalent_command("destroy", ids)),
                             confirmed)

    def _extend(self, by: timedelta) -> None:
        ids = [t.id for t in self._targets("extend")]
        if ids and not self.read_only:
            self.perform("Extend", "extending", ids, lambda: self.dashboard.extend(ids, by))

    def action_extend(self) -> None:
        self._extend(self.extend_step)

    def action_extend_by(self) -> None:
        from core.durations import format_duration, parse_duration

        ids = [t.id for t in self._targets("extend")]
        if not ids or self.read_only:
            return

        def chosen(text: str | None) -> None:
            if text:
                self._extend(parse_duration(text))

        hint = equivalent_command("extend", ids[:1], "DUR") + (" (each)" if len(ids) > 1 else "")
        self.app.push_screen(DurationScreen(f"Extend {len(ids)} sandbox(es) by",
                                            format_duration(self.extend_step), hint), chosen)

    def action_touch(self) -> None:
        ids = [t.id for t in self._targets("touch")]
        if ids and not self.read_only:
            self.perform("Touch", "touching", ids, lambda: self.dashboard.touch(ids))

    def action_pause(self) -> None:
        ids = [t.id for t in self._targets("pause")]
        if ids and not self.read_only:
            self.perform("Pause/resume", "pausing", ids,
                            lambda: self.dashboard.pause_or_resume(ids))

    def action_snapshot(self) -> None:
        ids = [t.id for t in self._targets("snapshot")]
        if ids and not self.read_only:
            self.perform("Snapshot", "snapshot", ids, lambda: self.dashboard.snapshot(ids))

    @work(exit_on_error=False, group="actions")
    async def action_restore(self) -> None:
        row = self.table.selected_row()
        if row is None or self.read_only:
            return
        checkpoints = await self.core_call(self.dashboard.checkpoints, row.id)
        if not checkpoints:
            self.notify(f"{row.id} has no checkpoint yet: s takes one", title="Restore",
                        severity="warning", markup=False)
            return
        label = row.id + (f" ({row.name})" if row.name else "")
        preselect = self.detail.highlighted_checkpoint if self.detail.active == "checkpoints" \
            else None
        chosen = await self.app.push_screen_wait(CheckpointPicker(checkpoints, label, preselect))
        if not chosen:
            return
        outcome = await self.core(self.dashboard.restore(chosen))
        self.tell(outcome, "Restore")
        self.poll()
        if outcome.result:
            self._select_when_shown(outcome.result["id"])

    def action_exec(self) -> None:
        row = self.table.selected_row()
        if row is not None and not self.read_only and self.applies("exec"):
            self.app.push_screen(ExecScreen(self.dashboard, row))

    def action_shell(self) -> None:
        from textual.app import SuspendNotSupported

        row = self.table.selected_row()
        if row is None or self.read_only:
            return
        argv = shell_argv(row.raw)
        if argv is None:
            self.notify(f"no interactive shell for the {row.backend} backend here; "
                        "x runs a command", title="Shell", severity="warning", markup=False)
            return
        command = " ".join(argv)
        try:
            with self.app.suspend():
                print(f"sbx: a shell in {row.id}; exit it to return to the dashboard",
                      flush=True)
                code = subprocess.run(argv).returncode
        except SuspendNotSupported:
            self.notify("this terminal cannot hand over to a shell; x runs a command",
                        title="Shell", severity="warning", markup=False)
            return
        except OSError as exc:
            self.dashboard.record_error(command, exc)
            self.notify(one_line(exc), title="Shell", severity="error", markup=False)
            return
        self.dashboard.record(Outcome("shell in", [row.id], command=command,
                                      notes=[f"exit {code}"] if code else []))
        self.perform("Shell", "touching", [row.id], lambda: self.dashboard.touch([row.id]))

    def action_logs(self) -> None:
        self.detail.activate("logs")

    def action_tab(self, tab: str) -> None:
        self.detail.activate(tab)

    def action_filter(self) -> None:
        field = self.query_one("#filter", FilterInput)
        field.add_class("visible")
        field.focus()

    def hide_filter(self) -> None:
        field = self.query_one("#filter", FilterInput)
        if not field.value:
            field.remove_class("visible")
        self.table.focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.table.set_filter(event.value.strip())
        self._title()
        self._selection_changed(self.table.selected_row())

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self) -> None:
        self.hide_filter()

    def action_mark(self) -> None:
        sid = self.table.selected_id
        if sid is None:
            return
        self.table.toggle_mark(sid)
        if self.table.cursor_row < self.table.row_count - 1:
            self.table.move_cursor(row=self.table.cursor_row + 1)
        self._title()
        self.refresh_bindings()

    def action_clear_marks(self) -> None:
        if self.table.marked:
            self.table.clear_marks()
            self._title()
            self.refresh_bindings()

    def action_sort(self) -> None:
        index = SORT_COLUMNS.index(self.table.sort_column)
        self.table.set_sort(SORT_COLUMNS[(index + 1) % len(SORT_COLUMNS)],
                            self.table.sort_reverse)
        self._title()

    def action_sort_reverse(self) -> None:
        self.table.set_sort(self.table.sort_column, not self.table.sort_reverse)
        self._title()

    @on(DataTable.HeaderSelected, "#sandboxes")
    def _header_selected(self, event: DataTable.HeaderSelected) -> None:
        column = HEADER_SORT.get(event.column_key.value, "created")
        reverse = not self.table.sort_reverse if column == self.table.sort_column else False
        self.table.set_sort(column, reverse)
        self._title()

    def action_toggle_all(self) -> None:
        self.dashboard.include_all = not self.dashboard.include_all
        self._title()
        self.poll()

    def action_command_log(self) -> None:
        self.app.push_screen(CommandLogScreen(list(self.dashboard.command_log)))

    def action_help(self) -> None:
        rows = []
        for binding in self.BINDINGS:
            assert isinstance(binding, Binding)
            action = binding.action.split("(")[0]
            key = {"slash": "/", "space": "space", "question_mark": "?",
                   "escape": "escape"}.get(binding.key, binding.key)
            if action in MUTATING and self.read_only:
                continue
            rows.append((key, binding.description, self.applies(action)))
        rows.append(("ctrl+p", "Command palette", True))
        self.app.push_screen(HelpScreen(rows))

    async def action_quit(self) -> None:
        self.app.exit()
