"""Creates made under an `Idempotency-Key` (docs/service.md): the first request with a key
records it, with a digest of what it asked for, before the sandbox is made; a retry with the
same key and the same request gets that sandbox instead of a second one, after a restart
too. The same key with another request is refused; one still in progress is a conflict.
A claim whose request died with its process lapses after the lease time, as leases do."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from core.clock import from_iso, to_iso
from core.db import Database
from core.errors import BadInput, Conflict
from core.models import IdempotencyKey

KEYS = IdempotencyKey.__table__
MAX_KEY = 255
KEEP = timedelta(hours=24)  # a key may be reused for another request after this long


class KeyReused(BadInput):
    """The key was first used with another request (HTTP 422)."""


def request_digest(request: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(request, sort_keys=True, default=str).encode()).hexdigest()


def check_key(key: str) -> str:
    if not key or len(key) > MAX_KEY or not key.isascii() or not key.isprintable():
        raise BadInput(f"bad Idempotency-Key: printable ASCII, 1 to {MAX_KEY} characters")
    return key


def claim(db: Database, principal: str, key: str, digest: str, *, now: str,
          lapse: timedelta) -> str | None:
    """The sandbox a completed earlier request made (None: this request goes on, and its
    claim is recorded). KeyReused for another request, Conflict while one is in progress."""
    check_key(key)
    moment = from_iso(now)
    where = sa.and_(KEYS.c.principal == principal, KEYS.c.key == key)
    with db.write() as conn:
        conn.execute(KEYS.delete().where(KEYS.c.created_at < to_iso(moment - KEEP)))
        row = conn.execute(sa.select(KEYS).where(where).with_for_update()).mappings().first()
        if row is not None:
            if row["request_hash"] != digest:
                raise KeyReused("this Idempotency-Key was used with another request; use a "
                                "new key for a new request")
            if row["sandbox_id"] is not None:
                return row["sandbox_id"]
            if from_iso(row["created_at"]) + lapse > moment:
                raise Conflict("a request with this Idempotency-Key is still in progress; "
                               "retry when it has finished")
            conn.execute(KEYS.update().where(where).values(created_at=now))
            return None
        conn.execute(KEYS.insert().values(principal=principal, key=key, request_hash=digest,
                                          sandbox_id=None, created_at=now))
    return None


def complete(db: Database, principal: str, key: str, sandbox_id: str) -> None:
    with db.write() as conn:
        conn.execute(KEYS.update().where(sa.and_(KEYS.c.principal == principal,
                                                 KEYS.c.key == key))
                     .values(sandbox_id=sandbox_id))


def release(db: Database, principal: str, key: str) -> None:
    """The request failed: the key may be used again (for this request or another)."""
    with db.write() as conn:
        conn.execute(KEYS.delete().where(sa.and_(KEYS.c.principal == principal,
                                                 KEYS.c.key == key,
                                                 KEYS.c.sandbox_id.is_(None))))
