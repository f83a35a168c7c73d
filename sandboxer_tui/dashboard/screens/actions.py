"""The main screen's actions, one key each (`ActionsMixin`): which apply to the selection now,
and what each does. Every action goes through the dashboard's model (`Dashboard`, over the
library) in a worker, which posts `ActionFinished` when it ends; the screen tells the person
and reads the inventory again. A failed action ends in a notification, never a traceback.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from textual import work
from textual.binding import Binding

from sandboxer import Error
from sandboxer_tui.dashboard.model import (
    MUTATING,
    SORT_COLUMNS,
    Dashboard,
    Outcome,
    SandboxRow,
    available,
    equivalent_command,
)
from sandboxer_tui.dashboard.screens.exec import ExecScreen
from sandboxer_tui.dashboard.screens.messages import ActionFinished
from sandboxer_tui.dashboard.screens.modals import (
    CommandLogScreen,
    ConfirmScreen,
    DurationScreen,
    HelpScreen,
)
from sandboxer_tui.dashboard.screens.pickers import CheckpointPicker, ProfilePicker
from sandboxer_tui.formatting import exact_duration, one_line

if TYPE_CHECKING:
    from sandboxer_tui.dashboard.widgets.detail import DetailPanel
    from sandboxer_tui.dashboard.widgets.table import SandboxTable

# actions that act on the selection (or the marked rows)
ROW_ACTIONS = frozenset({"destroy", "extend", "extend_by", "snapshot", "restore", "pause",
                         "exec", "shell", "touch", "logs", "mark"})
SINGLE_ROW = frozenset({"exec", "shell", "restore", "logs"})


class ActionsMixin:
    """For MainScreen: `dashboard`, `read_only`, `extend_step`, `new_labels`, `table`,
    `detail` and `start_spinner()` come from it."""

    dashboard: Dashboard
    read_only: bool
    extend_step: timedelta
    new_labels: str
    table: SandboxTable
    detail: DetailPanel
    BINDINGS: list[Binding]

    # -- which actions apply ----------------------------------------------------------------

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
        return any(available(action, t, self.dashboard.known_capabilities(t.backend))
                   for t in targets)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.applies(action)

    def _targets(self, action: str) -> list[SandboxRow]:
        return [t for t in self.table.targets()
                if available(action, t, self.dashboard.known_capabilities(t.backend))]

    # -- running an action ------------------------------------------------------------------

    @work(exit_on_error=False, group="actions")
    async def perform(self, title: str, busy: str, ids: list[str],
                      make: Callable[[], Awaitable[Outcome]]) -> Outcome:
        """Show progress in the rows while the action runs, then report how it ended."""
        self.table.set_busy(ids, busy)
        self.start_spinner()
        try:
            outcome = await make()
        finally:
            self.table.set_busy(ids, None)
        self.post_message(ActionFinished(title, outcome))
        return outcome

    # -- the actions ------------------------------------------------------------------------

    @work(exit_on_error=False, group="actions")
    async def action_new(self) -> None:
        if self.read_only:
            return
        choices = await self.dashboard.profile_choices()
        args = await self.app.push_screen_wait(ProfilePicker(choices, self.new_labels))
        if args is None:
            return
        self.notify(f"creating a sandbox from profile {args.profile}…", title="New",
                    markup=False, timeout=3)
        outcome = await self.dashboard.create(args)
        self.post_message(ActionFinished("New", outcome,
                                         select=outcome.result.id if outcome.result else None))

    def action_destroy(self) -> None:
        targets = self._targets("destroy")
        if self.read_only or not targets:
            return
        ids = [t.id for t in targets]
        title = (f"Destroy {targets[0].id}" + (f" ({targets[0].name})" if targets[0].name else "")
                 + "?") if len(ids) == 1 else f"Destroy these {len(ids)} sandboxes?"

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.perform("Destroy", "destroying", ids, lambda: self.dashboard.destroy(ids))
                self.table.clear_marks()

        self.app.push_screen(ConfirmScreen(title, targets, equivalent_command("destroy", ids)),
                             confirmed)

    def _extend(self, by: timedelta) -> None:
        ids = [t.id for t in self._targets("extend")]
        if ids and not self.read_only:
            self.perform("Extend", "extending", ids, lambda: self.dashboard.extend(ids, by))

    def action_extend(self) -> None:
        self._extend(self.extend_step)

    def action_extend_by(self) -> None:
        from sandboxer.core.rules.durations import parse_duration

        ids = [t.id for t in self._targets("extend")]
        if not ids or self.read_only:
            return

        def chosen(text: str | None) -> None:
            if text:
                self._extend(parse_duration(text))

        hint = equivalent_command("extend", ids[:1], "DUR") + (" (each)" if len(ids) > 1 else "")
        self.app.push_screen(DurationScreen(f"Extend {len(ids)} sandbox(es) by",
                                            exact_duration(self.extend_step), hint), chosen)

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
        checkpoints = await self.dashboard.checkpoints(row.id)
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
        outcome = await self.dashboard.restore(chosen)
        self.post_message(ActionFinished("Restore", outcome,
                                         select=outcome.result.id if outcome.result else None))

    def action_exec(self) -> None:
        row = self.table.selected_row()
        if row is not None and not self.read_only and self.applies("exec"):
            self.app.push_screen(ExecScreen(self.dashboard, row))

    @work(exit_on_error=False, group="actions")
    async def action_shell(self) -> None:
        """Hand the terminal to a shell in the sandbox (`sbx shell ID` where the backend has
        terminals, else the backend's own command); back to the dashboard when it exits."""
        from textual.app import SuspendNotSupported

        row = self.table.selected_row()
        if row is None or self.read_only:
            return
        try:
            if "pty" in self.dashboard.known_capabilities(row.backend):
                # `sbx shell ID`: the library's terminal, so through SBX_URL too
                argv = [sys.executable, "-m", "sandboxer_tui", "shell", row.id]
            else:
                argv = await self.dashboard.shell_command(row)
        except Error as exc:
            self.notify(f"no interactive shell here: {one_line(exc)}; x runs a command",
                        title="Shell", severity="warning", markup=False)
            return
        command = shlex.join(["sbx", *argv[3:]] if argv[:3] == [sys.executable, "-m",
                                                             "sandboxer_tui"] else argv)
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

    def action_mark(self) -> None:
        sid = self.table.selected_id
        if sid is None:
            return
        self.table.toggle_mark(sid)
        if self.table.cursor_row < self.table.row_count - 1:
            self.table.move_cursor(row=self.table.cursor_row + 1)
        self.refresh_bindings()

    def action_clear_marks(self) -> None:
        if self.table.marked:
            self.table.clear_marks()
            self.refresh_bindings()

    def action_sort(self) -> None:
        index = SORT_COLUMNS.index(self.table.sort_column)
        self.table.set_sort(SORT_COLUMNS[(index + 1) % len(SORT_COLUMNS)],
                            self.table.sort_reverse)

    def action_sort_reverse(self) -> None:
        self.table.set_sort(self.table.sort_column, not self.table.sort_reverse)

    def action_toggle_all(self) -> None:
        self.dashboard.include_destroyed = not self.dashboard.include_destroyed
        self.table.show_destroyed = self.dashboard.include_destroyed
        self.poll()

    def action_command_log(self) -> None:
        self.app.push_screen(CommandLogScreen(list(self.dashboard.command_log)))

    def action_help(self) -> None:
        rows = []
        for binding in self.BINDINGS:
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
