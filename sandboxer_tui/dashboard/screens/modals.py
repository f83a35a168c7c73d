"""Small modal screens: confirm a destructive action, ask for a duration, the key list, the
command log. Each names what it acts on and shows the equivalent `sbx` command."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Input, Label, Static

from sandboxer_tui.dashboard.model import CommandRecord, SandboxRow


class ConfirmScreen(ModalScreen[bool]):
    """Names the targets and the equivalent command; Cancel has the focus, so Enter alone
    never destroys anything. `y` confirms, `n` or Escape cancels."""

    BINDINGS = [
        Binding("escape,n", "cancel", "Cancel"),
        Binding("y", "confirm", "Yes, destroy"),
    ]

    def __init__(self, title: str, targets: Sequence[SandboxRow], command: str,
                 confirm_label: str = "Destroy") -> None:
        super().__init__()
        self.title_text = title
        self.targets = list(targets)
        self.command = command
        self.confirm_label = confirm_label

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box", classes="modal-box"):
            yield Label(Text(self.title_text, style="bold"), id="confirm-title")
            listing = Text()
            for row in self.targets[:12]:
                listing.append(f"  {row.id}", style="bold")
                listing.append(f"  {row.name or '-'}  {row.profile}  {row.backend}  {row.state}\n")
            if len(self.targets) > 12:
                listing.append(f"  ... and {len(self.targets) - 12} more\n", style="dim")
            yield Static(listing, id="confirm-targets")
            yield Label(Text("Equivalent command:", style="dim"))
            yield Static(Text(self.command, style="bold cyan"), id="confirm-command")
            with Horizontal(classes="modal-buttons"):
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button(f"{self.confirm_label} (y)", id="confirm", variant="error")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(False)

    @on(Button.Pressed, "#confirm")
    def action_confirm(self) -> None:
        self.dismiss(True)


class DurationScreen(ModalScreen[str | None]):
    """Asks how much time to add (`30m`, `1h30m`); the core checks it."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, default: str, command_hint: str) -> None:
        super().__init__()
        self.title_text, self.default, self.command_hint = title, default, command_hint

    def compose(self) -> ComposeResult:
        with Vertical(classes="modal-box", id="duration-box"):
            yield Label(Text(self.title_text, style="bold"))
            yield Input(value=self.default, placeholder="e.g. 30m, 2h, 1h30m", id="duration")
            yield Static(Text(self.command_hint, style="dim"), id="duration-hint")
            yield Static("", id="duration-error", classes="error")

    @on(Input.Submitted, "#duration")
    def submitted(self, event: Input.Submitted) -> None:
        from sandboxer.core.rules.durations import parse_duration
        from sandboxer.core.rules.errors import BadInput

        try:
            parse_duration(event.value, "duration")
        except BadInput as exc:
            self.query_one("#duration-error", Static).update(Text(str(exc), style="red"))
            return
        self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)


class HelpScreen(ModalScreen[None]):
    """Every key of the main view, whether it applies to the selection now, and the rest."""

    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, rows: Sequence[tuple[str, str, bool]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        with Vertical(classes="modal-box", id="help-box"):
            yield Label(Text("Keys", style="bold"))
            yield DataTable(id="help-table", cursor_type="none", show_cursor=False)
            yield Static(Text("ctrl+p opens the command palette (every action, searchable). "
                              "Tabs: 1 overview, 2 logs, 3 events, 4 metrics, 5 checkpoints. "
                              "Click a column header to sort by it.", style="dim"))

    def on_mount(self) -> None:
        table = self.query_one("#help-table", DataTable)
        table.add_columns("KEY", "ACTION", "NOW")
        for key, description, applies in self.rows:
            table.add_row(Text(key, style="bold"), Text(description),
                          Text("yes", style="green") if applies else Text("-", style="dim"))

    def action_close(self) -> None:
        self.dismiss(None)


class CommandLogScreen(ModalScreen[None]):
    """What the dashboard ran this session, as `sbx` commands, and how each ended."""

    BINDINGS = [Binding("escape,q,c", "close", "Close")]

    def __init__(self, records: Sequence[CommandRecord]) -> None:
        super().__init__()
        self.records = records

    def compose(self) -> ComposeResult:
        with Vertical(classes="modal-box", id="log-box"):
            yield Label(Text("Commands run from this dashboard", style="bold"))
            yield DataTable(id="command-table", cursor_type="row")

    def on_mount(self) -> None:
        table = self.query_one("#command-table", DataTable)
        table.add_columns("TIME", "COMMAND", "RESULT")
        for record in self.records:
            table.add_row(Text(record.time.strftime("%H:%M:%S")), Text(record.command),
                          Text(record.outcome.splitlines()[0] if record.outcome else "",
                               style="green" if record.ok else "red"))
        if not self.records:
            table.add_row(Text("-"), Text("nothing yet", style="dim"), Text(""))

    def action_close(self) -> None:
        self.dismiss(None)
