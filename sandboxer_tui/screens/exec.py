"""Run commands in a sandbox and read their output, without leaving the dashboard."""

from __future__ import annotations

import asyncio

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, RichLog, Static

from core.dashboard import Dashboard, SandboxRow


class ExecScreen(ModalScreen[None]):
    """Each command runs through the core (`Manager.exec`, as `sbx exec` does) in a worker:
    the screen stays responsive while it runs. Escape closes."""

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
            yield Static(Text("Enter runs · Escape closes", style="dim"), id="exec-status")

    def on_mount(self) -> None:
        self.query_one("#exec-command", Input).focus()

    @on(Input.Submitted, "#exec-command")
    def submitted(self, event: Input.Submitted) -> None:
        if event.value.strip() and not self.running:
            self.run_command(event.value)
            event.input.value = ""

    @work(exit_on_error=False, group="exec")
    async def run_command(self, command: str) -> None:
        output = self.query_one("#exec-output", RichLog)
        status = self.query_one("#exec-status", Static)
        output.write(Text(f"$ {command}", style="bold cyan"))
        self.running = True
        status.update(Text("running…", style="yellow"))
        try:
            outcome = await asyncio.wrap_future(
                self.dashboard.run(self.dashboard.exec(self.row.id, command)))
        except Exception as exc:  # bad input: one line, nothing ran
            output.write(Text(" ".join(str(exc).split()), style="red"))
            status.update(Text("Enter runs · Escape closes", style="dim"))
            return
        finally:
            self.running = False
        if outcome.failed:
            output.write(Text(outcome.failed[0][1], style="red"))
        else:
            result = outcome.result
            for line in result.stdout.decode("utf-8", "replace").splitlines():
                output.write(Text(line))
            for line in result.stderr.decode("utf-8", "replace").splitlines():
                output.write(Text(line, style="red"))
            style = "green" if result.exit_code == 0 else "bold red"
            output.write(Text(f"exit {result.exit_code} in {result.duration_s:.2f}s"
                              + (" (timed out)" if result.timed_out else ""), style=style))
        status.update(Text("Enter runs · Escape closes", style="dim"))

    def on_worker_state_changed(self, event) -> None:
        self.app.report_worker_error(event)  # type: ignore[attr-defined]

    def action_close(self) -> None:
        self.dismiss(None)
