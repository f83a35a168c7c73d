"""`GET /metrics`: Prometheus text (prometheus-client), one registry per app. The service's
own families never take a sandbox id as a label value: every label (state, backend, kind,
result, reason, sink) has a handful of values. The per-sandbox container families
(`sandboxer.service.container_collector`) are the exception by nature: one series per running
sandbox; so are the proxy's (`sbx_proxy_*`): one per sandbox port that had traffic."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sandboxer.core.rules.errors import classify

T = TypeVar("T")


def _backend_of(result: Any) -> str:
    if isinstance(result, list):
        return _backend_of(result[0]) if result else "none"
    if isinstance(result, tuple) and result:
        return _backend_of(result[0])
    backend = getattr(result, "backend", None)
    if backend is None and isinstance(result, dict):
        backend = result.get("backend")
    return backend if isinstance(backend, str) else "none"


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.sandboxes = Gauge("sbx_sandboxes", "Sandboxes in the inventory, by state and "
                               "backend (destroyed ones included)", ["state", "backend"],
                               registry=self.registry)
        self.operations = Histogram(
            "sbx_operation_duration_seconds", "Operations the service ran, by kind, backend "
            "and result (ok, or the error's kind); _count counts them", ["kind", "backend",
                                                                          "result"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=self.registry)
        self.reaper_runs = Counter("sbx_reaper_runs", "Reaper cycles the service ran, by result",
                                   ["result"], registry=self.registry)
        self.reaped = Counter("sbx_reaped_sandboxes", "Sandboxes the service's reaper "
                              "destroyed, by reason (ttl, idle, max-ttl)", ["reason"],
                              registry=self.registry)
        self.deliveries = Counter("sbx_event_deliveries", "Events the service delivered to "
                                  "its sinks (the webhook, the JSON Lines file), by result",
                                  ["sink", "result"], registry=self.registry)
        # the service's proxy to sandboxes' ports (routes/ports.py): one series per sandbox
        # port that had traffic, as the container families have one per sandbox
        self.proxy_requests = Counter(
            "sbx_proxy_requests", "Requests (and WebSockets) the service's proxy passed to a "
            "sandbox's port, by sandbox, port and how they came (key, link)",
            ["sandbox", "port", "via"], registry=self.registry)
        self.proxy_bytes = Counter(
            "sbx_proxy_bytes", "Bytes of bodies and WebSocket messages the service's proxy "
            "carried to a sandbox's port (in) and back (out)", ["sandbox", "port", "direction"],
            registry=self.registry)
        # the per-sandbox container families, as `sbx metrics --all --format prometheus`
        # prints them (sandboxer.service.container_collector), read live at each scrape
        self.containers = _Containers()
        self.registry.register(self.containers)

    async def timed(self, kind: str, call: Awaitable[T], backend: str | None = None) -> T:
        """Await `call`, counting it with its duration under `kind`."""
        started = time.monotonic()
        try:
            result = await call
        except Exception as exc:
            self.operations.labels(kind, backend or "unknown", classify(exc)[1]).observe(
                time.monotonic() - started)
            raise
        self.operations.labels(kind, backend or _backend_of(result), "ok").observe(
            time.monotonic() - started)
        return result

    def observe(self, kind: str, backend: str, result: str, seconds: float) -> None:
        """An operation timed by its caller (a stream, which ends after its response began)."""
        self.operations.labels(kind, backend, result).observe(seconds)

    def count_sandboxes(self, counts: Iterable[dict[str, Any]]) -> None:
        self.sandboxes.clear()
        for row in counts:
            self.sandboxes.labels(row["state"], row["backend"]).set(row["count"])

    def set_containers(self, readings: list[dict[str, Any]]) -> None:
        self.containers.readings = readings

    def count_deliveries(self, reports: Iterable[dict[str, Any]]) -> None:
        for report in reports:
            if report.get("delivered"):
                self.deliveries.labels(report["sink"], "delivered").inc(report["delivered"])
            if report.get("parked"):
                self.deliveries.labels(report["sink"], "parked").inc(report["parked"])
            if report.get("error"):
                self.deliveries.labels(report["sink"], "failed").inc()


class _Containers:
    """The container families of the last readings, one scrape's."""

    def __init__(self) -> None:
        self.readings: list[dict[str, Any]] = []

    def collect(self) -> Any:
        from sandboxer.service import container_collector

        return container_collector(self.readings).collect()
