"""The top line: the app's name, the inventory counts and each backend's health."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.text import Text
from textual.widgets import Static

from sandboxer import BackendStatus, State
from sandboxer_tui.dashboard.model import health_state

BADGES = {  # state -> (symbol, words, style)
    "connecting": ("◌", "connecting…", "dim"),
    "up": ("●", "up", "green"),
    "down": ("✖", "unreachable", "bold red"),
    "no-credentials": ("▲", "no credentials", "yellow"),
    "broken": ("✖", "cannot load", "bold red"),
}


def health_text(statuses: Sequence[BackendStatus]) -> Text:
    text = Text()
    for status in statuses:
        state = health_state(status)
        symbol, words, style = BADGES.get(state, ("?", state, ""))
        if text:
            text.append("  ")
        text.append(f"{status.name} ", style="bold")
        text.append(f"{symbol} {words}", style=style)
        if status.test_double:
            text.append(" (test double)", style="dim")
    return text


def counts_text(counts: Mapping[str, int], loaded: bool) -> Text:
    if not loaded:
        return Text("loading…", style="dim")
    total = sum(counts.values())
    text = Text(f"{total} sandbox{'es' if total != 1 else ''}")
    for state in (State.RUNNING, State.PAUSED, State.CREATING, State.DESTROYING,
                  State.FAILED, State.LOST):
        if counts.get(state):
            text.append(f" · {counts[state]} {state}", style="dim")
    return text


class HealthBar(Static):
    """Re-rendered when the counts or a backend's health change; the details of each
    backend are in the tooltip."""

    DEFAULT_CSS = """
    HealthBar { height: 1; background: $panel; color: $text; padding: 0 1; }
    """

    def __init__(self, read_only: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.read_only = read_only
        self.statuses: list[BackendStatus] = []
        self.counts: Mapping[str, int] = {}
        self.loaded = False

    def on_mount(self) -> None:
        self._draw()

    def set_health(self, statuses: Sequence[BackendStatus]) -> None:
        self.statuses = list(statuses)
        self.tooltip = "\n".join(f"{s.name}: {s.detail}" for s in statuses) or None
        self._draw()

    def set_counts(self, counts: Mapping[str, int], loaded: bool = True) -> None:
        if dict(counts) != dict(self.counts) or loaded != self.loaded:
            self.counts, self.loaded = dict(counts), loaded
            self._draw()

    def _draw(self) -> None:
        text = Text("sbx", style="bold")
        if self.read_only:
            text.append(" read-only", style="bold black on yellow")
        text.append("  ")
        text.append_text(counts_text(self.counts, self.loaded))
        text.append("   │  ", style="dim")
        text.append_text(health_text(self.statuses) if self.statuses
                         else Text("backends ◌ connecting…", style="dim"))
        self.update(text, layout=False)  # one line, always
