"""Creates made under an `Idempotency-Key` (docs/service.md, "Idempotent creates").

The first request with a key claims it, with a digest of what it asked for and the process
that holds the claim. The claim is bound to the sandbox in the same transaction that records
the sandbox (or hands out a warm pool member), before the backend is called: whatever
crashes after that, a retry with the same key gets that one sandbox, or its failure, never a
second one. The same key with another request is refused; one still in progress is a
conflict. A claim whose process died (sandboxer.core.rules.states.holder_gone) is taken over at once, one
whose holder cannot be checked (another host) after the lease time, as leases are.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sandboxer.core.rules.catalog import EventType
from sandboxer.core.rules.clock import from_iso, to_iso
from sandboxer.core.rules.errors import BadInput, Conflict, OperationFailed
from sandboxer.core.rules.failpoints import failpoint
from sandboxer.core.rules.states import State, holder_alive, holder_gone
from sandboxer.core.store.models import IdempotencyKey

if TYPE_CHECKING:
    from sandboxer.core.lifecycle.manager import Manager

KEYS = IdempotencyKey.__table__
MAX_KEY = 255
KEEP = timedelta(hours=24)  # a key may be reused for another request after this long


def _in_progress() -> Conflict:
    return Conflict("a request with this Idempotency-Key is still in progress; retry when it "
                    "has finished")


class KeyReused(BadInput):
    """The key was first used with another request (HTTP 422)."""


def request_digest(request: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(request, sort_keys=True, default=str).encode()).hexdigest()


def check_key(key: str) -> str:
    if not key or len(key) > MAX_KEY or not key.isascii() or not key.isprintable():
        raise BadInput(f"bad Idempotency-Key: printable ASCII, 1 to {MAX_KEY} characters")
    return key


@dataclass(frozen=True)
class Claim:
    """A key one request holds: `bind` ties it to the sandbox the create records. `since`
    (when it was claimed) tells this request's claim from a later one of the same process."""

    principal: str
    key: str
    holder: str
    since: str

    def _where(self) -> sa.ColumnElement[bool]:
        return sa.and_(KEYS.c.principal == self.principal, KEYS.c.key == self.key)

    def _mine(self) -> sa.ColumnElement[bool]:
        return sa.and_(self._where(), KEYS.c.holder == self.holder,
                       KEYS.c.created_at == self.since)

    def bind(self, conn: Connection, sandbox_id: str) -> None:
        """Inside the transaction that records `sandbox_id`: a claim another request took
        over (this one was thought dead) is a Conflict, and nothing is recorded. The same
        request binds again when a warm member it was bound to fell through."""
        bound = conn.execute(KEYS.update().where(self._mine()).values(sandbox_id=sandbox_id))
        if bound.rowcount != 1:
            raise Conflict("another request with this Idempotency-Key took it over; retry to "
                           "get its sandbox")


def claim(conn: Connection, principal: str, key: str, digest: str, *, now: str,
          lapse: timedelta, holder: str, install_id: str) -> Claim | str:
    """The sandbox an earlier request with this key is bound to, or a new Claim for this
    request. KeyReused for another request, Conflict while one is in progress."""
    check_key(key)
    moment = from_iso(now)
    mine = Claim(principal, key, holder, now)
    where = mine._where()
    conn.execute(KEYS.delete().where(KEYS.c.created_at < to_iso(moment - KEEP)))
    row = conn.execute(sa.select(KEYS).where(where).with_for_update()).mappings().first()
    if row is None:
        try:  # two first requests at once (PostgreSQL): one inserts, the other is refused
            conn.execute(KEYS.insert().values(principal=principal, key=key,
                                              request_hash=digest, sandbox_id=None,
                                              created_at=now, holder=holder))
        except sa.exc.IntegrityError:
            raise _in_progress() from None
        return mine
    if row["request_hash"] != digest:
        raise KeyReused("this Idempotency-Key was used with another request; use a new key "
                        "for a new request")
    if row["sandbox_id"] is not None:
        return row["sandbox_id"]
    if holder_alive(row["holder"], install_id) or (
            not holder_gone(row["holder"], install_id)
            and from_iso(row["created_at"]) + lapse > moment):
        raise _in_progress()
    # its request died before anything was recorded: this one goes on in its place
    conn.execute(KEYS.update().where(where).values(created_at=now, holder=holder))
    return mine


def release(conn: Connection, held: Claim) -> None:
    """The request failed before it recorded a sandbox: the key may be used again."""
    conn.execute(KEYS.delete().where(held._mine(), KEYS.c.sandbox_id.is_(None)))


async def create_once(mgr: Manager, principal: str, key: str, asked: Mapping[str, Any],
                      create: Callable[..., Any]) -> dict[str, Any]:
    """`create(bind=...)` run at most once for `key` of `principal`; a retry gets the sandbox
    the first run recorded (settling it first if its maker died mid-create), or its failure.
    `asked` is the request as the digest sees it."""
    with mgr.db.write() as conn:
        held = claim(conn, principal, key, request_digest(asked), now=mgr.now_iso(),
                     lapse=mgr.lease_ttl, holder=mgr.lease_owner, install_id=mgr.install_id)
    if isinstance(held, str):
        return await _answer_for(mgr, held)
    failpoint("idempotency.after-claim")
    try:
        return await create(bind=held.bind)
    except BaseException:
        with mgr.db.write() as conn:  # gone if the sandbox was recorded (bound): kept then
            release(conn, held)
        raise


async def _answer_for(mgr: Manager, sandbox_id: str) -> dict[str, Any]:
    """What a retry gets: the bound sandbox as it stands, once its create has settled."""
    row = mgr.resolve(sandbox_id)
    if row["state"] == State.CREATING:
        if mgr.leases.held_by_another(row) or holder_alive(row["lease_owner"],
                                                            mgr.install_id):
            raise _in_progress()  # this process's own request, or another's, still at it
        row = await mgr.settle_interrupted_create(row)
    # the reaper may be ending it right now (a failed create is destroyed): still a failure
    if row["state"] == State.FAILED or (row["state"] in (State.DESTROYING, State.DESTROYED)
                                        and _ended_failed(mgr, row)):
        why = row["error"] or "it never started"
        raise OperationFailed(f"create failed on {row['backend']}: {why} (sandbox {row['id']}); "
                              "use a new Idempotency-Key to try again")
    return row


def _ended_failed(mgr: Manager, row: Mapping[str, Any]) -> bool:
    """A destroyed sandbox whose create failed: it never started, or it was ended for a
    failure (its setup), not destroyed later by someone."""
    return row["started_at"] is None or any(
        e["type"] == EventType.SANDBOX_DESTROYING and e["reason"] == "failed"
        for e in mgr.events(row["id"]))
