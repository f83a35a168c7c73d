"""The service's proxy to a sandbox's ports (docs/terminals-and-ports.md, "The proxy and
preview links"): which headers cross it, the signed preview links, the pool of upstream
connections, and the throttle that turns traffic into activity. The routes are in
routes/ports.py; what is here is plain code the routes call, unit-tested on its own."""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# -- headers --------------------------------------------------------------------------------

# hop-by-hop headers (RFC 9110 7.6.1) belong to one connection: never passed on
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "proxy-connection", "te", "trailer", "trailers", "transfer-encoding",
                        "upgrade"})
# a WebSocket handshake's own headers: the proxy's client makes its own handshake
HANDSHAKE = frozenset({"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
                       "sec-websocket-protocol", "sec-websocket-accept"})
KEY_MARK = "sbxk_"  # every API key starts so (core/store/apikeys.py)


def _connection_named(headers: Iterable[tuple[str, str]]) -> set[str]:
    """The hop-by-hop headers a Connection header names besides the standard ones."""
    named = set(HOP_BY_HOP)
    for name, value in headers:
        if name.lower() == "connection":
            named.update(part.strip().lower() for part in value.split(",") if part.strip())
    return named


def request_headers(headers: Iterable[tuple[str, str]], *, via_link: bool,
                    client: str | None = None, proto: str = "http",
                    host: str | None = None, websocket: bool = False,
                    ) -> list[tuple[str, str]]:
    """The headers a request to a sandbox's port carries: the caller's, less the hop-by-hop
    ones, Host (the upstream's own is set), the sbx key and, on a link's request, Referer
    (its path holds the link). Authorization is the key on a key's request, so it never
    goes; on a link's request it is the caller's own for the app, passed on unless it
    holds an sbx key. X-Forwarded-For/-Proto/-Host say who asked and where."""
    headers = list(headers)
    drop = _connection_named(headers) | {"host", "x-forwarded-for", "x-forwarded-proto",
                                         "x-forwarded-host"}
    if websocket:
        drop |= HANDSHAKE
    if via_link:
        drop.add("referer")
    else:
        drop.add("authorization")
    kept = [(n, v) for n, v in headers if n.lower() not in drop
            and not (n.lower() == "authorization" and KEY_MARK in v)]
    if client:
        kept.append(("x-forwarded-for", client))
    kept.append(("x-forwarded-proto", proto))
    if host:
        kept.append(("x-forwarded-host", host))
    return kept


# headers of a sandbox's answer that would act on the service's whole origin, which every
# sandbox's pages share (a service worker's scope beyond the page's path, clearing the
# origin's storage, HSTS, another server for the origin): never passed on
ORIGIN_WIDE = frozenset({"service-worker-allowed", "clear-site-data",
                         "strict-transport-security", "alt-svc"})


def _cookie_under(value: str, prefix: str) -> str:
    """A sandbox's Set-Cookie kept to its own path below `prefix` (its Path moved under it,
    as a Location is; none: `prefix/`) and to the service's host (a Domain dropped): a
    cookie it sets never goes to another sandbox's pages or links on the same origin."""
    name_value, *attributes = value.split(";")
    kept, path = [], "/"
    for attribute in attributes:
        key = attribute.strip().partition("=")[0].strip().lower()
        if key == "path":
            given = attribute.partition("=")[2].strip()
            path = given if given.startswith("/") else "/"
        elif key != "domain":
            kept.append(attribute.strip())
    return "; ".join([name_value.strip(), f"Path={prefix}{path}", *kept])


def response_headers(headers: Iterable[tuple[str, str]], *, prefix: str,
                     via_link: bool) -> list[tuple[bytes, bytes]]:
    """The headers of the sandbox's answer as the caller gets them: less the hop-by-hop
    ones and the ORIGIN_WIDE ones; a Location on the sandbox's own root (`/next`) and a
    cookie's Path moved under the proxy's `prefix` (_cookie_under); on a link's answer, `Referrer-Policy: no-referrer`, so that the page a link opened does
    not hand the link on to the sites it links to."""
    headers = list(headers)
    drop = _connection_named(headers)
    if any(name.lower() == "transfer-encoding" for name, _ in headers):
        drop.add("content-length")  # the body was read by its chunks (RFC 9112 6.3)
    if via_link:
        drop.add("referrer-policy")
    out = []
    for name, value in headers:
        lower = name.lower()
        if lower in drop:
            continue
        if lower in ORIGIN_WIDE:
            continue
        if lower == "location" and value.startswith("/") and not value.startswith("//"):
            value = prefix + value
        if lower == "set-cookie":
            value = _cookie_under(value, prefix)
        out.append((lower.encode("latin-1"), value.encode("latin-1")))
    if via_link:
        out.append((b"referrer-policy", b"no-referrer"))
    return out


# -- signed preview links -------------------------------------------------------------------


class LinkRefused(Exception):
    """A link that is altered, malformed or expired (HTTP 403, this one line)."""


@dataclass(frozen=True)
class Link:
    sandbox_id: str
    port: int
    expires_at: int  # seconds since the epoch


class Links:
    """Signed preview links: `PAYLOAD.MAC`, both base64url, the payload
    `SANDBOX_ID:PORT:EXPIRES_AT` and the MAC its HMAC-SHA256 under the service's link key.

    Why HMAC from the standard library rather than a package (itsdangerous, a JWT library):
    the service both makes and checks every link, so a shared secret is all it takes; a link
    holds three fields and one MAC; `hmac.compare_digest` is the constant-time check; and a
    package would bring formats and algorithm choices (JWT's `alg`) that are only more to get
    wrong. The key is 32 random bytes in the state folder (`preview-links.key`, made 0600 on
    first use, a planted link refused): every link dies when it is deleted (docs/security.md).
    """

    DOMAIN = b"sbx-preview-link-v1\0"  # a MAC of this scheme is never one of anything else

    def __init__(self, key_path: Path) -> None:
        self.key_path = key_path
        self._key: bytes | None = None

    def key(self) -> bytes:
        if self._key is None:
            self._key = _load_or_make_key(self.key_path)
        return self._key

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self.key(), self.DOMAIN + payload, hashlib.sha256).digest()

    def make(self, sandbox_id: str, port: int, expires_at: int) -> str:
        payload = f"{sandbox_id}:{port}:{expires_at}".encode()
        return f"{_b64(payload)}.{_b64(self._mac(payload))}"

    def check(self, token: str, now: float | None = None) -> Link:
        """The link `token` grants, or LinkRefused saying why not."""
        part, dot, mac = token.partition(".")
        try:
            payload, given = _unb64(part), _unb64(mac)
        except ValueError:
            payload = given = b""
        if not dot or not payload or not hmac.compare_digest(self._mac(payload), given):
            raise LinkRefused("this preview link is not valid: it was altered, or made by "
                              "another service")
        sandbox_id, port, expires = payload.decode().rsplit(":", 2)
        if (time.time() if now is None else now) >= int(expires):
            raise LinkRefused("this preview link has expired: ask for a new one")
        return Link(sandbox_id, int(port), int(expires))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    if not text or len(text) > 512 or not text.replace("-", "").replace("_", "").isalnum():
        raise ValueError("not base64url")
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(data) != text:  # the last character's unused bits: one link, one spelling
        raise ValueError("not canonical base64url")
    return data


def _load_or_make_key(path: Path) -> bytes:
    """The link key at `path`, made (32 random bytes, hex, mode 0600) if there is none; a
    symbolic link planted there is refused, never followed (as every state file's)."""
    from sandboxer.core.rules.errors import BadInput

    def opened(flags: int) -> int:
        try:
            return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise BadInput(f"{path.name} in the state folder is a symbolic link; sbx "
                               "does not follow links in its state folder (remove it)") from None
            raise

    try:
        fd = opened(os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32) + "\n")
    with os.fdopen(opened(os.O_RDONLY), "r") as src:
        text = src.read().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 32:
        raise BadInput(f"{path.name} in the state folder is not a preview-link key "
                       "(64 hex digits): remove it, and a new one is made")
    return key


# -- activity -------------------------------------------------------------------------------


@dataclass
class Activity:
    """Traffic through the proxy is activity for the idle limit: marked at most once every
    `every` seconds per sandbox (not once per request), in the background, so that a
    request never waits for the database."""

    mark: Callable[[str], Awaitable[Any]]  # records activity on a sandbox, by id
    every: float = 1.0
    last: dict[str, float] = field(default_factory=dict)
    tasks: set[asyncio.Task] = field(default_factory=set)

    def seen(self, sandbox_id: str) -> None:
        now = time.monotonic()
        if now - self.last.get(sandbox_id, float("-inf")) < self.every:
            return
        self.last[sandbox_id] = now
        if len(self.last) > 4096:  # forget the quiet ones
            cutoff = now - self.every
            self.last = {k: v for k, v in self.last.items() if v >= cutoff}
        task = asyncio.get_running_loop().create_task(self._mark(sandbox_id))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _mark(self, sandbox_id: str) -> None:
        try:
            await self.mark(sandbox_id)
        except Exception:  # destroyed meanwhile, say: the request itself says so, not this
            pass


# -- upstreams ------------------------------------------------------------------------------


# a connection to a port is made within 10 s; an answer may take as long as it takes (a
# stream, a long poll); a request's body is sent within a minute of each piece
TIMEOUTS = {"connect": 10.0, "read": None, "write": 60.0, "pool": 30.0}


@dataclass
class Upstreams:
    """Where each sandbox's port answers (`box.url(port)`, kept a few seconds: each request
    still checks the sandbox in the database), and one pool of connections for them all:
    httpx's transport, which is its client's pool without the client's layers (redirects,
    cookies, auth, merged URLs: a proxy passes those on, it does not act on them), about a
    third of httpx's cost per request."""

    ttl: float = 5.0
    urls: dict[tuple[str, int], tuple[str, float]] = field(default_factory=dict)
    _http: Any = None

    def http(self) -> Any:
        """The pool: `await http.handle_async_request(httpx.Request(...,
        extensions={"timeout": TIMEOUTS}))`."""
        if self._http is None:
            import httpx

            self._http = httpx.AsyncHTTPTransport(
                limits=httpx.Limits(max_connections=512, max_keepalive_connections=64),
                trust_env=False, retries=0)
        return self._http

    async def url(self, box: Any, port: int) -> str:
        key = (box.id, port)
        now = time.monotonic()
        cached = self.urls.get(key)
        if cached is not None and now - cached[1] < self.ttl:
            return cached[0]
        url = (await box.url(port)).rstrip("/")
        if len(self.urls) > 4096:
            self.urls.clear()
        self.urls[key] = (url, now)
        return url

    def forget(self, sandbox_id: str, port: int) -> None:
        self.urls.pop((sandbox_id, port), None)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None


@dataclass
class Found:
    """The sandbox each key's requests named, kept `ttl` seconds: a key's request to the same
    sandbox within it skips the lookup (the key itself is still checked on every request,
    and a key's scope and owner never change). A link's request always looks."""

    ttl: float = 1.0
    boxes: dict[tuple[str, str], tuple[Any, float]] = field(default_factory=dict)

    def get(self, principal: str, ref: str) -> Any:
        hit = self.boxes.get((principal, ref))
        if hit is not None and time.monotonic() - hit[1] < self.ttl:
            return hit[0]
        return None

    def put(self, principal: str, ref: str, box: Any) -> None:
        if len(self.boxes) > 4096:
            self.boxes.clear()
        self.boxes[(principal, ref)] = (box, time.monotonic())


@dataclass
class Proxy:
    """One app's proxy: its links, its upstreams, the sandboxes keys found, and its activity
    throttle."""

    links: Links
    upstreams: Upstreams
    found: Found
    activity: Activity

    @classmethod
    def made(cls, key_path: Path, mark: Callable[[str], Awaitable[Any]]) -> Proxy:
        return cls(Links(key_path), Upstreams(), Found(), Activity(mark))

    async def close(self) -> None:
        await self.upstreams.close()
