"""The inventory for remote watchers, over the library's own watch (which reads only the rows
changed since its last look, sandboxer.core.follow.watch):

- `GET /v1/inventory/changes?since=POSITION`: the records changed and the ids gone since a
  position this service handed out, and the next position. What `watch()` over a service
  reads: a look at 10,000 sandboxes of which one changed sends one record.
- `GET /v1/inventory`: a conditional GET of the whole inventory, so a client that asks again
  with the ETag of its last answer is told "nothing changed" (304).

Each view (with destroyed sandboxes, without) keeps a generation, moved by each look that
found a change, and every record's generation of its last change (the ids gone, too, as
tombstones, a bounded number of them). A position is this run's id and a generation; one of
an earlier run, or older than the oldest tombstone kept, is answered with everything
(`reset`). A tenant's key sees its own sandboxes' changes only.

Why not the event stream: not every change a reader sees writes an event (activity from
following logs moves `last_activity_at` quietly), and a stream would make `read()` racy (a
change committed just before it might not have arrived yet)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
from collections import OrderedDict
from typing import Any

from sandboxer import AsyncInventoryWatch, AsyncSandboxer
from sandboxer.core.rules.errors import BadInput

TOMBSTONES = 10_000  # ids gone kept per view; a position older than the oldest is reset


class InventoryVersions:
    """One watch of the service's own per view (with destroyed sandboxes, without), read
    when a watcher asks; its generation moves only when a read found a change."""

    def __init__(self, client: AsyncSandboxer) -> None:
        self._client = client
        self._boot = secrets.token_hex(6)  # an ETag of an earlier run never matches
        self._watches: dict[bool, AsyncInventoryWatch] = {}
        self._generation: dict[bool, int] = {}
        self._items: dict[bool, tuple[int, list[dict[str, Any]]]] = {}  # (generation, records)
        self._lock = asyncio.Lock()
        self._closed = False
        self._tenant_items: dict[tuple[bool, str], list[dict[str, Any]]] = {}
        self._tenant_generation: dict[tuple[bool, str], int] = {}
        # per view, by id, oldest change first: (generation, record, or None when gone, owner)
        self._log: dict[bool, OrderedDict[str, tuple[int, dict[str, Any] | None, str]]] = {}
        self._floor: dict[bool, int] = {}  # positions before this are answered with everything
        self._gone: dict[bool, int] = {}  # tombstones in the log

    def etag(self, include_destroyed: bool, generation: int, tenant: str | None = None) -> str:
        view = "all" if include_destroyed else "live"
        if tenant is not None:  # a tenant's own generation: another's changes never move it
            view += "-t" + hashlib.sha256(tenant.encode()).hexdigest()[:12]
        return f'"inv-{self._boot}-{view}-{generation}"'

    async def current(self, include_destroyed: bool, tenant: str | None = None,
                      ) -> tuple[str, list[dict[str, Any]]]:
        """(the ETag, every sandbox of that view, oldest first) as of now; with `tenant`,
        that owner's sandboxes only (docs/security.md, "Tenants")."""
        etag, items = await self._everyone(include_destroyed)
        if tenant is None:
            return etag, items
        own = [item for item in items if item["owner"] == tenant]
        key = (include_destroyed, tenant)
        if self._tenant_items.get(key) != own:
            self._tenant_items[key] = own
            self._tenant_generation[key] = self._tenant_generation.get(key, 0) + 1
        return self.etag(include_destroyed, self._tenant_generation[key], tenant), own

    async def _everyone(self, include_destroyed: bool) -> tuple[str, list[dict[str, Any]]]:
        """(the ETag, every record of the view, oldest first), made from the log, and only
        when a watcher asks for the whole view after a change."""
        generation = await self._look(include_destroyed)
        made = self._items.get(include_destroyed)
        if made is None or made[0] != generation:
            records = [r for _, r, _ in self._log.get(include_destroyed, {}).values()
                       if r is not None]
            records.sort(key=lambda r: (r["created_at"], r["id"]))
            self._items[include_destroyed] = made = (generation, records)
        return self.etag(include_destroyed, generation), made[1]

    async def _look(self, include_destroyed: bool) -> int:
        """Read the view's watch (the rows changed since its last look); its generation."""
        async with self._lock:
            if self._closed:
                from sandboxer.core.rules.errors import Unavailable

                raise Unavailable("the service is stopping")
            watch = self._watches.get(include_destroyed)
            if watch is None:
                watch = self._client.watch(include_destroyed=include_destroyed)
                self._watches[include_destroyed] = watch
            change = await watch.read()
            if change or include_destroyed not in self._generation:
                generation = self._generation.get(include_destroyed, 0) + 1
                self._generation[include_destroyed] = generation
                self._record(include_destroyed, generation, change)
            return self._generation[include_destroyed]

    def _record(self, view: bool, generation: int, change: Any) -> None:
        """Note what this look found in the view's log, each id moved to its end."""
        log = self._log.setdefault(view, OrderedDict())
        for box in (*change.added, *change.changed):
            if log.get(box.id, (0, {}))[1] is None:
                self._gone[view] -= 1
            log[box.id] = (generation, box.to_dict(), box.owner)
            log.move_to_end(box.id)
        for sandbox_id in change.removed:
            before = log.get(sandbox_id)
            if before is None or before[1] is None:
                continue
            log[sandbox_id] = (generation, None, before[2])
            log.move_to_end(sandbox_id)
            self._gone[view] = self._gone.get(view, 0) + 1
        while self._gone.get(view, 0) > TOMBSTONES:  # forget the oldest tombstones
            for sandbox_id, (at, record, _) in log.items():
                if record is None:
                    del log[sandbox_id]
                    self._gone[view] -= 1
                    self._floor[view] = at
                    break

    def position(self, include_destroyed: bool) -> str:
        return f"{self._boot}.{self._generation[include_destroyed]}"

    async def changes(self, include_destroyed: bool, since: str | None,
                      tenant: str | None = None) -> dict[str, Any]:
        """What changed in that view since `since` (a position this service handed out):
        `{"position", "reset", "changed": [records], "removed": [ids]}`; everything, with
        `reset`, for no position or one this run cannot answer from."""
        after = None
        if since is not None:
            boot, dot, number = since.partition(".")
            if not dot or not number.isdigit() or len(since) > 64:
                raise BadInput(f"bad since {since[:64]!r}: give the position of the previous "
                               "answer, or none for everything")
            after = int(number) if boot == self._boot else None
        await self._look(include_destroyed)
        view = include_destroyed
        position = self.position(view)
        if after is None or after < self._floor.get(view, 0) \
                or after > self._generation[view]:
            _, items = await self._everyone(include_destroyed)
            position = self.position(view)  # that read may have found a change too
            own = items if tenant is None else [i for i in items if i["owner"] == tenant]
            return {"position": position, "reset": True, "changed": own, "removed": []}
        changed: list[dict[str, Any]] = []
        removed: list[str] = []
        for sandbox_id, (at, record, owner) in reversed(self._log.get(view, {}).items()):
            if at <= after:
                break  # the log is in the order of change: the rest is older
            if tenant is not None and owner != tenant:
                continue
            if record is None:
                removed.append(sandbox_id)
            else:
                changed.append(record)
        changed.sort(key=lambda r: (r["created_at"], r["id"]))
        return {"position": position, "reset": False, "changed": changed,
                "removed": removed[::-1]}

    async def close(self) -> None:
        async with self._lock:
            self._closed = True
            for watch in self._watches.values():
                with contextlib.suppress(Exception):
                    await watch.aclose()
            self._watches.clear()


def matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an If-None-Match header names `etag` (weak or strong, in a list, or `*`)."""
    if not if_none_match:
        return False
    for tag in if_none_match.split(","):
        tag = tag.strip()
        if tag == "*" or tag.removeprefix("W/") == etag:
            return True
    return False
