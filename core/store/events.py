"""The event log: append-only rows chained by SHA-256, written inside the transaction that
makes the change they record (outbox), so a state change never exists without its event."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sandboxer.core.rules.errors import BadInput
from sandboxer.core.store.anchor import HEAD_KEY
from sandboxer.core.store.db import INTEGER_MAX, LOCK_EVENT_CHAIN, serialise
from sandboxer.core.store.models import Event

GENESIS = "0" * 64
EVENTS = Event.__table__
MASK = "***"
# Built once: every write appends through these (a statement built per call costs about as
# much as SQLite's work on it).
# Text, not Core statements: a process compiles a Core statement the first time it runs it,
# and a one-shot command (`sbx exec`) appends one event (core/store/refs.py `by_id`).
_HEAD = sa.text("SELECT id, hash FROM events ORDER BY id DESC LIMIT 1")
_APPEND = sa.text(f"INSERT INTO events ({', '.join(c.name for c in EVENTS.columns)}) VALUES "
                  f"({', '.join(':' + c.name for c in EVENTS.columns)})")
MAX_EVENT_ID = INTEGER_MAX  # the id column's range (an INTEGER on PostgreSQL)


def check_event_id(value: Any, what: str = "event id") -> int:
    """An event id asked for (`after`, the ids to redeliver): a whole number the column can
    hold, so both stores answer alike (PostgreSQL refuses a larger one, SQLite past 2**63)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_EVENT_ID:
        raise BadInput(f"bad {what} {str(value)[:40]}: an event id, 0 to {MAX_EVENT_ID}")
    return value


def canonical(data: Mapping[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def mask_argv(argv: Sequence[str], values: Iterable[str],
              patterns: Iterable[re.Pattern[str]] = ()) -> list[str]:
    """`argv` with every occurrence of these secret values, then every match of these
    patterns, replaced by `***`, inside any element. The longest value first, so one that
    contains another is masked whole; empty values are skipped (they occur everywhere)."""
    known = sorted({v for v in values if v}, key=len, reverse=True)
    rules = [re.compile("|".join(map(re.escape, known)))] if known else []
    rules += list(patterns)
    masked = []
    for arg in argv:
        for rule in rules:
            arg = rule.sub(MASK, arg)
        masked.append(arg)
    return masked


def event_hash(row: Mapping[str, Any]) -> str:
    """The hash covers every field but `hash` itself, including the id and `prev_hash`."""
    body = {k: row[k] for k in ("id", "time", "sandbox_id", "type", "actor", "reason",
                                "payload_json", "prev_hash")}
    return hashlib.sha256(canonical(body).encode()).hexdigest()


def append(
    conn: Connection,
    *,
    time: str,
    type: str,
    actor: str,
    sandbox_id: str | None = None,
    reason: str | None = None,
    payload: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Append one event. Call inside a write transaction; the chain is serialised here."""
    serialise(conn, LOCK_EVENT_CHAIN)
    last = conn.execute(_HEAD).first()
    row: dict[str, Any] = {
        "id": (last.id + 1) if last else 1,
        "time": time,
        "sandbox_id": sandbox_id,
        "type": type,
        "actor": actor,
        "reason": reason,
        "payload_json": canonical(payload or {}),
        "prev_hash": last.hash if last else GENESIS,
    }
    row["hash"] = event_hash(row)
    conn.execute(_APPEND, row)
    conn.info[HEAD_KEY] = (row["id"], row["hash"])  # the anchor is moved after commit
    return row


@dataclass(frozen=True)
class ChainReport:
    checked: int
    broken_at: int | None = None
    problem: str | None = None

    @property
    def intact(self) -> bool:
        return self.broken_at is None


def verify(rows: Iterator[Mapping[str, Any]],
           anchor: tuple[int, str] | None = None) -> ChainReport:
    """Walk the chain in id order; name the first link that does not hold, and check the
    chain reaches the anchor with the same hash."""
    prev_hash, prev_id, count = GENESIS, 0, 0
    for row in rows:
        if anchor is not None and row["id"] == anchor[0] and row["hash"] != anchor[1]:
            return ChainReport(count, row["id"], "it differs from the anchored head of the log")
        if row["id"] != prev_id + 1:
            return ChainReport(count, row["id"], f"event(s) {prev_id + 1}..{row['id'] - 1} are missing")
        if row["prev_hash"] != prev_hash:
            return ChainReport(count, row["id"], "prev_hash does not match the event before it")
        if event_hash(row) != row["hash"]:
            return ChainReport(count, row["id"], "its content was changed after it was written")
        prev_hash, prev_id, count = row["hash"], row["id"], count + 1
    if anchor is not None and prev_id < anchor[0]:
        return ChainReport(count, prev_id + 1,
                           f"event(s) {prev_id + 1}..{anchor[0]} were cut from the end of the log")
    return ChainReport(count)

