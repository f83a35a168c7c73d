"""Watching the inventory for changes, cheaply, and the metric samples recorded lately: what a
long-running front end (the dashboard) re-reads every second, reached through the library
(`AsyncSandboxer.watch`, `AsyncSandboxer.recent_metrics`).

A look reads only the rows changed since the previous look, found through the indexed
`sandboxes.change_seq` (migration 0016), which a trigger sets on every insert and update.
Why a change marker and not the event log's position: not every change a reader sees writes
an event (following logs or an exec moves `last_activity_at` quietly, a pool member's claim
changes `launch`), and a trigger cannot be forgotten by a writer. docs/design.md, "Watching
the inventory", says the same.

- SQLite: `PRAGMA data_version` first tells whether any other connection committed since the
  last look; when none did, nothing is read at all. Writers take turns, so `change_seq` grows
  in commit order: the next look reads `change_seq > ` the largest seen.
- PostgreSQL: `change_seq` is the writing transaction's id, handed out before it commits, so
  the next look reads from the oldest transaction still running when the previous look began
  (`txid_snapshot_xmin`): a row committed late is read then, and a row read twice is simply
  not a change the second time.

Both read through a read-only connection of the driver alone (no ORM, as `sbx ls` does).
Only the columns of the public sandbox record are compared, so a row counts as changed only
when something a reader can see changed. When the database is not current yet (none, an older
schema), the caller reads through the Manager (which migrates) and hands the rows in.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from sandboxer.core.rules.views import VIEW_COLUMNS

_CREATED_AND_ID = itemgetter(VIEW_COLUMNS.index("created_at"), VIEW_COLUMNS.index("id"))

if TYPE_CHECKING:
    from sandboxer.core.lifecycle.manager import Manager

DESTROYED = "destroyed"  # State.DESTROYED, without importing the state table's enum here


@dataclass
class InventoryDelta:
    """What one read found: the rows added or changed since the previous read (the public
    columns only), and the ids of those gone (destroyed, unless destroyed ones are shown)."""

    added: list[dict[str, Any]] = field(default_factory=list)
    changed: list[dict[str, Any]] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    @property
    def any_change(self) -> bool:
        return bool(self.added or self.changed or self.removed)


class InventoryWatcher:
    """One reader's view of the inventory: `read()` returns what changed since its previous
    read. Safe to call from any one thread at a time; `close()` waits for a read in progress
    (closing SQLite's connection under a running statement crashes the process). `owner`:
    that tenant's sandboxes only (core/store/tenancy.py)."""

    def __init__(self, url: str, include_destroyed: bool = False,
                 owner: str | None = None) -> None:
        self.url = url
        self.include_destroyed = include_destroyed
        self.owner = owner
        self._rows: dict[str, dict[str, Any]] = {}
        self._conn: Any = None
        self._postgres = False
        self._version: int | None = None
        self._position: int | None = None  # None: the next look reads every row
        # SQLite: the file's (device, inode), and the id of the row at `_position`
        self._file: tuple[int, int] | None = None
        self._at_position: str | None = None
        self._read_top: tuple[int, str] | None = None  # the last _select's (change_seq, id)
        self._closed = False
        self._lock = threading.RLock()  # re-entered: InventoryMirror reads under it
        self.rows_read = 0  # rows the last look read (what a test or a benchmark asks)

    def set_include_destroyed(self, include: bool) -> None:
        with self._lock:
            if include != self.include_destroyed:
                self.include_destroyed = include
                self._position = self._version = None  # read every row again

    def read(self) -> InventoryDelta | None:
        """What changed, read with the driver alone; None when the database is not current
        (then read through the Manager and give the rows to `apply`)."""
        from sandboxer.core.store import inventory

        with self._lock:
            if self._closed:
                return InventoryDelta()
            if self._conn is None:
                self._conn = inventory.open_sqlite_readonly(self.url, any_thread=True)
                if self._conn is not None:
                    self._same_database_or_all_again()
                else:
                    self._conn = inventory.open_postgres_readonly(self.url)
                    self._postgres = self._conn is not None
                if self._conn is None:
                    return None
            if self._postgres:
                return self._read_postgres()
            version = self._conn.execute("PRAGMA data_version").fetchone()[0]
            if version == self._version:
                self.rows_read = 0
                return InventoryDelta()  # nobody committed: nothing to read
            full = self._position is None
            rows = self._select("?", self._position, ">")
            self._drop_positions(rows)
            delta = self._whole(rows) if full else self._merge(rows)
            # moved on only once the rows are taken in: a failed merge reads them again
            self._version = version
            if self._read_top is not None:
                self._position, self._at_position = self._read_top
            return delta

    def _same_database_or_all_again(self) -> None:
        """On a new SQLite connection: when the file is another one (removed and made again)
        or its changes went back (an older copy restored), the next look reads every row,
        since the position counts in the other's changes. Told by the file's identity, the
        latest change, and the row at the position: still the one read there, or a row
        changed since (it moved on), never another."""
        import os

        info = os.stat(self.url[len("sqlite:///"):])
        file = (info.st_dev, info.st_ino)
        if self._position is not None:
            latest = self._conn.execute("SELECT max(change_seq) FROM sandboxes").fetchone()[0]
            there = self._conn.execute("SELECT id FROM sandboxes WHERE change_seq = ?",
                                       (self._position,)).fetchone()
            if (file != self._file or latest is None or latest < self._position
                    or (there is not None and there[0] != self._at_position)):
                self._position = self._version = None
        self._file = file

    def _read_postgres(self) -> InventoryDelta:
        cursor = self._conn.cursor()
        try:  # before the rows: what runs now is read again next time
            cursor.execute("SELECT txid_snapshot_xmin(txid_current_snapshot())")
            oldest_running = int(cursor.fetchone()[0])
        finally:
            cursor.close()
        full = self._position is None
        rows = self._select("%s", self._position, ">=")
        self._drop_positions(rows)
        delta = self._whole(rows) if full else self._merge(rows)
        self._position = oldest_running  # once the rows are taken in (as on SQLite)
        return delta

    def _select(self, mark: str, position: int | None, op: str) -> list[dict[str, Any]]:
        """The public columns (and pool, launch) of the rows changed since `position` (every
        row when None), of the tenant's if one is set."""
        where, params = [], []
        if position is not None:
            where.append(f"change_seq {op} {mark}")
            params.append(position)
        if self.owner is not None:
            where.append(f"owner = {mark}")
            params.append(self.owner)
        if position is None and not self.include_destroyed:  # a first look: only what shows
            where.append(f"state <> {mark}")
            params.append(DESTROYED)
        sql = f"SELECT {', '.join(VIEW_COLUMNS)}, change_seq FROM sandboxes"
        if where:
            sql += " WHERE " + " AND ".join(where)
        if position is None:
            sql += " ORDER BY created_at, id"
        cursor = self._conn.cursor()
        try:
            cursor.execute(sql, params)
            fetched = cursor.fetchall()
        finally:
            cursor.close()
        if position is not None:  # the few changed rows, put in order here: ordered by the
            # database, SQLite walks the created_at index past every row instead of change_seq's
            fetched.sort(key=_CREATED_AND_ID)
        latest = max(fetched, key=lambda row: row[-1], default=None)  # id first, change_seq last
        self._read_top = None if latest is None else (latest[-1], latest[0])
        rows = self._rows_of([*VIEW_COLUMNS, "change_seq"], fetched)
        self.rows_read = len(rows)
        return rows

    @staticmethod
    def _rows_of(names: list[str], fetched: list[tuple[Any, ...]]) -> list[Any]:
        """The rows as this reader keeps them: a dict each (VIEW_COLUMNS and change_seq)."""
        return [dict(zip(names, r, strict=True)) for r in fetched]

    @staticmethod
    def _drop_positions(rows: list[Any]) -> list[int]:
        """Each row's change_seq, taken out of it."""
        return [r.pop("change_seq") for r in rows]

    def _whole(self, rows: list[dict[str, Any]]) -> InventoryDelta:
        """The delta of a look that read every row."""
        delta, self._rows = diff_rows(self._rows, [r for r in rows if self._shows(r)])
        return delta

    def _merge(self, rows: list[dict[str, Any]]) -> InventoryDelta:
        """The delta of these changed rows against what was seen: a row that no longer
        shows (destroyed while those are hidden, a warm pool member nobody claimed) is
        removed when it was shown."""
        delta = InventoryDelta()
        for row in rows:
            sid = row["id"]
            old = self._rows.get(sid)
            if not self._shows(row):
                if old is not None:
                    del self._rows[sid]
                    delta.removed.append(sid)
                continue
            self._rows[sid] = row
            if old is None:
                delta.added.append(row)
            elif old != row:
                delta.changed.append(row)
        return delta

    def _shows(self, row: Mapping[str, Any]) -> bool:
        if row["pool"] is not None and row["launch"] is None:
            return False  # a warm pool member nobody claimed (sandboxer.core.pools)
        return self.include_destroyed or row["state"] != DESTROYED

    def apply(self, rows: Iterable[Mapping[str, Any]]) -> InventoryDelta:
        """What changed, given every row (read through the Manager)."""
        with self._lock:
            if self._closed:
                return InventoryDelta()
            self._position = self._version = None  # the fast path, once current, reads all
            fresh = [{k: row.get(k) for k in VIEW_COLUMNS} for row in rows]
            if self.owner is not None:
                fresh = [row for row in fresh if row["owner"] == self.owner]
            delta, self._rows = diff_rows(self._rows, fresh)
            return delta

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class InventoryMirror(InventoryWatcher):
    """A listing kept between reads, for a long-lived client's `list()` (issue 36): each
    `views()` is a look of the watcher's, which reads only the rows changed since the
    previous look (nothing at all on SQLite when nobody committed); views are made of those
    rows alone, straight from the driver's tuples, and every view is given as of now
    (`ttl_left_s` is the only field that moves by itself). The same records, in the same
    order, as inventory.list_sandboxes' query gives (tests/api/test_list_scale.py). Each
    row's view is also kept encoded, for `views_json`."""

    def __init__(self, url: str, include_destroyed: bool, owner: str | None) -> None:
        super().__init__(url, include_destroyed, owner)
        # by id: (its view, the view's ttl_end_us, its view_fragment; core/rules/views.py)
        self._entries: dict[str, tuple[dict[str, Any], int | None, bytes]] = {}
        self._ordered: list[tuple[dict[str, Any], int | None, bytes]] | None = []  # None: sort
        self._handed_out: list[Any] = []  # see views(last=True)

    def views(self, now_iso: str, *, state: str | None = None, backend: str | None = None,
              labels: Mapping[str, str] | None = None,
              last: bool = False) -> list[dict[str, Any]] | None:
        """The listing, oldest first, narrowed as inventory.list_sandboxes narrows it; None
        when the database is not current (then the Manager's way). `last`: this mirror is
        read no more (a listing a forked child inherited, see keep_for_children), so its
        views are handed out as they are, not copied, and it forgets them."""
        from sandboxer.core.rules.views import with_ttl_left

        with self._lock:
            kept = self._refreshed()
            if kept is None:
                return None
            if last:  # handed out: the next look starts again, and what was handed out stays
                # referenced, never freed in a forked child (freeing 10,000 views of the parent's
                # costs the child 20 ms; it exits instead)
                self._handed_out = kept
                self._entries, self._ordered, self._position = {}, [], None
        kept = _narrowed(kept, state, backend, labels)
        # copies, unless last: what is kept is never handed out
        return with_ttl_left(kept, now_iso, copy=not last)

    def views_json(self, now_iso: str, *, state: str | None = None,
                   backend: str | None = None,
                   labels: Mapping[str, str] | None = None) -> bytes | None:
        """`views()` as one JSON document (views.encode_list's), made of each row's view
        encoded when it was read: no view is copied or encoded again. None when the database
        is not current."""
        from sandboxer.core.rules.views import kept_views_json

        with self._lock:
            kept = self._refreshed()
        if kept is None:
            return None
        return kept_views_json(_narrowed(kept, state, backend, labels), now_iso)

    def refresh(self) -> bool:
        """Read what changed and put the listing in order; False when the database is not
        current."""
        with self._lock:
            return self._refreshed() is not None

    def _refreshed(self) -> list[tuple[dict[str, Any], int | None, bytes]] | None:
        """refresh(), under the lock (re-entered by read): the entries in order, or None."""
        if self.read() is None:
            return None
        if self._ordered is None:
            self._ordered = sorted(self._entries.values(), key=lambda entry: (
                entry[0]["created_at"], entry[0]["id"]))
        return self._ordered

    def release(self) -> None:
        """Close the connection and keep the rows and the position: what a process does
        before it forks, so that no child inherits an open connection (SQLite's rule).
        The next read opens a connection of its own and reads the rows changed since."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._version = None  # PRAGMA data_version counts per connection

    @staticmethod
    def _rows_of(names: list[str], fetched: list[tuple[Any, ...]]) -> list[Any]:
        return fetched  # VIEW_COLUMNS' values, then change_seq

    @staticmethod
    def _drop_positions(rows: list[Any]) -> list[int]:
        return [r[-1] for r in rows]

    def _whole(self, rows: list[Any]) -> InventoryDelta:
        self._entries, self._ordered = {}, None
        return self._merge(rows)

    def _merge(self, rows: list[Any]) -> InventoryDelta:
        from sandboxer.core.rules.views import sandbox_views, ttl_end_us, view_fragment

        if not rows:
            return InventoryDelta()
        pool, launch, state = (VIEW_COLUMNS.index(c) for c in ("pool", "launch", "state"))
        shown = []
        for row in rows:
            if (row[pool] is not None and row[launch] is None) or (
                    not self.include_destroyed and row[state] == DESTROYED):
                self._entries.pop(row[0], None)  # as InventoryWatcher._shows hides it
            else:
                shown.append(row[:-1])
        for view in sandbox_views(shown):  # without a now: ttl_left_s is added as of a read
            self._entries[view["id"]] = (view, ttl_end_us(view), view_fragment(view))
        self._ordered = None  # a listing under way keeps the list it took
        return InventoryDelta()


def _narrowed(kept: list[tuple[dict[str, Any], Any, Any]], state: str | None,
              backend: str | None, labels: Mapping[str, str] | None) -> list[Any]:
    """The entries (view first) whose views inventory.list_sandboxes' filters keep."""
    if state is not None:
        kept = [e for e in kept if e[0]["state"] == state]
    if backend is not None:
        kept = [e for e in kept if e[0]["backend"] == backend]
    if labels:
        wanted = dict(labels).items()
        kept = [e for e in kept if wanted <= e[0]["labels"].items()]
    return kept


# The listings this process keeps for the children it forks (keep_for_children), by (database
# URL, destroyed ones shown, owner), with the pid of the process that keeps them.
_KEPT_FOR_CHILDREN: dict[tuple[str, bool, str | None], tuple[int, InventoryMirror]] = {}


def keep_for_children(url: str) -> bool:
    """Bring the listing `sbx ls` shows of `url` (every owner's, destroyed ones hidden) up to
    date and keep it, its connection closed, for the children this process forks: a child's
    first listing of that database then reads only the rows changed since (`handed_down`),
    not every row. What the resident server (sandboxer_tui/resident) does between commands
    (issue 36). False, keeping nothing, when the database is not current, or not SQLite: a
    PostgreSQL URL may name another database in a caller's environment (libpq reads PGHOST
    and the like), and connecting would hold up the server."""
    import os

    key = (url, False, None)
    if not url.startswith("sqlite:///"):
        return False  # see above
    mirror = _KEPT_FOR_CHILDREN[key][1] if key in _KEPT_FOR_CHILDREN else (
        InventoryMirror(url, False, None))
    current = False
    try:
        current = mirror.refresh()
    finally:
        mirror.release()
        if current:
            _KEPT_FOR_CHILDREN[key] = (os.getpid(), mirror)
        else:  # not current, or a read that failed: nothing kept that may be wrong
            _KEPT_FOR_CHILDREN.pop(key, None)
    return current


def kept_for_children() -> int:
    """How many listings this process keeps for its children (keep_for_children)."""
    import os

    return sum(pid == os.getpid() for pid, _ in _KEPT_FOR_CHILDREN.values())


def handed_down(url: str, include_destroyed: bool, owner: str | None) -> InventoryMirror | None:
    """In a forked child, the listing its parent kept for this database (keep_for_children),
    taken: read it once, with `views(last=True)`. None anywhere else."""
    import os

    key = (url, include_destroyed, owner)
    kept = _KEPT_FOR_CHILDREN.get(key)
    if kept is None or kept[0] == os.getpid():
        return None
    # taken: this process's own from now on, so never handed out again, and kept until the
    # process ends (the views handed out stay referenced: see InventoryMirror.views)
    _KEPT_FOR_CHILDREN[key] = (os.getpid(), kept[1])
    return kept[1]


def diff_rows(previous: Mapping[str, Mapping[str, Any]], rows: Iterable[dict[str, Any]],
              ) -> tuple[InventoryDelta, dict[str, dict[str, Any]]]:
    """What changed from `previous` (rows by id) to `rows`, and `rows` by id: the one rule
    of every watch, in process or over a service (a row counts as changed when any field
    of it differs)."""
    delta = InventoryDelta()
    fresh: dict[str, dict[str, Any]] = {}
    for row in rows:
        old = previous.get(row["id"])
        fresh[row["id"]] = row
        if old is None:
            delta.added.append(row)
        elif old != row:
            delta.changed.append(row)
    delta.removed = [sid for sid in previous if sid not in fresh]
    return delta, fresh


def recent_samples(mgr: Manager, since: datetime) -> list[dict[str, Any]]:
    """The stored metric samples of every sandbox since `since`, oldest first, in one query:
    what this process, another (`sbx metrics --all`) or an earlier session recorded."""
    import sqlalchemy as sa

    from sandboxer.core.rules.clock import to_iso
    from sandboxer.core.store import tenancy
    from sandboxer.core.store.models import MetricSample, Sandbox

    samples, sandboxes = MetricSample.__table__, Sandbox.__table__
    query = sa.select(samples).where(samples.c.time >= to_iso(since))
    if tenancy.current() is not None:
        query = query.where(samples.c.sandbox_id.in_(
            tenancy.narrow(sa.select(sandboxes.c.id), sandboxes)))
    with mgr.db.read() as conn:
        return [dict(r) for r in conn.execute(
            query.order_by(samples.c.time, samples.c.id)).mappings()]
