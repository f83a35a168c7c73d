"""A sandbox's TCP ports as URLs (docs/terminals-and-ports.md, "Ports"), written once for
every backend with Capability.PORTS: the adapter says where each port is reached from this
host (an Endpoint), the core checks the caller may see the sandbox, refuses a port that is not
published naming those that are, and records an exposed port as `sandbox.port`.

A port exposed while the sandbox runs (E2B: any port it listens on is reachable once asked
for) is remembered by its `sandbox.port` event, so every process (the service, a CLI) lists it
again: its endpoint is asked of the adapter again (`expose_port` is idempotent).

A port's view is `{"port": 8080, "url": "http://127.0.0.1:49153"}`: what every front end shows.
The headers a cloud tunnel may need are never in it (they are credentials)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from sandboxer.adapters.base import Capability, Endpoint
from sandboxer.core.rules.catalog import EventType
from sandboxer.core.rules.errors import BadInput, NotFound
from sandboxer.core.store import tenancy
from sandboxer.core.store.models import Event, Sandbox

if TYPE_CHECKING:
    from sandboxer.adapters.base import Adapter
    from sandboxer.core.lifecycle.manager import Manager

SANDBOXES = Sandbox.__table__
EVENTS = Event.__table__
VERB = "publish ports"


def check_port(port: Any) -> int:
    """A TCP port number, 1-65535 (BadInput, exit 2, otherwise)."""
    if isinstance(port, str) and port.strip().isdigit():
        port = int(port)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise BadInput(f"bad port {str(port)[:20]!r}: a TCP port is a whole number from 1 "
                       "to 65535")
    return port


def view(endpoint: Endpoint) -> dict[str, Any]:
    return {"port": endpoint.port, "url": endpoint.url}


async def _sandbox(mgr: Manager, ref: str) -> tuple[dict[str, Any], Adapter]:
    """The sandbox `ref` names (another tenant's: not found), running, on a backend with
    PORTS (else Conflict, exit 4), and its adapter on the engine it lives on."""
    row = mgr.resolve(ref)
    tenancy.check(row, "sandbox", ref)
    mgr._usable(row, Capability.PORTS, VERB)
    return row, await mgr.adapter_for(row)


def _exposed(mgr: Manager, sandbox_id: str) -> list[int]:
    """The ports exposed while the sandbox ran, as its `sandbox.port` events say."""
    query = sa.select(EVENTS.c.payload_json).where(
        EVENTS.c.sandbox_id == sandbox_id, EVENTS.c.type == EventType.SANDBOX_PORT)
    with mgr.db.read() as conn:
        payloads = [json.loads(text) for text in conn.execute(query).scalars()]
    return sorted({p["port"] for p in payloads if isinstance(p.get("port"), int)})


async def _published(mgr: Manager, row: dict[str, Any], adapter: Adapter,
                     ) -> dict[int, Endpoint]:
    """What the backend publishes (the profile's ports), and the ports exposed since."""
    found = await adapter.port_endpoints(row["backend_ref"])
    for port in _exposed(mgr, row["id"]):
        if port not in found:
            found[port] = await adapter.expose_port(row["backend_ref"], port)
    return dict(sorted(found.items()))


async def endpoints(mgr: Manager, ref: str) -> dict[int, Endpoint]:
    """Where each published port of the sandbox is reached, by the port inside it."""
    row, adapter = await _sandbox(mgr, ref)
    return await _published(mgr, row, adapter)


def _not_published(row_id: str, port: int, found: dict[int, Endpoint]) -> NotFound:
    listed = ", ".join(str(p) for p in found) or "none"
    return NotFound(f"sandbox {row_id} publishes no port {port} (its ports: {listed}); "
                    "declare it in the profile's ports:, or expose it where the backend can")


async def endpoint(mgr: Manager, ref: str, port: int) -> Endpoint:
    """Where one port is reached (NotFound, exit 3, naming the ports that are published)."""
    port = check_port(port)
    row, adapter = await _sandbox(mgr, ref)
    found = await _published(mgr, row, adapter)
    if port not in found:
        raise _not_published(row["id"], port, found)
    return found[port]


async def list_ports(mgr: Manager, ref: str) -> list[dict[str, Any]]:
    return [view(e) for e in (await endpoints(mgr, ref)).values()]


async def url(mgr: Manager, ref: str, port: int) -> dict[str, Any]:
    return view(await endpoint(mgr, ref, port))


async def expose(mgr: Manager, ref: str, port: int) -> dict[str, Any]:
    """Make `port` reachable while the sandbox runs; a port already published is its view
    again (no event). A backend that publishes only at create refuses (exit 4) naming the
    profile's `ports:`. Recorded as `sandbox.port`, which is activity."""
    port = check_port(port)
    row, adapter = await _sandbox(mgr, ref)
    found = await adapter.port_endpoints(row["backend_ref"])
    if port in found or port in _exposed(mgr, row["id"]):  # already: no event again
        return view(found.get(port) or await adapter.expose_port(row["backend_ref"], port))
    made = await adapter.expose_port(row["backend_ref"], port)
    with mgr.db.write() as conn:  # exposed: that is activity (the idle clock starts again)
        conn.execute(SANDBOXES.update().where(SANDBOXES.c.id == row["id"])
                     .values(last_activity_at=mgr.now_iso()))
        mgr.event(conn, row["id"], EventType.SANDBOX_PORT, payload={
            "port": port, "scheme": made.scheme})
    return view(made)
