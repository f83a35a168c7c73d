"""`sbx db copy --to URL`: move an inventory into another store (SQLite into PostgreSQL when
a team becomes a fleet). Every row of every table, ids and hashes unchanged, in one target
transaction; the target must be empty, and its event chain must verify afterwards or
nothing is kept."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlmodel import SQLModel

import sandboxer.core.store.models  # noqa: F401  (registers the tables)
from sandboxer.core.rules.errors import BadInput, Conflict, OperationFailed
from sandboxer.core.store import events as eventlog
from sandboxer.core.store.db import Database, redact

# parents before children; each table's rows in primary-key order
TABLES = ("sandboxes", "checkpoints", "events", "sink_cursors", "deliveries", "metric_samples",
          "api_keys", "tenants", "idempotency_keys", "pools", "processes", "volumes", "mounts")
BATCH = 2000


@dataclass
class CopyReport:
    source: str
    target: str
    rows: dict[str, int]
    events_verified: int

    def as_json(self) -> dict[str, Any]:
        return {"source": self.source, "target": self.target, "rows": self.rows,
                "events_verified": self.events_verified}


def copy_inventory(source: Database, target_url: str) -> CopyReport:
    if target_url == source.url:
        raise BadInput("--to names the database sbx already uses")
    target = Database(target_url)
    source.migrate()
    target.migrate()
    tables = [SQLModel.metadata.tables[name] for name in TABLES]
    counts: dict[str, int] = {}
    with target.write() as out:
        for table in tables:
            if out.execute(sa.select(sa.func.count()).select_from(table)).scalar():
                raise Conflict(f"the target {redact(target_url)} already holds {table.name}: "
                               "copy only into an empty inventory")
        with source.read() as src:
            for table in tables:
                counts[table.name] = _copy_table(src, out, table)
        _advance_sequences(out, tables)
        report = eventlog.verify(
            iter(out.execute(sa.select(eventlog.EVENTS).order_by(eventlog.EVENTS.c.id))
                 .mappings()), None)
        if not report.intact:  # raising rolls the whole copy back
            raise OperationFailed(f"the copied event chain does not verify "
                                  f"(event {report.broken_at}: {report.problem}); nothing was kept")
    target.dispose()
    return CopyReport(redact(source.url), redact(target_url), counts, report.checked)


def _copy_table(src: sa.Connection, out: sa.Connection, table: sa.Table) -> int:
    order = list(table.primary_key.columns)
    result = src.execution_options(yield_per=BATCH).execute(sa.select(table).order_by(*order))
    copied = 0
    for batch in result.mappings().partitions(BATCH):
        out.execute(table.insert(), [dict(r) for r in batch])
        copied += len(batch)
    return copied


def _advance_sequences(out: sa.Connection, tables: list[sa.Table]) -> None:
    """PostgreSQL's serial ids do not see rows inserted with explicit ids: move them on."""
    if out.dialect.name != "postgresql":
        return
    for table in tables:
        column = table.autoincrement_column
        if column is None:
            continue
        sequence = out.exec_driver_sql(
            "SELECT pg_get_serial_sequence(%s, %s)", (table.name, column.name)).scalar()
        if sequence:
            out.exec_driver_sql(f"SELECT setval('{sequence}', COALESCE((SELECT MAX({column.name}) "
                                f"FROM {table.name}), 0) + 1, false)")
