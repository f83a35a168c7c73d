"""What a program that serves the library to others needs beyond the public API. `sbx serve`
(docs/service.md) is built on this module alone, with `sandboxer` and the engine's pure rules;
docs/api.md ("sandboxer.service") is its reference.

- `ServiceClient`: an `AsyncSandboxer` that acts for a service's callers: as a key's owner
  (a tenant), a page of sandboxes at a time, creates under an idempotency key, API keys and
  their check, counts, readiness and every running sandbox's reading at once.
  `ServiceClient.on_running_loop()` runs the engine on the service's own event loop.
- `Scope`, `MAX_QUOTA`: what an API key may do, and the largest quota a key may set.
- `KeyReused`: an idempotency key sent again with another request (HTTP 422).
- `output_doc`: output bytes as JSON carries them (text, or `{"base64": ...}`).
- `container_collector`: a prometheus-client collector of `current_metrics()` readings.
- `evidence_public_key`: the public half of an evidence-signing key, with its id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandboxer._api import AsyncSandboxer
from sandboxer._records import output_doc

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from sandboxer.core.lifecycle.idempotency import KeyReused
    from sandboxer.core.store.apikeys import MAX_QUOTA, Scope


class ServiceClient(AsyncSandboxer):
    """An `AsyncSandboxer` for a service. Besides everything `AsyncSandboxer` does, a service
    calls (all documented in docs/api.md, "sandboxer.service"):

    `acting_as(actor, tenant=)` (a client per caller), `list_page(...)`,
    `create_idempotent(key, profile, caller=, ...)`, `create_api_key`, `api_keys`,
    `revoke_api_key`, `authenticate(token)`, `usable_api_keys()`, `sandbox_counts()`,
    `ready()` and `current_metrics(timeout=)`. A client of another service (`url=`) refuses
    `acting_as`, `authenticate` and `current_metrics`: only that service can answer them."""

    @classmethod
    def on_running_loop(cls, *, home: str | Path | None = None,
                        database_url: str | None = None,
                        actor: str | None = None) -> ServiceClient:
        """A client whose engine runs on the event loop running now (the service's), not
        on a thread of its own: no hop to a thread and back on every call (docs/design.md,
        "The library"). Call it from a coroutine on that loop, and use it only there."""
        import asyncio

        from sandboxer._local import LocalTransport

        return cls(_transport=LocalTransport(
            home=None if home is None else str(home), database_url=database_url, actor=actor,
            loop=asyncio.get_running_loop()))

    def acting_as(self, actor: str, *, tenant: bool | str = False) -> ServiceClient:
        """A client sharing this one's database, backends and loop whose operations the
        event log records as done by `actor`; with `tenant=True`, it sees and acts on
        `actor`'s own sandboxes, checkpoints and events only (docs/security.md, "Tenants").
        Closing it leaves this client open."""
        return ServiceClient(_transport=super().acting_as(actor, tenant=tenant)._transport)


def container_collector(readings: Sequence[Mapping[str, Any]]) -> Collector:
    """A prometheus-client collector of the container families of `readings` (what
    `current_metrics()` returns), to register in a registry: one series per sandbox."""
    from sandboxer.core.follow.containermetrics import collector

    return collector(list(readings))


def evidence_public_key(private_key: str | Path) -> dict[str, str]:
    """`{"keyid", "public_key"}`: the public half (PEM) of the ed25519 private key file an
    evidence bundle is signed with, and the key id an envelope names it by."""
    from sandboxer.core.observe.signing import keyid, public_key_pem

    pem = public_key_pem(private_key)
    return {"keyid": keyid(pem.encode()), "public_key": pem}


def __getattr__(name: str) -> Any:
    """The names that live in the store and the lifecycle, loaded on first use (they bring
    the ORM): a program that only reads `output_doc` does not pay for it."""
    if name in ("Scope", "MAX_QUOTA"):
        from sandboxer.core.store import apikeys

        return getattr(apikeys, name)
    if name == "KeyReused":
        from sandboxer.core.lifecycle.idempotency import KeyReused

        return KeyReused
    raise AttributeError(f"module 'sandboxer.service' has no attribute {name!r}")


__all__ = ["MAX_QUOTA", "KeyReused", "Scope", "ServiceClient", "container_collector",
           "evidence_public_key", "output_doc"]
