"""Keys of the HTTP service (`sbx api-keys`, docs/service.md).

A key is `sbxk_<ulid>_<secret>`: the ULID names its row, the secret is 32 random bytes.
Only the SHA-256 of the whole key is stored. A slow hash (scrypt, argon2) protects secrets
people choose; this one is random and 256 bits long, so nothing can be guessed from its
hash, and a fast one costs each request microseconds instead of tens of milliseconds. The
stored hash is compared in constant time (hmac.compare_digest).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select
from ulid import ULID

from sandboxer.core.rules.errors import BadInput, NotFound
from sandboxer.core.rules.ids import validate_owner
from sandboxer.core.store.db import INTEGER_MAX, Database
from sandboxer.core.store.models import ApiKey, Tenant
from sandboxer.core.store.refs import by_id

ID_PREFIX = "key-"
TOKEN_PREFIX = "sbxk_"
_TOKEN = re.compile(r"sbxk_([0-9a-z]{26})_([A-Za-z0-9_-]{43})")
KEYS = ApiKey.__table__
QUOTA_FIELDS = ("max_sandboxes", "max_ttl_s", "max_execs")
MAX_QUOTA = INTEGER_MAX  # the columns' range (INTEGER on PostgreSQL): 68 years of max_ttl_s
_KEY_ID = re.compile(r"key-[0-9a-z]{26}")


class Scope(enum.StrEnum):
    """What a key may do; each includes the ones before it."""

    READ = "read"  # look: list, show, events, metrics, logs
    WRITE = "write"  # act: create, exec, destroy, extend, checkpoints, reap
    ADMIN = "admin"  # also manage keys, and create from a profile document of its own

    def allows(self, needed: Scope) -> bool:
        order = list(Scope)
        return order.index(self) >= order.index(needed)


def parse_scope(value: str) -> Scope:
    try:
        return Scope(value)
    except ValueError:
        raise BadInput(f"bad scope {value!r} (one of {', '.join(s.value for s in Scope)})"
                       ) from None


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def key_view(key: ApiKey) -> dict[str, Any]:
    """A key as `sbx api-keys ls --json` shows it (never its hash)."""
    return {"id": key.id, "owner": key.owner, "scope": key.scope,
            "created_at": key.created_at, "created_by": key.created_by,
            "revoked_at": key.revoked_at}


Record = Callable[[sa.Connection, str, dict[str, Any]], None]  # writes an event (type, payload)


def check_quotas(quotas: Mapping[str, Any]) -> dict[str, int]:
    """The quotas given (max_sandboxes, max_ttl_s, max_execs), each a whole number from 1
    to MAX_QUOTA."""
    checked = {}
    for field in QUOTA_FIELDS:
        value = quotas.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_QUOTA:
            if field == "max_ttl_s" and isinstance(value, int) and value > MAX_QUOTA:
                raise BadInput(f"bad max_ttl: at most {MAX_QUOTA // 86400}d (68 years)")
            raise BadInput(f"bad {field} {str(value)[:40]}: a whole number from 1 to "
                           f"{MAX_QUOTA}")
        checked[field] = value
    return checked


def create(db: Database, *, scope: str, owner: str, created_by: str, now: str,
           record: Record, quotas: Mapping[str, Any] | None = None,
           ) -> tuple[dict[str, Any], str]:
    """A new key: (its record, the key itself, which is stored nowhere). `quotas` set the
    owner's (docs/security.md, "Tenants"); the key and the quotas are events of the chain,
    in the same transaction."""
    parsed = parse_scope(scope)
    owner = validate_owner((owner or "").strip())
    limits = check_quotas(quotas or {})
    ulid = str(ULID()).lower()
    token = f"{TOKEN_PREFIX}{ulid}_{secrets.token_urlsafe(32)}"
    key = ApiKey(id=ID_PREFIX + ulid, owner=owner, scope=parsed.value,
                 key_hash=_digest(token), created_at=now, created_by=created_by)
    with db.session(write=True) as session:
        session.add(key)
        if limits:
            tenant = session.get(Tenant, owner) or Tenant(owner=owner, set_at=now,
                                                          set_by=created_by)
            for field, value in limits.items():
                setattr(tenant, field, value)
            tenant.set_at, tenant.set_by = now, created_by
            session.add(tenant)
        session.flush()
        record(session.connection(), "apikey.created", {
            "key": key.id, "owner": owner, "scope": parsed.value, **limits})
    view = key_view(key)
    if limits:
        view["quotas"] = limits
    return view, token


def list_keys(db: Database) -> list[dict[str, Any]]:
    with db.session() as session:
        return [key_view(k) for k in session.exec(
            select(ApiKey).order_by(ApiKey.created_at, ApiKey.id))]


def revoke(db: Database, key_id: str, *, now: str,
           record: Record) -> tuple[dict[str, Any], bool]:
    """Revoke a key by id: (its record, whether it was revoked just now); an event of the
    chain in the same transaction."""
    with db.session(write=True) as session:
        key = None if not _KEY_ID.fullmatch(key_id) else session.exec(
            select(ApiKey).where(ApiKey.id == key_id).with_for_update()).first()
        if key is None:
            raise NotFound(f"no API key {key_id!r} (sbx api-keys ls lists them)")
        if key.revoked_at is not None:
            return key_view(key), False
        key.revoked_at = now
        session.add(key)
        session.flush()
        record(session.connection(), "apikey.revoked", {
            "key": key.id, "owner": key.owner, "scope": key.scope})
        return key_view(key), True


def usable_keys(db: Database) -> int:
    """How many keys are not revoked (`sbx serve` beyond loopback needs one)."""
    with db.session() as session:
        return session.exec(select(sa.func.count()).select_from(ApiKey)
                            .where(col(ApiKey.revoked_at).is_(None))).one() or 0


def authenticate(db: Database, token: str) -> dict[str, Any] | None:
    """The key's record when `token` is a key that is not revoked; None otherwise."""
    match = _TOKEN.fullmatch(token or "")
    if match is None:
        return None
    # every request asks: the row through a statement built once, then typed
    # (docs/design.md, "The model")
    with db.read() as conn:
        row = conn.execute(by_id(KEYS), {"id": ID_PREFIX + match.group(1)}).mappings().first()
    key = ApiKey(**row) if row is not None else None
    if key is None or not hmac.compare_digest(key.key_hash, _digest(token)):
        return None
    if key.revoked_at is not None:
        return None
    return key_view(key)
