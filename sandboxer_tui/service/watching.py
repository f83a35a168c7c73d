"""The inventory for remote watchers (`GET /v1/inventory`): a conditional GET over the
library's own watch, so a client that asks again with the ETag of its last answer is told
"nothing changed" (304) without a row read when nobody committed (on SQLite), and the diff
stays the library's, made by the client from whole listings (`sandboxer.core.follow.watch.diff_rows`).

Why not the event stream: not every change a reader sees writes an event (activity from
following logs moves `last_activity_at` quietly), and a stream would make `read()` racy (a
change committed just before it might not have arrived yet)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
from typing import Any

from sandboxer import AsyncInventoryWatch, AsyncSandboxer


class InventoryVersions:
    """One watch of the service's own per view (with destroyed sandboxes, without), read
    when a watcher asks; its generation moves only when a read found a change."""

    def __init__(self, client: AsyncSandboxer) -> None:
        self._client = client
        self._boot = secrets.token_hex(6)  # an ETag of an earlier run never matches
        self._watches: dict[bool, AsyncInventoryWatch] = {}
        self._generation: dict[bool, int] = {}
        self._items: dict[bool, list[dict[str, Any]]] = {}
        self._lock = asyncio.Lock()
        self._closed = False
        self._tenant_items: dict[tuple[bool, str], list[dict[str, Any]]] = {}
        self._tenant_generation: dict[tuple[bool, str], int] = {}

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
        async with self._lock:
            if self._closed:
                from sandboxer.core.rules.errors import Unavailable

                raise Unavailable("the service is stopping")
            watch = self._watches.get(include_destroyed)
            if watch is None:
                watch = self._client.watch(include_destroyed=include_destroyed)
                self._watches[include_destroyed] = watch
            change = await watch.read()
            if change or include_destroyed not in self._items:
                self._generation[include_destroyed] = \
                    self._generation.get(include_destroyed, 0) + 1
                boxes = sorted(change.sandboxes.values(), key=lambda b: (b.created_at, b.id))
                self._items[include_destroyed] = [b.to_dict() for b in boxes]
            return (self.etag(include_destroyed, self._generation[include_destroyed]),
                    self._items[include_destroyed])

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
