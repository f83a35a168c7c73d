"""Delivering the event log to sinks: a JSON Lines file and a webhook (the "state hub").

Events are already in the database with the change they record (the outbox). Each sink
keeps a cursor there: a deliverer takes the sink's lease (compare-and-set, fenced), sends
events after the cursor in order, and moves the cursor as they are accepted. So delivery is
at least once and in order; a restart resumes at the cursor; two deliverers never send the
same event on purpose. An event a sink keeps refusing is retried with backoff, then parked
(`sbx events --undelivered`), and the ones after it go on; `sbx events redeliver` retries it.

Every event goes out as a CloudEvents 1.0 structured JSON document. Webhook deliveries are
signed the Standard Webhooks way (`webhook-id`, `webhook-timestamp`, `webhook-signature`),
so any hub verifies them with a `standardwebhooks` library and rejects replays by their
timestamp. The key comes from `$SBX_WEBHOOK_SECRET`, read when sending and kept nowhere.
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import hmac
import http.client
import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa

from sandboxer.core.rules import settings
from sandboxer.core.rules.clock import Clock, to_iso
from sandboxer.core.rules.errors import BadInput, storable
from sandboxer.core.rules.failpoints import failpoint
from sandboxer.core.store.db import LOCK_DELIVERY_CURSORS, Database, serialise
from sandboxer.core.store.models import Delivery, Event, SinkCursor

EVENTS = Event.__table__
CURSORS = SinkCursor.__table__
DELIVERIES = Delivery.__table__
LEGACY_SIGNATURE_HEADER = "X-Sbx-Signature"  # "sha256=" + hex HMAC of the body; opt-in
CONTENT_TYPE = "application/cloudevents+json"
BATCH = 500
SECRET_PREFIX = "whsec_"
MIN_SECRET_BYTES = 24  # the Standard Webhooks minimum
ALLOW_HTTP_VARIABLE = "SBX_WEBHOOK_ALLOW_HTTP"


class SinkRefused(Exception):
    """The sink did not take the event (HTTP status, connection error, disk full)."""


# -- the document --------------------------------------------------------------------------


def cloudevent(row: Mapping[str, Any], install_id: str) -> dict[str, Any]:
    """One event as a CloudEvents 1.0 structured document. The id is the event's chain
    hash: the same event always has the same id, so a duplicate is recognisable."""
    return {
        "specversion": "1.0",
        "id": row["hash"],
        "source": f"urn:sandboxer:{install_id}",
        "type": f"dev.sandboxer.{row['type']}",
        "time": row["time"],
        "subject": row["sandbox_id"],
        "datacontenttype": "application/json",
        "data": {
            "sequence": row["id"],
            "actor": row["actor"],
            "reason": row["reason"],
            "payload": json.loads(row["payload_json"] or "{}"),
            "prev_hash": row["prev_hash"],
            "hash": row["hash"],
        },
    }


def encode(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def signing_key(secret: str) -> bytes:
    """The HMAC key `SBX_WEBHOOK_SECRET` stands for: `whsec_` + base64 is decoded, as every
    Standard Webhooks library does; any other text is its UTF-8 bytes (hubs then verify with
    `Webhook(secret.encode())`). BadInput (never showing the secret) when it is too short."""
    if secret.startswith(SECRET_PREFIX):
        encoded = secret[len(SECRET_PREFIX):]
        try:
            key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise BadInput("SBX_WEBHOOK_SECRET: what follows whsec_ is not base64") from None
    else:
        key = secret.encode()
    if len(key) < MIN_SECRET_BYTES:
        raise BadInput(f"SBX_WEBHOOK_SECRET: the key is {len(key)} bytes, at least "
                       f"{MIN_SECRET_BYTES} are needed (make one with: "
                       'echo "whsec_$(openssl rand -base64 32)")')
    return key


def legacy_signature(body: bytes, secret: str) -> str:
    """The old `X-Sbx-Signature` (HMAC of the body alone, under the variable's text): no
    timestamp, so a hub cannot tell a replay; sent only when `legacy_signature = true`."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def check_url(url: str, where: str, allow_plain_http: bool) -> None:
    """`https://` anywhere; `http://` only to loopback (127.0.0.0/8, ::1, localhost)
    unless the user opted in. BadInput naming the problem."""
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 (raises on a port that is not a number in range)
    except ValueError:
        raise BadInput(f"{where}: {url!r} has an invalid port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInput(f"{where}: {url!r} is not an http(s) URL")
    if parts.scheme == "http" and not allow_plain_http and not is_loopback(parts.hostname):
        raise BadInput(
            f"{where}: {url!r} is plain http to {parts.hostname}, which is not loopback: use "
            f"https://, or opt in with allow_plain_http = true in [sinks.webhook] "
            f"(or {ALLOW_HTTP_VARIABLE}=1)")


def is_loopback(host: str) -> bool:
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return (mapped or address).is_loopback


# -- sinks ---------------------------------------------------------------------------------


class JsonlSink:
    """Appends one document per line; rotates to `.1`, `.2`, ... past `max_bytes`."""

    def __init__(self, path: Path, max_bytes: int = 10 * 1024**2, backups: int = 3) -> None:
        self.name = "jsonl"
        self.path, self.max_bytes, self.backups = path, max_bytes, backups

    def send(self, batch: Sequence[bytes], ids: Sequence[str] | None = None) -> int:
        try:
            self._rotate_if_full()
            # O_NOFOLLOW: a link planted in its place is refused, not written through
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                         0o600)
            with os.fdopen(fd, "ab") as out:
                out.write(b"".join(body + b"\n" for body in batch))
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise SinkRefused(f"cannot write {self.path}: it is a symbolic link, which "
                                  "sbx does not follow") from exc
            raise SinkRefused(f"cannot write {self.path}: {exc.strerror or exc}") from exc
        return len(batch)

    def _rotate_if_full(self) -> None:
        try:
            if self.path.stat().st_size < self.max_bytes:
                return
        except FileNotFoundError:
            return
        for n in range(self.backups, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            newer = self.path.with_name(f"{self.path.name}.{n - 1}") if n > 1 else self.path
            if newer.exists():
                os.replace(newer, older)

    def close(self) -> None:
        pass


class WebhookSink:
    """POSTs each document to the hub over one kept-alive connection, signed the Standard
    Webhooks way. `webhook-id` is the event's chain hash (the CloudEvent's id), the same on
    every retry, so a hub de-duplicates; `webhook-timestamp` is the time of this attempt."""

    def __init__(self, url: str, timeout_s: float = 5.0, *, clock: Clock | None = None,
                 legacy_signature: bool = False) -> None:
        self.name = "webhook"
        self.url, self.timeout_s = url, timeout_s
        self.clock = clock or Clock()
        self.legacy_signature = legacy_signature
        parts = urlsplit(url)
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = kind(self._host, self._port, timeout=self.timeout_s)
        return self._conn

    def send(self, batch: Sequence[bytes], ids: Sequence[str] | None = None) -> int:
        """Send in order; returns how many were accepted before the first refusal (raised
        when none was). `ids` are the documents' ids (read from each body when not given)."""
        from standardwebhooks import Webhook  # only where a webhook is configured

        secret = settings.webhook_secret()
        signer = Webhook(signing_key(secret))
        for done, body in enumerate(batch):
            webhook_id = ids[done] if ids is not None else json.loads(body)["id"]
            try:
                conn = self._connection()
                conn.request("POST", self._path, body=body,
                             headers=self._headers(signer, webhook_id, body, secret))
                response = conn.getresponse()
                response.read()
                if not 200 <= response.status < 300:
                    raise SinkRefused(f"{self.url} answered {response.status}")
            except (TimeoutError, OSError, http.client.HTTPException) as exc:
                self.close()
                if done:
                    return done
                raise SinkRefused(f"{self.url}: {exc}") from exc
            except SinkRefused:
                self.close()
                if done:
                    return done
                raise
            failpoint("deliver.after-send")
        return len(batch)

    def _headers(self, signer, webhook_id: str, body: bytes, secret: str) -> dict[str, str]:
        now = self.clock.now()
        headers = {"Content-Type": CONTENT_TYPE, "webhook-id": webhook_id,
                   "webhook-timestamp": str(int(now.timestamp())),
                   "webhook-signature": signer.sign(webhook_id, now, body.decode())}
        if self.legacy_signature:
            headers[LEGACY_SIGNATURE_HEADER] = legacy_signature(body, secret)
        return headers

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


# -- configuration -------------------------------------------------------------------------


@dataclass(frozen=True)
class DeliverySettings:
    sinks: list[Any]
    max_attempts: int = 8
    backoff_s: float = 2.0  # doubles with each attempt, at most 5 minutes


def load_settings(clock: Clock | None = None) -> DeliverySettings:
    """The sinks from the settings file, overridden by `SBX_WEBHOOK_URL`. A bad setting is
    BadInput naming the file (or variable) and the field."""
    path = settings.settings_file()
    data = settings.read_settings_file()

    def table(value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise BadInput(f"{path}: {where}: must be a table")
        return value

    sinks_conf = table(data.get("sinks", {}), "sinks")
    jsonl_conf = table(sinks_conf.get("jsonl", {}), "sinks.jsonl")
    hook_conf = table(sinks_conf.get("webhook", {}), "sinks.webhook")

    def number(conf: dict[str, Any], key: str, default: float, kind: type, where: str,
               least: float) -> Any:
        try:
            value = kind(conf.get(key, default))
        except (TypeError, ValueError):
            raise BadInput(f"{path}: {where}.{key}: {conf.get(key)!r} is not a number") from None
        if value < least:
            raise BadInput(f"{path}: {where}.{key}: must be at least {least}")
        return value

    def boolean(conf: dict[str, Any], key: str, where: str) -> bool:
        value = conf.get(key, False)
        if not isinstance(value, bool):
            raise BadInput(f"{path}: {where}.{key}: {value!r} is not true or false")
        return value

    sinks: list[Any] = []
    if jsonl_conf.get("enabled", True):
        sinks.append(JsonlSink(
            Path(jsonl_conf.get("path") or settings.sbx_home() / "events.jsonl").expanduser(),
            number(jsonl_conf, "max_bytes", 10 * 1024**2, int, "sinks.jsonl", 1024),
            number(jsonl_conf, "backups", 3, int, "sinks.jsonl", 0)))
    timeout_s = number(hook_conf, "timeout_s", 5.0, float, "sinks.webhook", 0.1)
    max_attempts = number(hook_conf, "max_attempts", 8, int, "sinks.webhook", 1)
    backoff_s = number(hook_conf, "backoff_s", 2.0, float, "sinks.webhook", 0)
    allow_plain_http = boolean(hook_conf, "allow_plain_http", "sinks.webhook")
    legacy = boolean(hook_conf, "legacy_signature", "sinks.webhook")
    allow_variable = os.environ.get(ALLOW_HTTP_VARIABLE, "")
    if allow_variable not in ("", "0", "1"):
        raise BadInput(f"{ALLOW_HTTP_VARIABLE}: {allow_variable!r} is not 0 or 1")
    if allow_variable:  # the variable, when set, overrides the file (as SBX_WEBHOOK_URL does)
        allow_plain_http = allow_variable == "1"
    url = settings.webhook_url() or hook_conf.get("url")
    where = "SBX_WEBHOOK_URL" if settings.webhook_url() else f"{path}: sinks.webhook.url"
    if url:
        check_url(str(url), where, allow_plain_http)
        if not settings.webhook_secret():
            raise BadInput("the webhook needs a signing secret: set SBX_WEBHOOK_SECRET")
        signing_key(settings.webhook_secret())
        sinks.append(WebhookSink(str(url), timeout_s, clock=clock, legacy_signature=legacy))
    return DeliverySettings(sinks, max_attempts, backoff_s)


# -- the deliverer -------------------------------------------------------------------------


@dataclass
class SinkReport:
    sink: str
    delivered: int = 0
    parked: int = 0
    error: str | None = None
    busy: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"sink": self.sink, "delivered": self.delivered, "parked": self.parked,
                "error": self.error, "busy": self.busy}


class Deliverer:
    def __init__(self, db: Database, config: DeliverySettings, clock: Clock, *,
                 install_id: str, owner: str, lease_ttl: timedelta) -> None:
        self.db, self.config, self.clock = db, config, clock
        self.install_id, self.owner, self.lease_ttl = install_id, owner, lease_ttl

    def run(self) -> list[SinkReport]:
        """Deliver every sink as far as it accepts now."""
        reports = []
        for sink in self.config.sinks:
            try:
                reports.append(self._deliver(sink))
            finally:
                sink.close()
        return reports

    # the sink's lease, as for sandboxes: compare-and-set, fenced
    def _claim(self, name: str) -> int | None:
        now = to_iso(self.clock.now())
        with self.db.write() as conn:
            serialise(conn, LOCK_DELIVERY_CURSORS)  # two first deliverers: one makes the cursor
            row = conn.execute(sa.select(CURSORS).where(CURSORS.c.sink == name)
                               .with_for_update()).mappings().first()
            if row is None:
                conn.execute(CURSORS.insert().values(sink=name, delivered_id=0, fence=0))
                row = {"fence": 0, "lease_owner": None, "lease_expires_at": None}
            if row["lease_owner"] and row["lease_expires_at"] >= now:
                return None
            return conn.execute(
                CURSORS.update().where(CURSORS.c.sink == name, CURSORS.c.fence == row["fence"])
                .values(lease_owner=self.owner, fence=CURSORS.c.fence + 1,
                        lease_expires_at=to_iso(self.clock.now() + self.lease_ttl))
                .returning(CURSORS.c.fence)).scalar()

    def _advance(self, conn, name: str, fence: int, to_id: int, *, release: bool = False) -> bool:
        values: dict[str, Any] = {"delivered_id": to_id,
                                  "lease_expires_at": to_iso(self.clock.now() + self.lease_ttl)}
        if release:
            values.update(lease_owner=None, lease_expires_at=None)
        return bool(conn.execute(
            CURSORS.update().where(CURSORS.c.sink == name, CURSORS.c.fence == fence,
                                   CURSORS.c.lease_owner == self.owner, CURSORS.c.delivered_id <= to_id)
            .values(**values)).rowcount)

    def _deliver(self, sink) -> SinkReport:
        report = SinkReport(sink.name)
        fence = self._claim(sink.name)
        if fence is None:
            report.busy = True
            return report
        cursor = self._cursor(sink.name)
        try:
            while True:
                with self.db.read() as conn:
                    rows = conn.execute(sa.select(EVENTS).where(EVENTS.c.id > cursor)
                                        .order_by(EVENTS.c.id).limit(BATCH)).mappings().all()
                    retry = conn.execute(sa.select(DELIVERIES).where(
                        DELIVERIES.c.sink == sink.name, DELIVERIES.c.parked.is_(False),
                        DELIVERIES.c.event_id > cursor)).mappings().first()
                if not rows:
                    return report
                if retry and retry["event_id"] == rows[0]["id"] and \
                        retry["next_attempt_at"] > to_iso(self.clock.now()):
                    report.error = f"waiting to retry event {retry['event_id']}: {retry['last_error']}"
                    return report
                bodies = [encode(cloudevent(r, self.install_id)) for r in rows]
                try:
                    accepted = sink.send(bodies, [r["hash"] for r in rows])
                except SinkRefused as exc:
                    accepted, error = 0, str(exc)
                else:
                    error = None
                with self.db.write() as conn:
                    if accepted:
                        cursor = rows[accepted - 1]["id"]
                        report.delivered += accepted
                        conn.execute(DELIVERIES.delete().where(
                            DELIVERIES.c.sink == sink.name, DELIVERIES.c.parked.is_(False),
                            DELIVERIES.c.event_id <= cursor))
                    if accepted < len(rows):  # the next one was refused
                        failed_id = rows[accepted]["id"]
                        parked = self._record_failure(conn, sink.name, failed_id,
                                                      error or "refused")
                        if parked:
                            cursor = failed_id
                            report.parked += 1
                        else:
                            report.error = error
                    if not self._advance(conn, sink.name, fence, cursor):
                        report.error = "another deliverer took this sink over"
                        return report
                if report.error:
                    return report
        finally:
            with self.db.write() as conn:
                self._advance(conn, sink.name, fence, cursor, release=True)

    def _cursor(self, name: str) -> int:
        with self.db.read() as conn:
            return conn.execute(sa.select(CURSORS.c.delivered_id)
                                .where(CURSORS.c.sink == name)).scalar() or 0

    def _record_failure(self, conn, sink: str, event_id: int, error: str) -> bool:
        """Count a refusal; park the event after `max_attempts`. True when parked."""
        row = conn.execute(sa.select(DELIVERIES).where(
            DELIVERIES.c.sink == sink, DELIVERIES.c.event_id == event_id)).mappings().first()
        attempts = (row["attempts"] if row else 0) + 1
        parked = attempts >= self.config.max_attempts
        delay = min(self.config.backoff_s * 2 ** (attempts - 1), 300.0)
        values = {"attempts": attempts, "last_error": storable(error), "parked": parked,
                  "next_attempt_at": to_iso(self.clock.now() + timedelta(seconds=delay))}
        if row is None:
            conn.execute(DELIVERIES.insert().values(sink=sink, event_id=event_id, **values))
        else:
            conn.execute(DELIVERIES.update().where(
                DELIVERIES.c.sink == sink, DELIVERIES.c.event_id == event_id).values(**values))
        return parked

    # -- parked events ----------------------------------------------------------------------

    def undelivered(self) -> list[dict[str, Any]]:
        with self.db.read() as conn:
            return [dict(r) for r in conn.execute(
                sa.select(DELIVERIES).order_by(DELIVERIES.c.sink, DELIVERIES.c.event_id)
            ).mappings()]

    def redeliver(self, event_ids: Sequence[int] | None = None) -> list[dict[str, Any]]:
        """Send parked events again (all, or these); those accepted leave the list."""
        from sandboxer.core.store.events import check_event_id

        event_ids = [check_event_id(i) for i in event_ids or ()]
        outcome = []
        for sink in self.config.sinks:
            try:
                with self.db.read() as conn:
                    query = sa.select(DELIVERIES, EVENTS).join(
                        EVENTS, EVENTS.c.id == DELIVERIES.c.event_id).where(
                        DELIVERIES.c.sink == sink.name, DELIVERIES.c.parked.is_(True))
                    if event_ids:
                        query = query.where(DELIVERIES.c.event_id.in_(list(event_ids)))
                    parked = conn.execute(query.order_by(DELIVERIES.c.event_id)).mappings().all()
                for row in parked:
                    try:
                        sink.send([encode(cloudevent(row, self.install_id))], [row["hash"]])
                        error = None
                    except SinkRefused as exc:
                        error = str(exc)
                    with self.db.write() as conn:
                        where = (DELIVERIES.c.sink == sink.name,
                                 DELIVERIES.c.event_id == row["event_id"])
                        if error is None:
                            conn.execute(DELIVERIES.delete().where(*where))
                        else:
                            conn.execute(DELIVERIES.update().where(*where).values(
                                attempts=DELIVERIES.c.attempts + 1,
                                last_error=storable(error)))
                    outcome.append({"sink": sink.name, "event_id": row["event_id"],
                                    "delivered": error is None, "error": error})
            finally:
                sink.close()
        return outcome


def default_deliverer(db: Database | None = None) -> Deliverer:
    import secrets as _secrets

    from sandboxer.core.rules.clock import clock_from_env

    clock = clock_from_env()
    return Deliverer(
        db or Database(settings.database_url()), load_settings(clock), clock,
        install_id=settings.install_id(),
        owner=f"{socket.gethostname()}:{os.getpid()}:{_secrets.token_hex(4)}",
        lease_ttl=settings.lease_ttl())
