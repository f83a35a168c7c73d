"""Watching the inventory for changes, cheaply, and the metric samples recorded lately: what a
long-running front end (the dashboard) re-reads every second, reached through the library
(`AsyncSandboxer.watch`, `AsyncSandboxer.recent_metrics`).

On SQLite the watcher reads through a read-only connection of its own (the driver alone, no
ORM, as `sbx ls` does), and asks `PRAGMA data_version` whether any other connection committed
since its last read: when none did, nothing is read at all. Only the columns of the public
sandbox record are compared, so a row counts as changed only when something a reader can see
changed. When the database is not a current SQLite file (none yet, an older schema,
PostgreSQL), the caller reads through the Manager (which migrates) and hands the rows in.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sandboxer.core.rules.views import VIEW_COLUMNS

if TYPE_CHECKING:
    import sqlite3

    from sandboxer.core.lifecycle.manager import Manager


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
    (closing SQLite's connection under a running statement crashes the process)."""

    def __init__(self, url: str, include_destroyed: bool = False) -> None:
        self.url = url
        self.include_destroyed = include_destroyed
        self._rows: dict[str, dict[str, Any]] = {}
        self._conn: sqlite3.Connection | None = None
        self._version: int | None = None
        self._closed = False
        self._lock = threading.Lock()

    def set_include_destroyed(self, include: bool) -> None:
        with self._lock:
            if include != self.include_destroyed:
                self.include_destroyed = include
                self._version = None  # read again, whatever data_version says

    def read(self) -> InventoryDelta | None:
        """What changed, read with the driver alone; None when this is not a current SQLite
        database (then read through the Manager and give the rows to `apply`)."""
        from sandboxer.core.store import inventory

        with self._lock:
            if self._closed:
                return InventoryDelta()
            if self._conn is None:
                self._conn = inventory.open_sqlite_readonly(self.url, any_thread=True)
                if self._conn is None:
                    return None
            version = self._conn.execute("PRAGMA data_version").fetchone()[0]
            if version == self._version:
                return InventoryDelta()  # nobody committed: nothing to read
            rows = inventory.list_sandboxes(self._conn, include_all=self.include_destroyed,
                                            columns=VIEW_COLUMNS, pool_members=False)
            self._version = version
            return self._diff(rows)

    def apply(self, rows: Iterable[Mapping[str, Any]]) -> InventoryDelta:
        """What changed, given every row (read through the Manager)."""
        with self._lock:
            if self._closed:
                return InventoryDelta()
            return self._diff([{k: row.get(k) for k in VIEW_COLUMNS} for row in rows])

    def _diff(self, rows: list[dict[str, Any]]) -> InventoryDelta:
        delta, self._rows = diff_rows(self._rows, rows)
        return delta

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None


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
