"""Reading the inventory with plain SQL on a DB-API connection, no ORM.

`sbx ls` must answer in a fraction of a second from a fresh process; importing the ORM alone
costs more than that. So listing is one SQL builder used two ways: by the Manager on its
SQLAlchemy connection, and by `sbx ls` on a read-only connection of the driver itself
(stdlib sqlite3, or psycopg for PostgreSQL) when the schema is current (otherwise `sbx ls`
takes the Manager's path, which migrates).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sandboxer.core.rules.errors import BadInput
from sandboxer.core.rules.states import RESTARTED_EVENT, State
from sandboxer.core.store.migrations import SCHEMA_HEAD


def parse_state(state: str) -> State:
    try:
        return State(state)
    except ValueError:
        raise BadInput(
            f"bad state {state!r} (one of {', '.join(s.value for s in State)})"
        ) from None


def list_sandboxes(
    dbapi_conn: Any,
    *,
    include_all: bool = False,
    state: str | None = None,
    backend: str | None = None,
    labels: Mapping[str, str] | None = None,
    placeholder: str = "?",
    columns: tuple[str, ...] | None = None,
    after: tuple[str, str] | None = None,
    limit: int | None = None,
    pool_members: bool = True,
    owner: str | None = None,
    as_tuples: bool = False,
) -> list[Any]:
    """Sandboxes, oldest first: not destroyed unless `include_all` or a `state` is given.
    `columns` narrows what is fetched (every column by default). `after` (created_at, id)
    and `limit` give one page (see page_cursor). `pool_members=False`: users' sandboxes
    only, without the warm pool members nobody has claimed (sandboxer.core.pools). `owner`: that
    tenant's only (core/store/tenancy.py). `as_tuples`: each row as the driver's tuple, in
    `columns`' order, not a dict (a listing's views are made from them: views.sandbox_views)."""
    where, params = [], []
    if owner is not None:
        where.append(f"owner = {placeholder}")
        params.append(owner)
    if not pool_members:
        where.append("(pool IS NULL OR launch IS NOT NULL)")
    if after is not None:
        where.append(f"(created_at > {placeholder} OR (created_at = {placeholder} "
                     f"AND id > {placeholder}))")
        params += [after[0], after[0], after[1]]
    if state:
        where.append(f"state = {placeholder}")
        params.append(parse_state(state).value)
    elif not include_all:
        where.append(f"state <> {placeholder}")
        params.append(State.DESTROYED.value)
    if backend:
        where.append(f"backend = {placeholder}")
        params.append(backend)
    sql = f"SELECT {', '.join(columns) if columns else '*'} FROM sandboxes"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY created_at, id"
    if limit is not None and not labels:  # labels are matched below, so no LIMIT then
        sql += f" LIMIT {int(limit)}"
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(sql, params)
        names = [d[0] for d in cursor.description]
        rows: list[Any] = cursor.fetchall()
    finally:
        cursor.close()
    if labels:
        wanted, at = dict(labels).items(), names.index("labels_json")
        rows = [r for r in rows if wanted <= json.loads(r[at] or "{}").items()]
    if limit is not None:
        rows = rows[:limit]
    return rows if as_tuples else [dict(zip(names, r, strict=True)) for r in rows]


MAX_PAGE = 1000


def page_cursor(row: Mapping[str, Any]) -> str:
    """An opaque cursor for the page after `row` (a sandbox's created_at and id)."""
    import base64

    return base64.urlsafe_b64encode(json.dumps([row["created_at"], row["id"]]).encode()
                                    ).decode().rstrip("=")


def parse_page(cursor: str | None, limit: int | None) -> tuple[tuple[str, str] | None, int]:
    """(`after` for list_sandboxes, the page size): BadInput for a cursor this module did not
    make or a size out of 1..MAX_PAGE."""
    import base64

    if limit is None:
        limit = 100
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise BadInput(f"bad limit {limit!r}: a page holds 1 to {MAX_PAGE} sandboxes")
    if cursor is None:
        return None, limit
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, sandbox_id = json.loads(raw)
        if not (isinstance(created, str) and isinstance(sandbox_id, str)):
            raise ValueError
    except (ValueError, TypeError, UnicodeDecodeError):
        raise BadInput(f"bad cursor {cursor[:40]!r}: give the next_cursor of the page "
                       "before") from None
    return (created, sandbox_id), limit


def open_sqlite_readonly(url: str, *, any_thread: bool = False) -> sqlite3.Connection | None:
    """A read-only connection when `url` is a current SQLite database; None otherwise.
    `any_thread`: usable from any thread (the caller serialises its use)."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        return None
    path = Path(url[len(prefix):])
    if not path.is_file():
        return None
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30,
                               check_same_thread=not any_thread)
        version = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        return None
    if version is None or version[0] != SCHEMA_HEAD:
        conn.close()
        return None
    return conn


def open_postgres_readonly(url: str) -> Any | None:
    """A read-only psycopg connection when `url` is a current PostgreSQL database. libpq
    reads the URL itself once SQLAlchemy's `+driver` is taken off its scheme."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.split("+")[0] != "postgresql":
        return None
    try:
        import psycopg
    except ImportError:
        return None
    try:
        conn = psycopg.connect(f"postgresql://{rest}", connect_timeout=10, autocommit=True)
        conn.read_only = True
        version = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    except psycopg.Error:
        return None
    if version is None or version[0] != SCHEMA_HEAD:
        conn.close()
        return None
    return conn


def open_readonly(url: str) -> tuple[Any, str] | None:
    """(a read-only DB-API connection, its parameter placeholder) when `url` is a current
    SQLite or PostgreSQL database; None otherwise (take the Manager's path)."""
    conn = open_sqlite_readonly(url)
    if conn is not None:
        return conn, "?"
    conn = open_postgres_readonly(url)
    return (conn, "%s") if conn is not None else None


def rows_by_ids(dbapi_conn: Any, ids: list[str], placeholder: str = "?") -> dict[str, dict]:
    if not ids:
        return {}
    marks = ", ".join([placeholder] * len(ids))
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(f"SELECT * FROM sandboxes WHERE id IN ({marks})", list(ids))
        names = [d[0] for d in cursor.description]
        return {r[0]: dict(zip(names, r, strict=True)) for r in cursor.fetchall()}
    finally:
        cursor.close()


def restarts_seen(dbapi_conn: Any, ids: list[str], placeholder: str = "?") -> dict[str, str]:
    """For each of these sandboxes with a `sandbox.restarted` event, the backend start time
    the last one recorded (reconcile records each restart once)."""
    if not ids:
        return {}
    marks = ", ".join([placeholder] * len(ids))
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(f"SELECT sandbox_id, payload_json FROM events WHERE type = {placeholder} "
                       f"AND sandbox_id IN ({marks}) ORDER BY id", [RESTARTED_EVENT, *ids])
        found = cursor.fetchall()
    finally:
        cursor.close()
    return {sid: json.loads(payload or "{}").get("backend_started_at") for sid, payload in found}


def read_fast(url: str, **filters: Any) -> list[dict[str, Any]] | None:
    """The inventory through a read-only driver connection, or None when the database is
    not current (then the Manager's path, which migrates, is the way)."""
    fast = open_readonly(url)
    if fast is None:
        return None
    conn, placeholder = fast
    try:
        return list_sandboxes(conn, placeholder=placeholder, **filters)
    finally:
        conn.close()


def list_checkpoints(dbapi_conn: Any) -> list[dict[str, Any]]:
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute("SELECT id, backend, state, created_at, expires_at, backend_ref "
                       "FROM checkpoints")
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]
    finally:
        cursor.close()


def due_volumes(dbapi_conn: Any, now: str, install: str, placeholder: str = "?") -> int:
    """How many of this installation's volumes are past their TTL (the reaper's volume
    step, core/lifecycle/volumes.py, runs only when some are)."""
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(f"SELECT COUNT(*) FROM volumes WHERE expires_at IS NOT NULL AND "
                       f"expires_at <= {placeholder} AND install_id = {placeholder}",
                       [now, install])
        return int(cursor.fetchone()[0])
    finally:
        cursor.close()


def count_sandboxes(dbapi_conn: Any, owner: str | None = None,
                    placeholder: str = "?") -> list[dict[str, Any]]:
    """How many sandboxes are in each (state, backend), destroyed ones included; `owner`:
    that tenant's only."""
    cursor = dbapi_conn.cursor()
    try:
        if owner is None:
            cursor.execute("SELECT state, backend, COUNT(*) FROM sandboxes "
                           "GROUP BY state, backend")
        else:
            cursor.execute(f"SELECT state, backend, COUNT(*) FROM sandboxes WHERE owner = "
                           f"{placeholder} GROUP BY state, backend", [owner])
        return [{"state": s, "backend": b, "count": n} for s, b, n in cursor.fetchall()]
    finally:
        cursor.close()


# -- what a reap cycle with nothing changed reads (core/reconcile/reaper.py) ----------------


_LIVE = f"state <> '{State.DESTROYED.value}'"
_SETTLED = ", ".join(f"'{s.value}'" for s in (State.RUNNING, State.PAUSED, State.WARM,
                                               State.DESTROYED))
# What a reap cycle between full looks reads, each part through a partial index of the rows
# it may read: name -> (column, the rows it holds). Migration 0018 made them; the Sandbox
# table (core/store/models.py) declares them from here; due_sandboxes states each condition
# word for word, as SQLite needs to use a partial index.
DUE_INDEXES = {
    "ix_sandboxes_live_deadline": ("deadline", _LIVE),
    "ix_sandboxes_unsettled": ("state", f"state NOT IN ({_SETTLED})"),
    "ix_sandboxes_live_pool": ("pool", f"pool IS NOT NULL AND {_LIVE}"),
    "ix_sandboxes_live_idle": ("idle_timeout_s", f"idle_timeout_s IS NOT NULL AND {_LIVE}"),
}


def due_sandboxes(dbapi_conn: Any, soon: str, placeholder: str = "?") -> list[dict[str, Any]]:
    """Every installation's rows a reap may act on by `soon` (now plus the expiry warning's
    lead): a live row with a deadline or an idle deadline by then, in a state other than
    running, paused or warm, or a warm pool's member. A superset: the reaper's pure planning
    decides. Each part is read through its partial index (DUE_INDEXES), so the read costs
    what may be due, not the fleet nor its history of destroyed sandboxes."""
    if placeholder == "?":
        idle = (f"julianday(last_activity_at) + idle_timeout_s / 86400.0 "
                f"<= julianday({placeholder}) + 1.0 / 86400")
    else:
        idle = (f"CAST(last_activity_at AS timestamptz) + idle_timeout_s * interval '1 second' "
                f"<= CAST({placeholder} AS timestamptz) + interval '1 second'")
    def held(index: str) -> str:  # the rows DUE_INDEXES says that index holds
        return DUE_INDEXES[index][1]

    parts = " UNION ".join(f"SELECT id FROM sandboxes WHERE {where}" for where in (
        f"deadline <= {placeholder} AND {held('ix_sandboxes_live_deadline')}",
        held("ix_sandboxes_unsettled"),
        held("ix_sandboxes_live_pool"),
        f"{held('ix_sandboxes_live_idle')} AND {idle}"))
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(f"SELECT * FROM sandboxes WHERE id IN ({parts})", [soon, soon])
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]
    finally:
        cursor.close()


def change_fingerprint(dbapi_conn: Any) -> list[Any]:
    """Changes whenever a sandbox row is added or removed or any column of it but the
    activity ones is written (the rows' count and their `reconcile_seq`, set by a trigger,
    migration 0017, summed and at most: an exec's mark of activity leaves it), or a
    checkpoint is added, removed, completed or given another expiry."""
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute("SELECT count(*), coalesce(sum(reconcile_seq), 0), "
                       "coalesce(max(reconcile_seq), 0) FROM sandboxes")
        sandboxes = [int(v) for v in cursor.fetchone()]
        cursor.execute("SELECT count(*), coalesce(sum(length(state)), 0), "
                       "coalesce(max(created_at), ''), coalesce(max(expires_at), '') "
                       "FROM checkpoints")
        count, states, made, expires = cursor.fetchone()
        return [*sandboxes, int(count), int(states), str(made), str(expires)]
    finally:
        cursor.close()
