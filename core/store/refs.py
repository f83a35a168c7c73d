"""How a reference names a sandbox or a checkpoint, in one place: the whole id, a name, or a
unique id prefix (with or without the `sbx-` / `ckpt-` prefix), in that order.

Within a tenant (core/store/tenancy.py) only that owner's records are looked at: another owner's
record is not found, as if it did not exist.

A name is explicit, so a live record of that name wins over an id prefix that happens to
match; records of that name that have all ended come after a matching id prefix. Among records
of one name the newest wins. A prefix is matched literally: `_` and `%` in it are characters,
not wildcards.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sandboxer.core.rules.errors import BadInput, NotFound


def like_prefix(text: str) -> str:
    """`text` as a LIKE pattern matching itself followed by anything (escape `\\`)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def columns_of(table: sa.Table) -> str:
    """A table's columns, named in the order a Core select of it reads them."""
    return ", ".join(column.name for column in table.columns)


@functools.cache
def by_id(table: sa.Table) -> sa.TextClause:
    """One statement per table, built once: most references are whole ids. Text: a process
    compiles a Core statement the first time it runs it (about 2 ms for this one), and a
    one-shot command (`sbx exec`) runs it once."""
    return sa.text(f"SELECT {columns_of(table)} FROM {table.name} WHERE id = :id")


def whole_id(ref: str, id_prefix: str) -> str:
    """The id `ref` is if it is a whole id (with or without its prefix): the first thing
    `resolve` tries."""
    lowered = ref.strip().lower()
    return lowered if lowered.startswith(id_prefix) else id_prefix + lowered


def resolve(conn: Connection, table: sa.Table, ref: str, *, id_prefix: str, what: str,
            live: Callable[[Mapping[str, Any]], bool] = lambda row: True) -> dict[str, Any]:
    """The one row `ref` names; NotFound when none, BadInput when empty or ambiguous."""
    from sandboxer.core.store import tenancy

    text = ref.strip()
    if not text:
        raise BadInput(f"empty {what} id")
    if not text.isprintable():
        raise NotFound(f"no {what} {ref!r}")  # a NUL or a control character names nothing
    full = whole_id(text, id_prefix)
    exact = conn.execute(by_id(table), {"id": full}).mappings().first()
    if exact and (tenancy.current() is None or exact["owner"] == tenancy.current()):
        return dict(exact)
    named = conn.execute(tenancy.narrow(sa.select(table).where(table.c.name == text), table)
                         .order_by(table.c.created_at.desc())).mappings().all()
    alive = [r for r in named if live(r)]
    if alive:
        return dict(alive[0])
    by_prefix = conn.execute(tenancy.narrow(sa.select(table).where(
        table.c.id.like(like_prefix(full), escape="\\")), table)).mappings().all()
    if not by_prefix:
        if named:  # only ended ones bear the name: the newest
            return dict(named[0])
        raise NotFound(f"no {what} {ref!r}")
    if len(by_prefix) > 1:
        ids = ", ".join(sorted(r["id"] for r in by_prefix)[:5])
        raise BadInput(f"{what} {ref!r} is ambiguous: it matches {ids}")
    return dict(by_prefix[0])
