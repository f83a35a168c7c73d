"""The selected sandbox in tabs: overview, logs, events, metrics, checkpoints.

The screen loads each tab's data through the library (in workers) and hands it here; this
module only draws. It tells the screen which tab is shown (`TabShown`) and filters its own
logs. User data is always `rich.text.Text`, never markup.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import (
    Checkbox,
    DataTable,
    Input,
    RichLog,
    Sparkline,
    Static,
    TabbedContent,
    TabPane,
    Tree,
)

from sandboxer import Event, MetricSample
from sandboxer_tui.dashboard.model import SandboxDetail, SandboxRow, ttl_level
from sandboxer_tui.dashboard.widgets.table import STATE_STYLES, TTL_STYLES
from sandboxer_tui.formatting import compact_duration, human_bytes

TABS = ("overview", "logs", "events", "metrics", "checkpoints")
HIGHLIGHT = "bold black on yellow"


def _time(moment: datetime | None, now: datetime | None, future: bool = False) -> Text:
    if moment is None:
        return Text("-", style="dim")
    text = Text(moment.strftime("%Y-%m-%d %H:%M:%S"))
    if now is not None:
        delta = (moment - now).total_seconds()
        if future:
            text.append(f"  in {compact_duration(delta)}" if delta > 0 else "  passed",
                        style="dim")
        else:
            text.append(f"  {compact_duration(-delta)} ago", style="dim")
    return text


def overview_table(row: SandboxRow, detail: SandboxDetail | None, now: datetime | None,
                   warn_s: float) -> Table:
    box = row.record
    profile = detail.profile if detail is not None else {}
    resources = profile.get("resources") or {}
    network = profile.get("network") or {}
    left = row.ttl_left(now) if now else None
    level = ttl_level(left, warn_s)
    ttl = Text("-", style="dim") if level is None else Text(
        "expired" if level == "expired" else compact_duration(left), style=TTL_STYLES[level])
    labels = Text(", ".join(f"{k}={v}" for k, v in row.labels.items()) or "-")
    idle = box.idle_timeout
    pairs_left = [
        ("id", Text(row.id)),
        ("name", Text(row.name or "-")),
        ("state", Text(row.state, style=STATE_STYLES.get(row.state, ""))),
        ("profile", Text(row.profile)),
        ("backend", Text(row.backend)),
        ("backend ref", Text((box.backend_ref or "-")[:40])),
        ("owner", Text(row.owner)),
        ("host", Text(box.host or "-")),  # the machine that made it (fleets)
        ("task", Text(row.task or "-")),
        ("labels", labels),
    ]
    pairs_right = [
        ("created", _time(box.created_at, now)),
        ("ttl left", ttl),
        ("deadline", _time(box.deadline, now, future=True)),
        ("hard deadline", _time(box.hard_deadline, now, future=True)),
        ("idle limit", Text(compact_duration(idle) if idle else "-")),
        ("last activity", _time(box.last_activity_at, now)),
        ("limits", Text(f"cpu {resources.get('cpu', '-')}  memory "
                        f"{human_bytes(resources.get('memory')) if resources.get('memory') else '-'}"
                        f"  pids {resources.get('pids') or '-'}")),
        ("network", Text(network.get("mode", "-") + (
            f" (allow {', '.join(network['allow'])})" if network.get("allow") else ""))),
    ]
    if detail is not None and detail.origin:
        pairs_right.append(("restored from", Text(detail.origin)))
    if box.ended_at:
        pairs_right.append(("ended", _time(box.ended_at, now)))
    if row.error:
        pairs_left.append(("error", Text(row.error, style="red")))
    grid = Table.grid(padding=(0, 2), expand=True)
    grid.add_column(style="bold dim", no_wrap=True)
    grid.add_column(ratio=1, overflow="fold")
    grid.add_column(style="bold dim", no_wrap=True)
    grid.add_column(ratio=1, overflow="fold")
    for index in range(max(len(pairs_left), len(pairs_right))):
        a = pairs_left[index] if index < len(pairs_left) else ("", Text(""))
        b = pairs_right[index] if index < len(pairs_right) else ("", Text(""))
        grid.add_row(a[0], a[1], b[0], b[1])
    return grid


def log_lines(lines: Sequence[str], needle: str) -> list[Text]:
    """The lines that contain `needle` (all without one), with each match highlighted."""
    if not needle:
        return [Text(line) for line in lines]
    shown = []
    lowered = needle.lower()
    for line in lines:
        if lowered in line.lower():
            text = Text(line)
            text.highlight_words([needle], style=HIGHLIGHT, case_sensitive=False)
            shown.append(text)
    return shown


def event_details(payload: Mapping[str, Any]) -> Text:
    return Text(" ".join(f"{k}={json.dumps(v)}" for k, v in payload.items()))


def metric_summary(title: str, values: Sequence[float], fmt, extra: str = "") -> Text:
    text = Text(f"{title} ", style="bold")
    if not values:
        text.append("no sample yet", style="dim")
        return text
    text.append(f"now {fmt(values[-1])}")
    text.append(f" · min {fmt(min(values))} · max {fmt(max(values))}", style="dim")
    if extra:
        text.append(f" · {extra}", style="dim")
    return text


class DetailPanel(Vertical):
    class TabShown(Message):
        """A tab came to the front: its data is to be loaded."""

        def __init__(self, tab: str) -> None:
            super().__init__()
            self.tab = tab

    DEFAULT_CSS = """
    DetailPanel { height: 1fr; }
    DetailPanel #log-bar { height: 3; }
    DetailPanel #log-filter { width: 1fr; }
    DetailPanel #log-follow { width: auto; }
    DetailPanel Sparkline { height: 3; margin: 0 0 1 0; }
    DetailPanel .metric-label { height: 1; }
    """

    def __init__(self, warn_s: float = 300.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.warn_s = warn_s
        self.sandbox_id: str | None = None
        self.log_source: list[str] = []
        self.events_after = 0
        self.events_for: str | None = None
        self._overview_shape: tuple[str, int] | None = None

    def compose(self) -> ComposeResult:
        with TabbedContent(id="detail-tabs", initial="overview"):
            with TabPane("Overview", id="overview"), VerticalScroll():
                yield Static(Text("no sandbox selected", style="dim"), id="overview-body")
            with TabPane("Logs", id="logs"):
                with Horizontal(id="log-bar"):
                    yield Input(placeholder="filter the logs (matches highlighted)",
                                id="log-filter")
                    yield Checkbox("follow", True, id="log-follow")
                yield RichLog(id="log-view", max_lines=5000, markup=False, highlight=False,
                              wrap=False, auto_scroll=True)
            with TabPane("Events", id="events"):
                yield DataTable(id="events-table", cursor_type="row", zebra_stripes=True)
            with TabPane("Metrics", id="metrics"), VerticalScroll():
                yield Static(id="cpu-label", classes="metric-label")
                yield Sparkline([], id="cpu-spark")
                yield Static(id="mem-label", classes="metric-label")
                yield Sparkline([], id="mem-spark")
                yield Static(id="other-label", classes="metric-label")
            with TabPane("Checkpoints", id="checkpoints"):
                yield Tree("checkpoints", id="ckpt-tree")

    def on_mount(self) -> None:
        events = self.query_one("#events-table", DataTable)
        for key, label in (("time", "TIME"), ("type", "TYPE"), ("actor", "ACTOR"),
                           ("reason", "REASON"), ("details", "DETAILS")):
            events.add_column(label, key=key)
        self.query_one("#ckpt-tree", Tree).show_root = False

    @on(TabbedContent.TabActivated, "#detail-tabs")
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        event.stop()
        self.post_message(self.TabShown(self.active))

    @on(Input.Changed, "#log-filter")
    def _log_filter_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.render_logs()

    @property
    def active(self) -> str:
        return self.query_one("#detail-tabs", TabbedContent).active

    def activate(self, tab: str) -> None:
        self.query_one("#detail-tabs", TabbedContent).active = tab

    # -- overview ---------------------------------------------------------------------------

    def show_overview(self, row: SandboxRow | None, detail: SandboxDetail | None,
                      now: datetime | None) -> None:
        body = self.query_one("#overview-body", Static)
        if row is None:
            body.update(Text("no sandbox selected", style="dim"))
            self._overview_shape = None
            return
        grid = overview_table(row, detail, now, self.warn_s)
        shape = (row.id, grid.row_count)  # the same shape: only the values move (no layout)
        body.update(grid, layout=shape != self._overview_shape)
        self._overview_shape = shape

    def select(self, sandbox_id: str | None) -> None:
        """Another sandbox: forget what was shown for the previous one."""
        if sandbox_id == self.sandbox_id:
            return
        self.sandbox_id = sandbox_id
        self.log_source = []
        self.query_one("#log-view", RichLog).clear()
        self.query_one("#events-table", DataTable).clear()
        self.events_after, self.events_for = 0, sandbox_id
        self.set_metrics([], [])
        self.set_checkpoints([], sandbox_id)

    # -- logs -------------------------------------------------------------------------------

    @property
    def log_filter(self) -> str:
        return self.query_one("#log-filter", Input).value

    @property
    def following(self) -> bool:
        return self.query_one("#log-follow", Checkbox).value

    def set_logs(self, text: str, note: str | None = None) -> None:
        lines = text.splitlines()
        if note:
            lines = [note]
        if lines == self.log_source:
            return
        view = self.query_one("#log-view", RichLog)
        old = self.log_source
        self.log_source = lines
        if old and lines[: len(old)] == old:  # only new lines: append
            for line in log_lines(lines[len(old):], self.log_filter):
                view.write(line)
            return
        self.render_logs()

    def render_logs(self) -> None:
        view = self.query_one("#log-view", RichLog)
        view.clear()
        for line in log_lines(self.log_source, self.log_filter):
            view.write(line)

    # -- events -----------------------------------------------------------------------------

    def add_events(self, sandbox_id: str, events: Sequence[Event]) -> None:
        if sandbox_id != self.events_for:
            return
        table = self.query_one("#events-table", DataTable)
        for event in events:
            if event.id <= self.events_after:
                continue
            table.add_row(Text(event.time.strftime("%Y-%m-%d %H:%M:%S")), Text(str(event.type)),
                          Text(event.actor), Text(str(event.reason or "")),
                          event_details(event.payload), key=str(event.id))
            self.events_after = event.id
        if events:
            table.move_cursor(row=table.row_count - 1, animate=False)

    # -- metrics ----------------------------------------------------------------------------

    def set_metrics(self, history: Sequence[MetricSample], live: Sequence[MetricSample]) -> None:
        by_time = {s.time: s for s in history}
        by_time.update({s.time: s for s in live})
        samples = [by_time[t] for t in sorted(by_time)]
        cpu = [s.cpu_pct for s in samples if s.cpu_pct is not None]
        mem = [s.memory_bytes for s in samples if s.memory_bytes is not None]
        span = ""
        if len(samples) > 1:
            seconds = (samples[-1].time - samples[0].time).total_seconds()
            span = f"{len(samples)} samples over {compact_duration(seconds)}"
        limit = next((s.memory_limit for s in reversed(samples) if s.memory_limit), None)
        self.query_one("#cpu-label", Static).update(
            metric_summary("CPU", cpu, lambda v: f"{v:.1f}%", span), layout=False)
        self.query_one("#cpu-spark", Sparkline).data = cpu[-120:]
        self.query_one("#mem-label", Static).update(metric_summary(
            "Memory", mem, human_bytes, f"limit {human_bytes(limit)}" if limit else ""),
            layout=False)
        self.query_one("#mem-spark", Sparkline).data = mem[-120:]
        other = Text()
        if samples:
            last = samples[-1]
            other.append("pids ", style="bold")
            other.append(str(last.pids if last.pids is not None else "-"))
            other.append("   network ", style="bold")
            rx, tx = last.net_rx_bytes, last.net_tx_bytes
            other.append("-" if rx is None else f"rx {human_bytes(rx)} tx {human_bytes(tx)}")
        self.query_one("#other-label", Static).update(other, layout=False)

    # -- checkpoints ------------------------------------------------------------------------

    def set_checkpoints(self, nodes: Sequence[Mapping[str, Any]], sandbox_id: str | None,
                        ) -> None:
        tree = self.query_one("#ckpt-tree", Tree)
        signature = json.dumps([_shape(n) for n in nodes])
        if getattr(tree, "_signature", None) == signature:
            return
        tree._signature = signature  # type: ignore[attr-defined]
        tree.clear()
        if not nodes:
            tree.root.add_leaf(Text("no checkpoints (s takes one)", style="dim"))
            return

        def add(parent, node) -> None:
            label = Text(node["id"], style="bold" if node["sandbox_id"] == sandbox_id else "")
            if node.get("name"):
                label.append(f" {node['name']}")
            label.append(f"  of {node['sandbox_id'] or 'an import'}  {node['created_at'][:19].replace('T', ' ')}"
                         f"  {human_bytes(node.get('size_bytes'))}  {node['state']}", style="dim")
            branch = parent.add(label, data=node["id"], expand=True)
            for child in node["children"]:
                add(branch, child)
            if not node["children"]:
                branch.allow_expand = False

        for node in nodes:
            add(tree.root, node)

    @property
    def highlighted_checkpoint(self) -> str | None:
        node = self.query_one("#ckpt-tree", Tree).cursor_node
        return node.data if node is not None and isinstance(node.data, str) else None


def _shape(node: Mapping[str, Any]) -> list:
    return [node["id"], node.get("name"), node["state"], node["sandbox_id"],
            [_shape(c) for c in node["children"]]]
