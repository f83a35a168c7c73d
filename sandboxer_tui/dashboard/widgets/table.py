"""The sandbox table: one row per sandbox, keyed by id, updated cell by cell in place.

Cells hold `rich.text.Text` (user data is never parsed as markup). The table keeps every row
of the inventory (`sandboxes`) and shows those matching the filter, in the chosen order, sorted
on raw values (seconds, bytes, percent) through `sandboxer_tui.dashboard.model.sort_key`. It titles
itself (how many match, the sort, the marks) and tells its screen when the selected sandbox
changed (`SelectionChanged`).

At 10,000 sandboxes (issue 36) two things of Textual's DataTable cost too much: adding every
row before the first paint (each cell is measured), and its caches of the row order and the
line offsets, keyed on every cell update, so each tick of the clock cells rebuilt both for
every row. So a rebuild adds the first `LOAD_FIRST` rows, paints, and adds the rest
`LOAD_STEP` at a time, `LOAD_PAUSE_S` apart (anything that changes the table adds them
all first), and those two caches, and the column list it makes again for each row added, are
keyed on the table's shape (rows or columns added, removed, sorted). Each second only the
rows on screen have their clock cells made, and a cell or line drawn is drawn again only
when its value changed (Textual draws every visible line and cell again after any update).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region
from textual.message import Message
from textual.strip import Strip
from textual.widgets import DataTable

from sandboxer import MetricSample, State
from sandboxer_tui.dashboard.model import (
    SORT_COLUMNS,
    Inventory,
    MetricsBuffer,
    SandboxRow,
    matches,
    short_id_length,
    sort_key,
    sparkline,
    ttl_level,
)
from sandboxer_tui.formatting import compact_age, compact_duration, human_bytes

STATE_STYLES = {State.RUNNING: "green", State.PAUSED: "cyan", State.CREATING: "blue",
                State.DESTROYING: "magenta", State.DESTROYED: "dim", State.FAILED: "bold red",
                State.LOST: "red"}
TTL_STYLES = {"ok": "", "warning": "yellow", "critical": "bold red",
              "expired": "bold white on red"}
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
SPARK_WIDTH = 5
NAME_WIDTH, OWNER_WIDTH, PROFILE_WIDTH = 16, 14, 12
LOAD_FIRST, LOAD_STEP = 200, 500  # rows added before the first paint, then a step at a time
LOAD_PAUSE_S = 0.02  # between two steps: the screen is drawn and keys are read meanwhile
DRAWN_LINES = 1000  # lines kept drawn (a few screens); then they are forgotten at once

# (key, header, fixed width or None)
COLUMNS = (("id", "ID", None), ("name", "NAME", None), ("profile", "PROFILE", None),
           ("backend", "BACKEND", None), ("state", "STATE", 12), ("owner", "OWNER", None),
           ("age", "AGE", 5), ("ttl", "TTL", 7), ("cpu", "CPU", SPARK_WIDTH + 5),
           ("mem", "MEM", SPARK_WIDTH + 8))
# a header click sorts by its column
HEADER_SORT = {"id": "created", "name": "name", "profile": "profile", "backend": "backend",
               "state": "state", "owner": "owner", "age": "created", "ttl": "ttl",
               "cpu": "cpu", "mem": "mem"}


class IdCell(Text):
    """The id cell; it carries the full id (sorting reads it) and shows the mark."""

    sandbox_id: str = ""


def clip(text: str | None, width: int) -> str:
    if not text:
        return ""
    return text if len(text) <= width else text[: width - 1] + "…"


def state_cell(row: SandboxRow, busy: str | None, frame: int) -> Text:
    if busy:
        return Text(f"{SPINNER[frame % len(SPINNER)]} {busy}", style="bold yellow")
    return Text(row.state, style=STATE_STYLES.get(row.state, ""))


def ttl_cell(row: SandboxRow, now: datetime, warn_s: float) -> Text:
    left = row.ttl_left(now)
    level = ttl_level(left, warn_s)
    if level is None:
        return Text("-", style="dim")
    if level == "expired":
        return Text("expired", style=TTL_STYLES[level])
    return Text(compact_duration(left), style=TTL_STYLES[level])


def metric_cells(series: list[MetricSample]) -> tuple[Text, Text]:
    if not series:
        return Text("-", style="dim"), Text("-", style="dim")
    last = series[-1]
    cpu_values = [s.cpu_pct for s in series]
    mem_values = [s.memory_bytes for s in series]
    cpu = Text()
    if last.cpu_pct is not None:  # scaled to the window's peak, at least 10 % of a core
        cpu.append(sparkline(cpu_values, SPARK_WIDTH, top=max(10.0, *[
            v for v in cpu_values if v is not None])), style="green")
        cpu.append(f" {last.cpu_pct:.0f}%")
    else:
        cpu.append("-", style="dim")
    mem = Text()
    if last.memory_bytes is not None:  # to the window's peak, at least a quarter of the limit
        peak = max(v for v in mem_values if v is not None)
        top = max(peak, (last.memory_limit or 0) / 4)
        mem.append(sparkline(mem_values, SPARK_WIDTH, top=top), style="cyan")
        mem.append(f" {human_bytes(last.memory_bytes)}")
    else:
        mem.append("-", style="dim")
    return cpu, mem


class SandboxTable(DataTable):
    """Every sandbox, live. The screen feeds it `Inventory` reads and ticks."""

    DEFAULT_CSS = """
    SandboxTable { scrollbar-size-vertical: 1; }
    """

    class SelectionChanged(Message):
        """The sandbox under the cursor is another one, or its record changed (`row` is
        None when no row is shown)."""

        def __init__(self, row: SandboxRow | None) -> None:
            super().__init__()
            self.row = row

    # before __init__ runs: DataTable's own __init__ clears the table
    _shape = 0
    _order: tuple[tuple[int, int], list] | None = None
    _offsets: tuple[tuple[int, int], list] | None = None
    _columns: tuple[tuple[int, int], list] | None = None
    _drawn: dict | None = None  # cells drawn: key -> (value, lines)
    _lines: dict | None = None  # lines drawn: key -> (the row's values, strip)
    _widths: tuple[int, ...] = ()

    def __init__(self, warn_s: float = 300.0, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)
        self.warn_s = warn_s
        self.sandboxes: dict[str, SandboxRow] = {}
        self.marked: set[str] = set()
        self.busy: dict[str, str] = {}
        self.filter_text = ""
        self.sort_column = "created"
        self.sort_reverse = False
        self.metrics: MetricsBuffer | None = None
        self.now: datetime | None = None
        self.loaded = False
        self._show_destroyed = False
        self._id_len = 14
        self._frame = 0
        self._shown_text: dict[tuple[str, str], tuple[str, str]] = {}
        self._announced: SandboxRow | None = None
        self._last_title: Text | None = None
        self._pending: list[str] = []  # ids still to add, in order (LOAD_STEP at a time)
        # _shape moves when rows are added, removed or sorted, not on a cell update

    # -- Textual's row order and line offsets, cached on the table's shape --------------------

    @property
    def ordered_rows(self) -> list:
        key = (self.row_count, self._shape)
        if self._order is None or self._order[0] != key:
            self._order = (key, DataTable.ordered_rows.fget(self))  # type: ignore[attr-defined]
        return self._order[1]

    @property
    def _y_offsets(self) -> list:
        key = (self.row_count, self._shape)
        if self._offsets is None or self._offsets[0] != key:
            self._offsets = (key, [(row.key, y) for row in self.ordered_rows
                                   for y in range(row.height)])
        return self._offsets[1]

    @property
    def ordered_columns(self) -> list:
        """Textual makes this list again at each call (several per row added)."""
        key = (len(self.columns), self._shape)
        if self._columns is None or self._columns[0] != key:
            self._columns = (key, DataTable.ordered_columns.fget(self))  # type: ignore[attr-defined]
        return self._columns[1]

    def render_lines(self, crop: Region) -> list[Strip]:
        self._widths = tuple(c.get_render_width(self) for c in self.ordered_columns)
        return super().render_lines(crop)

    def _render_line(self, y: int, x1: int, x2: int, base_style: Style) -> Strip:
        """A line drawn is kept while the cells of its row are the same objects and nothing
        else it is drawn with changed (Textual draws every line on screen again after any
        cell update, to move one column of the rows on screen each second)."""
        try:
            row_key, line = self._get_offsets(y)
            values = tuple(c.label for c in self.ordered_columns) \
                if row_key == self._header_row_key else tuple(self._data[row_key].values())
        except (LookupError, IndexError):
            return super()._render_line(y, x1, x2, base_style)
        key = (y, row_key, line, x1, x2, self.size.width, base_style, self.cursor_coordinate,
               self.hover_coordinate, self.cursor_type, self.show_cursor,
               self._show_hover_cursor, self._pseudo_class_state, self.app.theme,
               self._widths)
        if self._lines is None or len(self._lines) > DRAWN_LINES:
            self._lines = {}  # (a dict: Textual's LRUCache keeps the first value of a key)
        drawn = self._lines.get(key)
        if drawn is not None and len(drawn[0]) == len(values) and all(
                a is b for a, b in zip(drawn[0], values, strict=True)):
            return drawn[1]
        strip = super()._render_line(y, x1, x2, base_style)
        self._lines[key] = (values, strip)
        return strip

    def _render_cell(self, row_index: int, column_index: int, base_style: Style, width: int,
                     cursor: bool = False, hover: bool = False) -> list[list[Segment]]:
        """Textual renders every cell on screen again after any cell update (its caches are
        keyed on a count of updates), so each tick redrew every visible cell to move one
        column. Here a cell drawn is kept while its value is the same object (a change of
        a cell puts a new one) and nothing else it is drawn with changed."""
        if column_index < 0:  # row labels: none here
            return super()._render_cell(row_index, column_index, base_style, width, cursor,
                                        hover)
        if row_index < 0:  # the header: its cells are the column labels
            row_key, value = self._header_row_key, self.ordered_columns[column_index].label
        else:
            row_key = self._row_locations.get_key(row_index)
            if row_key is None:
                return super()._render_cell(row_index, column_index, base_style, width,
                                            cursor, hover)
            value = self._data[row_key].get(self._column_locations.get_key(column_index))
        key = (row_key, row_index, column_index, base_style, width, cursor, hover,
               self.show_cursor, self._show_hover_cursor, self._pseudo_class_state,
               self.cell_padding, self.app.theme)
        if self._drawn is None or len(self._drawn) > DRAWN_LINES * len(COLUMNS):
            self._drawn = {}
        drawn = self._drawn.get(key)
        if drawn is not None and drawn[0] is value:
            return drawn[1]
        lines = super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        self._drawn[key] = (value, lines)
        return lines

    def add_column(self, *args: Any, **kwargs: Any) -> Any:
        return self._reshaped(lambda: super(SandboxTable, self).add_column(*args, **kwargs))

    def remove_column(self, column_key: Any) -> None:
        self._reshaped(lambda: super(SandboxTable, self).remove_column(column_key))

    def _reshaped(self, change: Any) -> Any:
        """Run a change of the table's shape; the caches above are read again after it."""
        self._shape += 1
        try:
            return change()
        finally:
            self._shape += 1

    def add_row(self, *cells: Any, **kwargs: Any) -> Any:
        return self._reshaped(lambda: super(SandboxTable, self).add_row(*cells, **kwargs))

    def remove_row(self, row_key: Any) -> None:
        self._reshaped(lambda: super(SandboxTable, self).remove_row(row_key))

    def clear(self, columns: bool = False) -> Any:
        return self._reshaped(lambda: super(SandboxTable, self).clear(columns))

    def sort(self, *columns: Any, **kwargs: Any) -> Any:
        return self._reshaped(lambda: super(SandboxTable, self).sort(*columns, **kwargs))

    def on_mount(self) -> None:
        for key, label, width in COLUMNS:
            self.add_column(label, key=key, width=width)
        self._title()

    # -- what it tells its screen -----------------------------------------------------------

    def _announce_selection(self) -> None:
        row = self.selected_row()
        if row is not self._announced:
            self._announced = row
            self.post_message(self.SelectionChanged(row))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._announce_selection()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        """A click on a column header sorts by it (again: the other way)."""
        event.stop()
        column = HEADER_SORT.get(event.column_key.value, "created")
        self.set_sort(column, not self.sort_reverse if column == self.sort_column else False)

    @property
    def show_destroyed(self) -> bool:
        return self._show_destroyed

    @show_destroyed.setter
    def show_destroyed(self, show: bool) -> None:
        self._show_destroyed = show
        self._title()

    def _title(self) -> None:
        title = Text("sandboxes ", style="bold")
        shown, total = self.row_count, len(self.sandboxes)
        if self.filter_text:
            title.append(f"  {shown} of {total} match ")
            title.append(repr(self.filter_text), style="italic")
        title.append(f"  sorted by {self.sort_column}{' ↓' if self.sort_reverse else ''}",
                     style="dim")
        if self.marked:
            title.append(f"  {len(self.marked)} marked", style="bold yellow")
        if self._show_destroyed:
            title.append("  (destroyed shown)", style="dim")
        if title != self._last_title:
            self._last_title = title
            self.border_title = title

    # -- reading ----------------------------------------------------------------------------

    @property
    def shown_ids(self) -> list[str]:
        self._load_all()
        return [key.value for key in self.rows_in_order()]

    def rows_in_order(self) -> list:
        return [row.key for row in self.ordered_rows]

    @property
    def selected_id(self) -> str | None:
        if not self.row_count:
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:
            return None

    def selected_row(self) -> SandboxRow | None:
        sid = self.selected_id
        return self.sandboxes.get(sid) if sid else None

    def targets(self) -> list[SandboxRow]:
        """The marked sandboxes still shown, else the one under the cursor (asked for each
        key binding the footer shows: rows still to add are added only when some are marked)."""
        if self.marked:
            marked = [self.sandboxes[s] for s in self.shown_ids
                      if s in self.marked and s in self.sandboxes]
            if marked:
                return marked
        row = self.selected_row()
        return [row] if row else []

    def cell_text(self, sandbox_id: str, column: str) -> str:
        value = self.get_cell(sandbox_id, column)
        return value.plain if isinstance(value, Text) else str(value)

    # -- cells ------------------------------------------------------------------------------

    def _id_cell(self, row: SandboxRow) -> IdCell:
        # the id without its `sbx-` prefix, as short as still unique (the CLI accepts both)
        cell = IdCell(("●" if row.id in self.marked else " ") + row.id[4: self._id_len])
        cell.stylize("bold yellow" if row.id in self.marked else "", 0, 1)
        cell.sandbox_id = row.id
        return cell

    def _cells(self, row: SandboxRow) -> dict[str, Text]:
        now = self.now
        series = self.metrics.series(row.id) if self.metrics else []
        cpu, mem = metric_cells(series)
        return {
            "id": self._id_cell(row),
            "name": Text(clip(row.name, NAME_WIDTH)),
            "profile": Text(clip(row.profile, PROFILE_WIDTH)),
            "backend": Text(row.backend),
            "state": state_cell(row, self.busy.get(row.id), self._frame),
            "owner": Text(clip(row.owner, OWNER_WIDTH)),
            "age": Text(compact_age(row.age(now)) if now else "", style="dim"),
            "ttl": ttl_cell(row, now, self.warn_s) if now else Text(""),
            "cpu": cpu,
            "mem": mem,
        }

    def _set(self, sandbox_id: str, column: str, value: Text, width: bool = False) -> None:
        key = (value.plain, str(value.style) + "".join(str(s.style) for s in value.spans))
        if self._shown_text.get((sandbox_id, column)) == key:
            return
        self._shown_text[(sandbox_id, column)] = key
        self.update_cell(sandbox_id, column, value, update_width=width)

    def _add(self, row: SandboxRow) -> None:
        cells = self._cells(row)
        self.add_row(*(cells[key] for key, _, _ in COLUMNS), key=row.id)
        for column, value in cells.items():
            self._shown_text[(row.id, column)] = (
                value.plain, str(value.style) + "".join(str(s.style) for s in value.spans))

    def _update(self, row: SandboxRow) -> None:
        for column, value in self._cells(row).items():
            self._set(row.id, column, value, width=column in ("name", "profile", "owner"))

    def _remove(self, sandbox_id: str) -> None:
        self.remove_row(sandbox_id)
        for key, _, _ in COLUMNS:
            self._shown_text.pop((sandbox_id, key), None)

    # -- feeding ----------------------------------------------------------------------------

    def apply(self, inventory: Inventory) -> None:
        """Bring the table in line with one inventory read, cell by cell, on the read's clock
        (a sandbox made since the last tick shows its age and countdown from now, and the
        rows on screen move to the same second)."""
        self._load_all()
        self.now = inventory.now
        self.sandboxes = inventory.rows
        rebuilt = False
        if inventory.added or inventory.removed or not self.loaded:
            new_len = short_id_length(self.sandboxes) if self.sandboxes else 14
            if new_len != self._id_len:
                self._id_len = new_len
                self.marked &= self.sandboxes.keys()
                self.rebuild()
                rebuilt = True
        if not rebuilt:
            self._apply_changes(inventory)
        self.loaded = True
        self.tick(inventory.now)
        self._title()
        self._announce_selection()

    def _apply_changes(self, inventory: Inventory) -> None:
        """Only the rows that changed are looked at."""
        order_changed = False
        for sid in inventory.removed:
            self.marked.discard(sid)
            if self.is_shown(sid):
                self._remove(sid)
        for sid in inventory.added + inventory.changed:
            row = self.sandboxes[sid]
            wanted = matches(row, self.filter_text)
            shown = self.is_shown(sid)
            if shown and wanted:
                self._update(row)
                order_changed |= self.sort_column not in ("created", "cpu", "mem")
            elif shown:
                self._remove(sid)
            elif wanted:
                self._add(row)
                order_changed = True
        if order_changed and (self.sort_column != "created" or self.sort_reverse):
            self.resort()

    def visible_ids(self) -> list[str]:
        """The rows on screen now (and one more): only these need their clock cells redrawn;
        the others are brought up to date when scrolled into view."""
        height = max(0, self.size.height - (self.header_height if self.show_header else 0))
        top = int(self.scroll_y)
        return [row.key.value for row in self.ordered_rows[top: top + height + 1]]

    def tick(self, now: datetime) -> None:
        """The clock moved: ages and countdowns of the rows on screen. No row moves: every
        countdown falls alike, so the order by TTL (by deadline) stays as it is."""
        self.now = now
        self._refresh_clock_cells()

    def _refresh_clock_cells(self) -> None:
        now = self.now
        if now is None:
            return
        for sid in self.visible_ids():
            row = self.sandboxes.get(sid)
            if row is not None:
                self._set(sid, "age", Text(compact_age(row.age(now)), style="dim"))
                self._set(sid, "ttl", ttl_cell(row, now, self.warn_s))

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self._refresh_clock_cells()

    def spin(self) -> None:
        self._frame += 1
        for sid, verb in list(self.busy.items()):
            if sid in self.sandboxes and self.is_shown(sid):
                self._set(sid, "state", state_cell(self.sandboxes[sid], verb, self._frame))

    def set_busy(self, ids: Iterable[str], verb: str | None) -> None:
        for sid in ids:
            if verb:
                self.busy[sid] = verb
            else:
                self.busy.pop(sid, None)
            if sid in self.sandboxes and self.is_shown(sid):
                self._set(sid, "state", state_cell(self.sandboxes[sid], verb, self._frame))

    def refresh_metrics(self, ids: Iterable[str]) -> None:
        for sid in ids:
            if sid in self.sandboxes and self.is_shown(sid) and self.metrics:
                cpu, mem = metric_cells(self.metrics.series(sid))
                self._set(sid, "cpu", cpu)
                self._set(sid, "mem", mem)
        if self.sort_column in ("cpu", "mem"):
            self.resort()

    def is_shown(self, sandbox_id: str) -> bool:
        return (sandbox_id, "id") in self._shown_text

    # -- marks, filter, sort ----------------------------------------------------------------

    def toggle_mark(self, sandbox_id: str) -> None:
        self._load_all()
        if sandbox_id in self.marked:
            self.marked.discard(sandbox_id)
        else:
            self.marked.add(sandbox_id)
        if sandbox_id in self.sandboxes:
            self._set(sandbox_id, "id", self._id_cell(self.sandboxes[sandbox_id]))
        self._title()

    def clear_marks(self) -> None:
        self._load_all()
        marked, self.marked = self.marked, set()
        for sid in marked:
            if sid in self.sandboxes and self.is_shown(sid):
                self._set(sid, "id", self._id_cell(self.sandboxes[sid]))
        self._title()

    def set_filter(self, text: str) -> None:
        if text != self.filter_text:
            self.filter_text = text
            self.rebuild()
        self._title()
        self._announce_selection()

    def set_sort(self, column: str, reverse: bool = False) -> None:
        if column not in SORT_COLUMNS:
            raise ValueError(column)
        self.sort_column, self.sort_reverse = column, reverse
        self.resort()
        self._title()

    def _key(self, cell: IdCell) -> tuple:
        latest = self.metrics.latest(cell.sandbox_id) if self.metrics else None
        return sort_key(self.sandboxes[cell.sandbox_id], self.sort_column, self.now, latest)

    def resort(self) -> None:
        self._load_all()
        if not self.row_count or self.now is None:
            return
        selected = self.selected_id
        before = self.shown_ids
        self.sort("id", key=self._key, reverse=self.sort_reverse)
        if self.shown_ids != before and selected:
            self.move_cursor(row=self.get_row_index(selected), animate=False)

    def rebuild(self) -> None:
        """Show again from scratch (a new filter, or ids that need a longer prefix)."""
        selected = self.selected_id
        self.clear()
        self._shown_text.clear()
        self._pending = []
        wanted = [r for r in self.sandboxes.values() if matches(r, self.filter_text)]
        if self.now is not None:
            wanted.sort(key=lambda r: sort_key(r, self.sort_column, self.now,
                                               self.metrics.latest(r.id) if self.metrics
                                               else None), reverse=self.sort_reverse)
        for row in wanted[:LOAD_FIRST]:
            self._add(row)
        self._pending = [r.id for r in wanted[LOAD_FIRST:]]
        if selected and selected in {r.id for r in wanted}:
            if not self.is_shown(selected):
                self._load_all()
            self.move_cursor(row=self.get_row_index(selected), animate=False)
        if self._pending:
            self.set_timer(LOAD_PAUSE_S, self._load_more)

    def _load_more(self) -> None:
        """The next LOAD_STEP rows of a rebuild (the screen stays live between steps)."""
        step, self._pending = self._pending[:LOAD_STEP], self._pending[LOAD_STEP:]
        for sid in step:
            row = self.sandboxes.get(sid)
            if row is not None and not self.is_shown(sid):
                self._add(row)
        if self._pending:
            self.set_timer(LOAD_PAUSE_S, self._load_more)
        self._title()

    def _load_all(self) -> None:
        """Every row still to add, now: the table is about to change or be read whole."""
        if self._pending:
            pending, self._pending = self._pending, []
            for sid in pending:
                row = self.sandboxes.get(sid)
                if row is not None and not self.is_shown(sid):
                    self._add(row)

