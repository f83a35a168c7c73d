"""The filter line above the table: it tells its screen what to filter by (`FilterChanged`)
and when the person is done with it (`FilterClosed`: Enter keeps the filter, Escape clears
it)."""

from __future__ import annotations

from textual.binding import Binding
from textual.message import Message
from textual.widgets import Input


class FilterInput(Input):
    """Its messages are not named Changed or Submitted: Input posts those of its own."""

    BINDINGS = [Binding("escape", "clear", "Clear filter", show=False)]

    class FilterChanged(Message):
        """The filter is now `text` (stripped)."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    class FilterClosed(Message):
        """Back to the table; `kept` is False when Escape cleared the filter."""

        def __init__(self, kept: bool) -> None:
            super().__init__()
            self.kept = kept

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.FilterChanged(event.value.strip()))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.post_message(self.FilterClosed(kept=True))

    def action_clear(self) -> None:
        self.value = ""
        self.post_message(self.FilterClosed(kept=False))
