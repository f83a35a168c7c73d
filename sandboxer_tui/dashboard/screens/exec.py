"""Run commands in a sandbox and read their output, without leaving the dashboard."""

from __future__ import annotations

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Input, Label, RichLog, Static

from sandboxer_tui.dashboard.model import Dashboard, Outcome, SandboxRow
from sandboxer_tui.formatting import one_line

IDLE = "Enter runs · Escape closes"


class ExecScreen(ModalScreen[None]):
    """Each command runs through the library (`Sandbox.exec`, as `sbx exec` does) in a
    worker, which posts `Finished`: the screen stays responsive while it runs. Escape
    closes."""

    class Finished(Message):
        """A command ended (`outcome`), or could not start (`error`, nothing ran)."""

        def __init__(self, outcome: Outcome | None, error: str | None = None) -> None:
            super().__init__()
            self.outcome, self.error = outcome, error

    BINDINGS = [Binding("escape", "close", "Close")]

    def __init__(self, dashboard: Dashboard, row: SandboxRow) -> None:
        super().__init__()
        self.dashboard = dashboard
        self.row = row
        self.running = False

    def compose(self) -> ComposeResult:
        with Vertical(classes="modal-box", id="exec-box"):
            title = Text(f"Run a command in {self.row.id}", style="bold")
            if self.row.name:
                title.append(f" ({self.row.name})")
            yield Label(title)
            yield Input(placeholder="command, e.g. ls -l /  (no shell: use sh -c '...')",
                        id="exec-command")
            yield RichLog(id="exec-output", markup=False, highlight=False, wrap=True,
                          max_lines=5000)
            yield Static(Text(IDLE, style="dim"), id="exec-status")

    def on_mount(self) -> None:
        self.query_one("#exec-command", Input).focus()

    @on(Input.Submitted, "#exec-command")
    def submitted(self, event: Input.Submitted) -> None:
        if event.value.strip() and not self.running:
            self.run_command(event.value)
            event.input.value = ""

    @work(exit_on_error=False, group="exec")
    async def run_command(self, command: str) -> None:
        self.query_one("#exec-output", RichLog).write(Text(f"$ {command}", style="bold cyan"))
        self.running = True
        self.query_one("#exec-status", Static).update(Text("running…", style="yellow"))
        try:
            outcome = await self.dashboard.exec(self.row.id, command)
        except Exception as exc:  # bad input: one line, nothing ran
            self.post_message(self.Finished(None, one_line(exc)))
        else:
            self.post_message(self.Finished(outcome))
        finally:
            self.running = False

    @on(Finished)
    def finished(self, event: Finished) -> None:
        output = self.query_one("#exec-output", RichLog)
        if event.error is not None:
            output.write(Text(event.error, style="red"))
        elif event.outcome.failed:
            output.write(Text(event.outcome.failed[0][1], style="red"))
        else:
            result = event.outcome.result
            for line in result.stdout.decode("utf-8", "replace").splitlines():
                output.write(Text(line))
            for line in result.stderr.decode("utf-8", "replace").splitlines():
                output.write(Text(line, style="red"))
            style = "green" if result.exit_code == 0 else "bold red"
            output.write(Text(f"exit {result.exit_code} in "
                              f"{result.duration.total_seconds():.2f}s"
                              + (" (timed out)" if result.timed_out else ""), style=style))
        self.query_one("#exec-status", Static).update(Text(IDLE, style="dim"))

    def on_worker_state_changed(self, event) -> None:
        self.app.report_worker_error(event)  # type: ignore[attr-defined]

    def action_close(self) -> None:
        self.dismiss(None)
