"""The Sandboxer dashboard: a live Textual view over every sandbox, on every backend.

`sbx` on a terminal (or `sbx tui`) opens it. The app draws; `sandboxer_tui.dashboard.model` reads and
acts through the library (`sandboxer.AsyncSandboxer`), as the CLI does, awaited on Textual's
own loop. See docs/dashboard.md for the keys.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from functools import partial

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.worker import WorkerState

from sandboxer_tui.dashboard.model import Dashboard
from sandboxer_tui.dashboard.screens.main import MainScreen
from sandboxer_tui.formatting import one_line


class SandboxerApp(App):
    """One Dashboard (the model, over the library) per app. `read_only` hides every action
    that changes anything."""

    CSS_PATH = "app.tcss"
    TITLE = "sbx"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = [Binding("ctrl+c", "quit", "Quit", show=False, priority=True)]

    def __init__(self, dashboard: Dashboard | None = None, *, read_only: bool = False,
                 refresh: float = 1.0, extend_step: timedelta = timedelta(minutes=30),
                 new_labels: str = "") -> None:
        super().__init__()
        self.dashboard = dashboard or Dashboard()
        self.read_only = read_only
        self.refresh_s = refresh
        self.extend_step = extend_step
        self.new_labels = new_labels
        self._closed = False

    def get_default_screen(self) -> Screen:
        return MainScreen(self.dashboard, read_only=self.read_only, refresh=self.refresh_s,
                          extend_step=self.extend_step, new_labels=self.new_labels)

    @property
    def main(self) -> MainScreen:
        return next(s for s in self.screen_stack if isinstance(s, MainScreen))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The palette offers every action that applies to the selection now."""
        yield from super().get_system_commands(screen)
        if not isinstance(screen, MainScreen):
            return
        for binding in screen.BINDINGS:
            assert isinstance(binding, Binding)
            action = binding.action.split("(")[0]
            if action in ("quit", "tab", "clear_marks") or not screen.applies(action):
                continue
            key = {"slash": "/", "question_mark": "?"}.get(binding.key, binding.key)
            yield SystemCommand(f"{binding.description} ({key})", f"key: {key}",
                                partial(screen.run_action, binding.action))

    def on_worker_state_changed(self, event) -> None:
        self.report_worker_error(event)

    def report_worker_error(self, event) -> None:
        """One place where a worker's unexpected error becomes a notification (never a
        traceback, never the end of the app). Screens hand their workers' events here
        (worker messages do not bubble)."""
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            message = one_line(event.worker.error)
            self.dashboard.record_error(event.worker.name or "dashboard", event.worker.error)
            self.notify(message, title="error", severity="error", markup=False, timeout=12)

    async def on_unmount(self) -> None:
        await self.close_dashboard()

    async def close_dashboard(self) -> None:
        if not self._closed:
            self._closed = True
            self.workers.cancel_all()  # the metrics stream first: it reads through the client
            await self.dashboard.close()


def run(read_only: bool = False, refresh: float = 1.0,
        extend_step: timedelta = timedelta(minutes=30)) -> int:
    """Open the dashboard on this terminal; the exit status for `sbx tui`."""
    app = SandboxerApp(read_only=read_only, refresh=refresh, extend_step=extend_step)
    app.run()
    return app.return_code or 0
