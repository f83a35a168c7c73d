"""Pickers: a profile for a new sandbox (with the profile's summary beside the list), and
a checkpoint to restore."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from sandboxer import BadInput
from sandboxer_tui.dashboard.model import CreateArgs, ProfileChoice, parse_create_args
from sandboxer_tui.formatting import human_bytes

if TYPE_CHECKING:
    from sandboxer import AsyncCheckpoint

READY = "ready"  # the one checkpoint state that can be restored


def summary_table(choice: ProfileChoice) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold dim", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("profile", Text(choice.name, style="bold"))
    if choice.description:
        grid.add_row("", Text(choice.description, style="italic"))
    for key, value in choice.summary:
        grid.add_row(key, Text(value))
    if choice.error:
        grid.add_row("invalid", Text(choice.error, style="red"))
    return grid


class ProfilePicker(ModalScreen[CreateArgs | None]):
    """Choose a profile (Enter creates), optionally a name, a TTL and labels (Tab to reach
    them). The fields are checked as `sbx create` checks them before anything is written."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, choices: Sequence[ProfileChoice], preset_labels: str = "") -> None:
        super().__init__()
        self.choices = list(choices)
        self.preset_labels = preset_labels

    def compose(self) -> ComposeResult:
        with Vertical(classes="modal-box", id="picker-box"):
            yield Label(Text("New sandbox from a profile", style="bold"))
            with Horizontal(id="picker-main"):
                options = [Option(self._prompt(c), id=c.name, disabled=bool(c.error))
                           for c in self.choices]
                yield OptionList(*options, id="profile-list")
                yield Static(id="profile-summary")
            with Horizontal(id="picker-fields"):
                yield Input(placeholder="name (optional)", id="new-name")
                yield Input(placeholder="ttl (profile default)", id="new-ttl")
                yield Input(value=self.preset_labels, placeholder="labels k=v, k=v", id="new-labels")
            yield Static("", id="picker-command")
            yield Static("", id="picker-error", classes="error")
            with Horizontal(classes="modal-buttons"):
                yield Button("Cancel", id="cancel")
                yield Button("Create", id="create", variant="success")

    @staticmethod
    def _prompt(choice: ProfileChoice) -> Text:
        text = Text(choice.name, style="bold")
        text.append(f"  {choice.backend or 'INVALID'}", style="red" if choice.error else "dim")
        return text

    def on_mount(self) -> None:
        options = self.query_one("#profile-list", OptionList)
        first = next((i for i, c in enumerate(self.choices) if not c.error), None)
        if first is not None:
            options.highlighted = first
        options.focus()
        self._show(first)

    def _current(self) -> ProfileChoice | None:
        index = self.query_one("#profile-list", OptionList).highlighted
        return self.choices[index] if index is not None and index < len(self.choices) else None

    def _show(self, index: int | None) -> None:
        summary = self.query_one("#profile-summary", Static)
        if index is None or index >= len(self.choices):
            summary.update(Text("no valid profile on the search path", style="red"))
            return
        summary.update(summary_table(self.choices[index]))
        self._preview()

    def _args(self) -> CreateArgs:
        choice = self._current()
        if choice is None:
            raise BadInput("choose a profile")
        if choice.error:
            raise BadInput(f"profile {choice.name} is invalid: {choice.error}")
        return parse_create_args(choice.name, self.query_one("#new-ttl", Input).value,
                                 self.query_one("#new-name", Input).value,
                                 self.query_one("#new-labels", Input).value)

    def _preview(self) -> None:
        command = self.query_one("#picker-command", Static)
        error = self.query_one("#picker-error", Static)
        try:
            command.update(Text(self._args().command, style="cyan"))
            error.update("")
        except BadInput as exc:
            error.update(Text(str(exc), style="red"))

    @on(OptionList.OptionHighlighted, "#profile-list")
    def highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self._show(event.option_index)

    @on(Input.Changed)
    def changed(self) -> None:
        self._preview()

    @on(OptionList.OptionSelected, "#profile-list")
    @on(Input.Submitted)
    @on(Button.Pressed, "#create")
    def create(self) -> None:
        try:
            args = self._args()
        except BadInput as exc:
            self.query_one("#picker-error", Static).update(Text(str(exc), style="red"))
            return
        self.dismiss(args)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


class CheckpointPicker(ModalScreen[str | None]):
    """Choose a checkpoint to restore as a new sandbox (newest first)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, checkpoints: Sequence[AsyncCheckpoint], sandbox_label: str,
                 preselect: str | None = None) -> None:
        super().__init__()
        self.checkpoints = sorted(checkpoints, key=lambda c: c.created_at, reverse=True)
        self.sandbox_label = sandbox_label
        self.preselect = preselect

    def compose(self) -> ComposeResult:
        with Vertical(classes="modal-box", id="restore-box"):
            yield Label(Text(f"Restore a checkpoint of {self.sandbox_label} as a new sandbox",
                             style="bold"))
            options = []
            for ckpt in self.checkpoints:
                text = Text(ckpt.id, style="bold")
                if ckpt.name:
                    text.append(f" {ckpt.name}")
                text.append(f"  {ckpt.created_at.strftime('%Y-%m-%d %H:%M:%S')}"
                            f"  {human_bytes(ckpt.size_bytes)}  {ckpt.state}", style="dim")
                options.append(Option(text, id=ckpt.id, disabled=ckpt.state != READY))
            yield OptionList(*options, id="checkpoint-list")
            yield Static(Text("Enter restores; sbx restore CHECKPOINT does the same.",
                              style="dim"))

    def on_mount(self) -> None:
        options = self.query_one("#checkpoint-list", OptionList)
        ids = [c.id for c in self.checkpoints]
        if self.preselect in ids:
            options.highlighted = ids.index(self.preselect)
        elif ids:
            options.highlighted = 0
        options.focus()

    @on(OptionList.OptionSelected, "#checkpoint-list")
    def chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
