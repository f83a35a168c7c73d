"""What the main screen's workers report: each worker reads through the library and posts one
of these with its result; the screen's handlers (`@on(...)`) are the one place each result
reaches the widgets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from textual.message import Message

from sandboxer import BackendStatus, Event, MetricSample
from sandboxer_tui.dashboard.model import Inventory, Outcome, SandboxDetail


class InventoryRead(Message):
    """A read of the inventory that found something (or the first one)."""

    def __init__(self, inventory: Inventory) -> None:
        super().__init__()
        self.inventory = inventory


class InventoryUnreadable(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class CapabilitiesKnown(Message):
    """What the backends in use can do is known: which actions apply may have changed."""


class HealthChecked(Message):
    def __init__(self, statuses: Sequence[BackendStatus]) -> None:
        super().__init__()
        self.statuses = list(statuses)


class MetricsArrived(Message):
    """New samples in the buffer for these sandboxes (the stored ones, at start)."""

    def __init__(self, sandbox_ids: set[str]) -> None:
        super().__init__()
        self.sandbox_ids = sandbox_ids


class DetailLoaded(Message):
    def __init__(self, sandbox_id: str, detail: SandboxDetail) -> None:
        super().__init__()
        self.sandbox_id, self.detail = sandbox_id, detail


class EventsLoaded(Message):
    def __init__(self, sandbox_id: str, events: Sequence[Event]) -> None:
        super().__init__()
        self.sandbox_id, self.events = sandbox_id, list(events)


class LogsLoaded(Message):
    """The tail of a sandbox's logs, or (`note`) why there are none to show."""

    def __init__(self, sandbox_id: str, text: str, note: str | None = None) -> None:
        super().__init__()
        self.sandbox_id, self.text, self.note = sandbox_id, text, note


class HistoryLoaded(Message):
    def __init__(self, sandbox_id: str, history: Sequence[MetricSample]) -> None:
        super().__init__()
        self.sandbox_id, self.history = sandbox_id, list(history)


class CheckpointsLoaded(Message):
    def __init__(self, sandbox_id: str, nodes: Sequence[Mapping[str, Any]]) -> None:
        super().__init__()
        self.sandbox_id, self.nodes = sandbox_id, list(nodes)


class ActionFinished(Message):
    """An action ended: tell the person, read the inventory again, and select the sandbox
    it made (`select`), if any."""

    def __init__(self, title: str, outcome: Outcome, select: str | None = None) -> None:
        super().__init__()
        self.title, self.outcome, self.select = title, outcome, select
