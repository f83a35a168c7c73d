"""Tenants: whose sandboxes, checkpoints and events an operation may see (docs/security.md,
"Tenants"). The one rule: while settings.TENANT names an owner (a service request made with a
read or write key), every lookup and listing is narrowed to that owner's records, and a record
of another owner is not found, exactly as if it did not exist. None (the local user, an admin
key) sees every owner's.

Per-tenant quotas (the `tenants` table, set by an admin) bound what an owner may hold at once.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sandboxer.core.rules import settings
from sandboxer.core.rules.errors import NotFound, QuotaExceeded

if TYPE_CHECKING:  # `sbx ls` reads current() and loads no SQLAlchemy (tests/packaging/test_import_hygiene.py)
    import sqlalchemy as sa


def current() -> str | None:
    """The owner the running operation is narrowed to, or None (sees all)."""
    return settings.TENANT.get()


def owned(table: sa.Table) -> sa.ColumnElement[bool] | None:
    """The WHERE clause that narrows `table` (with an `owner` column) to the tenant, or None."""
    tenant = current()
    return None if tenant is None else table.c.owner == tenant


def narrow(query: sa.Select, table: sa.Table) -> sa.Select:
    clause = owned(table)
    return query if clause is None else query.where(clause)


def check(row: Mapping[str, Any], what: str, ref: str) -> Mapping[str, Any]:
    """`row` when the tenant may see it; NotFound (the same words as a missing one) if not."""
    tenant = current()
    if tenant is not None and row.get("owner") != tenant:
        raise NotFound(f"no {what} {ref!r}")
    return row


def owner_for(asked: str | None) -> str | None:
    """The owner a create records: the tenant's own (a tenant cannot record another owner:
    the service refuses that with 403 before it gets here), else what was asked."""
    tenant = current()
    return tenant if tenant is not None else asked


# -- quotas -------------------------------------------------------------------------------


def quotas(conn: sa.Connection, owner: str) -> Mapping[str, Any] | None:
    return conn.execute(_quotas_statement(), {"owner": owner}).mappings().first()


@functools.cache
def _quotas_statement() -> sa.TextClause:
    """Text, built once: every exec reads it, and a process compiles a Core statement the
    first time it runs it (core/store/refs.py `by_id`)."""
    import sqlalchemy as sa

    from sandboxer.core.store.models import Tenant
    from sandboxer.core.store.refs import columns_of

    table = Tenant.__table__
    return sa.text(f"SELECT {columns_of(table)} FROM {table.name} WHERE owner = :owner")


def check_ttl(limits: Mapping[str, Any] | None, owner: str, ttl: timedelta) -> None:
    """A TTL longer than the tenant's longest is refused (the profile's own max still holds)."""
    longest = None if limits is None else limits.get("max_ttl_s")
    if longest is not None and ttl.total_seconds() > longest:
        from sandboxer.core.rules.durations import format_duration

        raise QuotaExceeded(f"tenant {owner!r}: a TTL of {format_duration(ttl)} is past its "
                            f"quota max_ttl of {format_duration(timedelta(seconds=longest))}")


def check_live(conn: sa.Connection, limits: Mapping[str, Any] | None, owner: str,
               table: sa.Table, live_states: Iterable[str]) -> None:
    """One more live sandbox would pass the tenant's max_sandboxes: refused."""
    most = None if limits is None else limits.get("max_sandboxes")
    if most is None:
        return
    import sqlalchemy as sa

    held = conn.execute(sa.select(sa.func.count()).select_from(table).where(
        table.c.owner == owner, table.c.state.in_([str(s) for s in live_states]))).scalar() or 0
    if held >= most:
        raise QuotaExceeded(f"tenant {owner!r} holds {held} live sandboxes: its quota "
                            f"max_sandboxes is {most}")
