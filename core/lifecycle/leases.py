"""The lease, intent and fence protocol: the one primitive every operation on a sandbox
follows, sandbox operations and checkpoints alike (docs/design.md, "How an operation runs").

1. `begin` (a transition) or `take` (the lease alone): a short write transaction checks the
   state, takes the sandbox's lease by compare-and-set and returns its fence token, with the
   intent and its event recorded beside it.
2. The backend call runs outside any transaction, under `holding`, which renews the lease so a
   live process is never taken over.
3. `finish` (the result and its event, fenced by the token) or `give_back` / `release`: a
   stale holder, whose lease another process took over, cannot commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sandboxer.core.rules.catalog import EventType
from sandboxer.core.rules.clock import Clock, to_iso
from sandboxer.core.rules.errors import Conflict, DiskFull, LeaseLost, NotDue, NotFound, storable
from sandboxer.core.rules.states import State, entry_events, held, transition_event
from sandboxer.core.store.db import Database
from sandboxer.core.store.models import Event, Sandbox

SANDBOXES = Sandbox.__table__
EVENTS = Event.__table__
EventWriter = Callable[..., None]

# Built once: every operation runs these (a statement built per call cost SQLAlchemy about
# as long again as SQLite's work on it). Bound names are b_*: SQLAlchemy keeps column names for what an update sets.
_ONE = SANDBOXES.c.id == sa.bindparam("b_id")
_ROW = sa.select(SANDBOXES).where(_ONE).with_for_update()
_ROW_UNLESS_LOCKED = sa.select(SANDBOXES).where(_ONE).with_for_update(skip_locked=True)
_FENCED = SANDBOXES.update().where(_ONE, SANDBOXES.c.fence == sa.bindparam("b_fence"))
_TAKE = _FENCED.values(lease_owner=sa.bindparam("b_owner"), fence=SANDBOXES.c.fence + 1,
                       lease_expires_at=sa.bindparam("b_until")).returning(SANDBOXES.c.fence)
_BEGIN = _TAKE.values(state=sa.bindparam("b_state"))
_FINISH = _FENCED.returning(SANDBOXES)  # what it sets comes with the parameters


@dataclass(frozen=True)
class Lease:
    sandbox_id: str
    fence: int
    reason: str | None = None  # the reason recorded with the intent


def making_room(step: Callable[..., Any]) -> Callable[..., Any]:
    """For a step that ends a sandbox or records what the backend already did (one
    transaction, so safe to run again): on a full disk, release the reserve (sandboxer.core.rules.reserve)
    and try once more. Leaving a sandbox running, or a container unrecorded, because the
    disk is full costs more than the space."""
    @functools.wraps(step)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return step(self, *args, **kwargs)
        except DiskFull:
            if not self.db.release_reserve():
                raise
            return step(self, *args, **kwargs)

    return run




class Leases:
    """The protocol on one database, for one lease owner (a process's Manager)."""

    def __init__(self, db: Database, clock: Clock, *, owner: str, ttl: timedelta,
                 install_id: str, event: EventWriter) -> None:
        self.db = db
        self.clock = clock
        self.owner = owner
        self.ttl = ttl
        self.install_id = install_id
        self.event = event  # writes one event inside the given transaction
        # begin_together's callers waiting for one commit, by the loop they wait on (a loop
        # stopped with its commit still queued must not hold up the next loop's callers)
        self._together: dict[asyncio.AbstractEventLoop, list[tuple]] = {}

    def held_by_another(self, row: Mapping[str, Any]) -> bool:
        """Another live process holds the row's lease (a dead one of this host holds none)."""
        return held(row, to_iso(self.clock.now()), self.install_id)

    @making_room
    def begin(self, sandbox_id: str, intent: State,
               *, reason: str | None | Callable[[Mapping[str, Any]], str | None],
               payload: Mapping[str, Any] | None = None,
               precondition: Callable[[Mapping[str, Any]], str | None] | None = None,
               ) -> tuple[Lease, dict[str, Any]]:
        """Step 1: check the state, take the lease, record the intent and its event.

        `precondition(row)` is re-checked inside this transaction (the reaper passes "still
        expired"); when it returns a reason not to go on, NotDue is raised and nothing written.
        A callable `reason(row)` gives the reason true inside the transaction.
        """
        with self.db.write() as conn:
            return self._begin_in(conn, sandbox_id, intent, reason=reason, payload=payload,
                                  precondition=precondition)

    async def begin_together(self, sandbox_id: str, intent: State,
                             *, reason: str | None | Callable[[Mapping[str, Any]], str | None],
                             precondition: Callable[[Mapping[str, Any]], str | None] | None = None,
                             ) -> tuple[Lease, dict[str, Any]]:
        """`begin`, in one transaction with every other `begin_together` asked in the same
        turn of the event loop: a reaper's N intents take one commit, so its N backend calls
        leave together instead of one commit apart (docs/design.md, "What a reap of due
        sandboxes costs"). Each outcome is its own: one that is not due changes nothing for
        the others. A caller cancelled before the commit has no intent written; one cancelled
        after it, before it could go on, gives its lease back (`release`: the intent stays
        for the next cycle), as it would had the cancel reached its backend call."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future = loop.create_future()
        queue = self._together.setdefault(loop, [])
        if not queue:
            for closed in [other for other in self._together if other.is_closed()]:
                del self._together[closed]  # its callers went with it
            loop.call_soon(self._begin_queued, loop)
        queue.append((waiter, sandbox_id, intent, reason, precondition))
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                with contextlib.suppress(Exception):  # else its lease lapses; the cancel goes on
                    self.release(waiter.result()[0], "cancelled before its backend call")
            raise

    def _begin_queued(self, loop: asyncio.AbstractEventLoop) -> None:
        queued = [item for item in self._together.pop(loop, []) if not item[0].cancelled()]
        outcomes: list[Any] = []
        try:
            try:
                outcomes = self._begin_all([item[1:] for item in queued])
            except Exception:  # the shared transaction failed: each alone, with its own error
                for _, sandbox_id, intent, reason, precondition in queued:
                    try:
                        outcomes.append(self.begin(sandbox_id, intent, reason=reason,
                                                   precondition=precondition))
                    except Exception as exc:
                        outcomes.append(exc)
        except BaseException as exc:
            # never leave a caller waiting; one whose intent was written alone before this
            # gets its lease, which it gives back as it is cancelled (begin_together)
            for n, (waiter, *_) in enumerate(queued):
                if waiter.done():
                    continue
                if n < len(outcomes) and not isinstance(outcomes[n], Exception):
                    waiter.set_result(outcomes[n])
                else:
                    waiter.set_exception(exc)
            raise
        for (waiter, *_), outcome in zip(queued, outcomes, strict=True):
            if waiter.done():
                continue
            if isinstance(outcome, Exception):
                waiter.set_exception(outcome)
            else:
                waiter.set_result(outcome)

    @making_room
    def _begin_all(self, items: list[tuple]) -> list[tuple[Lease, dict[str, Any]] | Exception]:
        """The intents of `items` in one write transaction; a sandbox not found, not due or
        busy is its outcome, raised before anything of it is written."""
        outcomes: list[tuple[Lease, dict[str, Any]] | Exception] = []
        with self.db.write() as conn:
            for sandbox_id, intent, reason, precondition in items:
                try:
                    outcomes.append(self._begin_in(conn, sandbox_id, intent, reason=reason,
                                                   precondition=precondition))
                except (NotFound, Conflict) as exc:
                    outcomes.append(exc)
        return outcomes

    def _begin_in(self, conn: Connection, sandbox_id: str, intent: State, *,
                  reason: str | None | Callable[[Mapping[str, Any]], str | None],
                  payload: Mapping[str, Any] | None = None,
                  precondition: Callable[[Mapping[str, Any]], str | None] | None = None,
                  ) -> tuple[Lease, dict[str, Any]]:
        """`begin` inside `conn`. Every refusal (NotFound, Conflict and its kinds) is raised
        before anything is written, which `_begin_all` relies on."""
        # The reaper (a precondition) skips a row another process has locked right now;
        # everyone else waits the few milliseconds for it (PostgreSQL; SQLite has one writer).
        row = conn.execute(_ROW if precondition is None else _ROW_UNLESS_LOCKED,
                           {"b_id": sandbox_id}).mappings().first()
        if row is None and precondition is not None and conn.execute(
                sa.select(SANDBOXES.c.id).where(SANDBOXES.c.id == sandbox_id)).first():
            raise NotDue(f"sandbox {sandbox_id}: another process is acting on it")
        if row is None:
            raise NotFound(f"no sandbox {sandbox_id!r}")
        if precondition is not None:
            why_not = precondition(row)
            if why_not:
                raise NotDue(f"sandbox {sandbox_id}: {why_not}")
        current = State(row["state"])
        resuming = current == intent  # completing an interrupted intent
        if callable(reason):
            reason = reason(row)
        if resuming and reason is None:  # carry on with the interrupted intent's reason
            reason = conn.execute(
                sa.select(EVENTS.c.reason)
                .where(EVENTS.c.sandbox_id == sandbox_id,
                       EVENTS.c.type.in_(entry_events(intent)))
                .order_by(EVENTS.c.id.desc()).limit(1)
            ).scalar()
        if not resuming:
            transition_event(current, intent)  # IllegalTransition when not allowed
        if self.held_by_another(row):
            raise Conflict(
                f"sandbox {sandbox_id} is busy: {row['lease_owner']} holds it "
                f"until {row['lease_expires_at']}"
            )
        fence = conn.execute(_BEGIN, {
            "b_id": sandbox_id, "b_fence": row["fence"], "b_state": intent,
            "b_owner": self.owner, "b_until": to_iso(self.clock.now() + self.ttl)}).scalar()
        if fence is None:
            raise Conflict(f"sandbox {sandbox_id} changed under us; try again")
        if not resuming:
            self.event(conn, sandbox_id, transition_event(current, intent),
                        reason=reason, payload=payload)
        return Lease(sandbox_id, fence, reason), dict(row)

    def take(self, sandbox_id: str, states: frozenset[State] | set[State], verb: str,
              conn: Connection | None = None) -> Lease:
        """The lease alone, for an action that is not a transition yet (snapshot, pause):
        nobody destroys the sandbox under it. IllegalTransition-like Conflict otherwise.
        Inside `conn` when given (with what the caller records beside it), else in its own
        transaction."""
        if conn is None:
            with self.db.write() as conn:
                return self.take(sandbox_id, states, verb, conn)
        row = conn.execute(_ROW, {"b_id": sandbox_id}).mappings().first()
        if row is None:
            raise NotFound(f"no sandbox {sandbox_id!r}")
        if row["state"] not in states:
            raise Conflict(f"sandbox {sandbox_id} is {row['state']}: cannot {verb}")
        if self.held_by_another(row):
            raise Conflict(f"sandbox {sandbox_id} is busy: {row['lease_owner']} holds it "
                           f"until {row['lease_expires_at']}")
        fence = conn.execute(_TAKE, {
            "b_id": sandbox_id, "b_fence": row["fence"], "b_owner": self.owner,
            "b_until": to_iso(self.clock.now() + self.ttl)}).scalar()
        if fence is None:
            raise Conflict(f"sandbox {sandbox_id} changed under us; try again")
        return Lease(sandbox_id, fence)

    def give_back(self, lease: Lease, conn: Connection | None = None) -> None:
        """Release a lease `take` took; inside `conn` when given, else in its own transaction."""
        if conn is None:
            with self.db.write() as conn:
                self.give_back(lease, conn)
            return
        conn.execute(SANDBOXES.update().where(
            SANDBOXES.c.id == lease.sandbox_id, SANDBOXES.c.fence == lease.fence,
            SANDBOXES.c.lease_owner == self.owner,
        ).values(lease_owner=None, lease_expires_at=None))

    @making_room
    def finish(self, lease: Lease, result: State, *, values: Mapping[str, Any] | None = None,
                reason: str | None = None, payload: Mapping[str, Any] | None = None,
                ) -> dict[str, Any]:
        """Step 3: record the result and its event, fenced by the token; release the lease."""
        with self.db.write() as conn:
            row = conn.execute(_ROW, {"b_id": lease.sandbox_id}).mappings().first()
            if row is None or row["fence"] != lease.fence or row["lease_owner"] != self.owner:
                raise LeaseLost(
                    f"sandbox {lease.sandbox_id}: another process took it over; "
                    "this result was not recorded"
                )
            event_type = transition_event(row["state"], result) if row["state"] != result else None
            values = dict(values or {})
            if values.get("error"):  # a backend's or a command's words
                values["error"] = storable(values["error"])
            updated = conn.execute(_FINISH, {
                "b_id": lease.sandbox_id, "b_fence": lease.fence, "state": result,
                "lease_owner": None, "lease_expires_at": None, **values}
            ).mappings().first()
            if event_type:
                self.event(conn, lease.sandbox_id, event_type, reason=reason, payload=payload)
            return dict(updated)

    @making_room
    def release(self, lease: Lease, error: str) -> None:
        """Give the lease back after a failed backend call, recording why; the intent stays
        for the next attempt (a retry or reconcile)."""
        error = storable(error)
        with self.db.write() as conn:
            released = conn.execute(
                SANDBOXES.update()
                .where(SANDBOXES.c.id == lease.sandbox_id, SANDBOXES.c.fence == lease.fence,
                       SANDBOXES.c.lease_owner == self.owner)
                .values(lease_owner=None, lease_expires_at=None, error=error)
            ).rowcount
            if released:
                self.event(conn, lease.sandbox_id, EventType.SANDBOX_ATTEMPT_FAILED, reason=lease.reason,
                            payload={"error": error})

    @contextlib.asynccontextmanager
    async def holding(self, lease: Lease) -> AsyncIterator[None]:
        """Keep the lease alive while a backend call runs (a slow image pull, say): a live
        process is never taken over; a dead or stopped one is, once its lease lapses."""
        async def renew() -> None:
            while True:
                await asyncio.sleep(self.ttl.total_seconds() / 3)
                with self.db.write() as conn:
                    kept = conn.execute(
                        SANDBOXES.update()
                        .where(SANDBOXES.c.id == lease.sandbox_id,
                               SANDBOXES.c.fence == lease.fence,
                               SANDBOXES.c.lease_owner == self.owner)
                        .values(lease_expires_at=to_iso(self.clock.now() + self.ttl))
                    ).rowcount
                if not kept:
                    return  # taken over: the fence will refuse our result

        task = asyncio.create_task(renew())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
