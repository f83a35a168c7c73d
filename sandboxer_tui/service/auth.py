"""Who is calling: `Authorization: Bearer KEY`, the key's scope, and the client that acts as
the key's owner. A request over the service's own unix socket (mode 0600: only the user who
runs `sbx serve` can connect) may come without a key; it acts as that user, with every scope.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from starlette.requests import HTTPConnection

from sandboxer import AsyncSandboxer
from sandboxer.service import Scope

LOCAL = "local"  # the caller of a request over the unix socket without a key


@dataclass(frozen=True)
class Caller:
    """The library client a request runs through, acting as the key's owner."""

    client: AsyncSandboxer
    principal: str  # the key's id (idempotency keys are kept per principal), or LOCAL
    scope: Scope
    actor: str

    @property
    def tenant(self) -> str | None:
        """The owner this caller is narrowed to (docs/security.md, "Tenants"); None: all."""
        return None if self.scope is Scope.ADMIN else self.actor

    def require(self, needed: Scope, what: str) -> None:
        if not self.scope.allows(needed):
            raise Refused(403, f"{what} needs {_a(needed)} key, not {_a(self.scope)} one")

    def may_own(self, owner: str | None) -> None:
        """A key records its own owner: naming another is for admin keys (403 otherwise)."""
        if owner is not None and self.tenant is not None and owner != self.tenant:
            raise Refused(403, f"owner {owner!r}: a {self.scope} key records its own owner "
                               f"({self.tenant!r}); naming another needs an admin key")


def _a(scope: Scope) -> str:
    return f"an {scope}" if scope is Scope.ADMIN else f"a {scope}"


class Refused(Exception):
    """401 (no usable key) or 403 (a key whose scope does not allow it)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _over_socket(request: Request) -> bool:
    server = request.scope.get("server")
    path = request.app.state.service.socket_path
    return bool(path and server and server[1] is None and server[0] == path)


E2B_PREFIX = "/e2b/"  # the E2B API (service/e2b.py): its SDK sends the key in its own headers


def _e2b_key(request: Request) -> str | None:
    """The key of a call to the E2B API: `X-API-KEY` (its control plane) or `X-Access-Token`
    (envd), `e2b_` before it allowed (docs/e2b-api.md); its `Authorization` names a user."""
    token = request.headers.get("x-api-key") or request.headers.get("x-access-token")
    if token is None:
        return None
    token = token.strip()
    return token[4:] if token.startswith("e2b_") else token


def _bearer(request: Request) -> str | None:
    scope = request.scope
    if (scope.get("root_path", "") + scope["path"]).startswith(E2B_PREFIX) or \
            scope["path"].startswith(E2B_PREFIX):
        return _e2b_key(request)
    header = request.headers.get("authorization")
    if not header:
        return None
    kind, _, token = header.partition(" ")
    return token.strip() if kind.lower() == "bearer" and token.strip() else ""


async def caller(request: Request, needed: Scope) -> Caller:
    """The caller of this request, or Refused."""
    service = request.app.state.service
    client: AsyncSandboxer = service.client
    token = _bearer(request)
    if token is None and _over_socket(request):
        return Caller(client, LOCAL, Scope.ADMIN, service.actor)
    if not token:
        raise Refused(401, "this service needs an API key: send `Authorization: Bearer KEY` "
                           "(sbx api-keys create makes one)")
    # looked up once a request: the limits middleware's lookup is kept in its state
    key = getattr(request.state, "api_key", None) or await client.authenticate(token)
    request.state.api_key = key
    if key is None:
        raise Refused(401, "the API key is not one of this service's, or it was revoked")
    scope = Scope(key["scope"])
    if not scope.allows(needed):
        raise Refused(403, f"{_a(scope).capitalize()} key cannot do this: it needs "
                           f"{_a(needed)} key")
    # a read or write key is its owner's tenant; an admin key sees every owner's
    tenant = scope is not Scope.ADMIN
    return Caller(client.acting_as(key["owner"], tenant=tenant), key["id"], scope,
                  key["owner"])


def need(scope: Scope):
    """A FastAPI dependency: the caller, holding at least `scope`."""
    async def dependency(request: Request) -> Caller:
        return await caller(request, scope)

    dependency.__name__ = f"needs_{scope}"
    return dependency


READ, WRITE, ADMIN = need(Scope.READ), need(Scope.WRITE), need(Scope.ADMIN)


KEY_CHECK_S = 5.0  # an open WebSocket's key is checked again this often: revoked, it closes


async def until_revoked(conn: HTTPConnection, principal: str) -> None:
    """Raises Unauthorized once the key an open WebSocket came with is revoked (checked every
    KEY_CHECK_S): a connection is one request, and a revoked key's next request is refused.
    Over the unix socket without a key: never returns."""
    import asyncio

    from sandboxer.core.rules.errors import Unauthorized

    token = _bearer(conn)  # type: ignore[arg-type]
    if principal == LOCAL or not token:
        await asyncio.Event().wait()
    client = conn.app.state.service.client
    while True:
        await asyncio.sleep(KEY_CHECK_S)
        try:
            key = await client.authenticate(token)
        except Exception:  # noqa: BLE001 (the database unreachable a moment: check again)
            continue
        if key is None:
            raise Unauthorized("the API key this connection was opened with was revoked: "
                               "the connection is closed")
