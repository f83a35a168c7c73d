"""Per-sandbox metrics under the OpenTelemetry container semantic-convention names, one table
for both ways out: OTLP (sandboxer.core.observe.telemetry) and the Prometheus text format (`sbx metrics --all
--format prometheus`, the service's `/metrics`).

The Prometheus names are the OTLP names as OpenTelemetry's Prometheus compatibility rules
turn them (dots to underscores, the unit as a suffix, `_total` on counters), so a dashboard
reads the same series whether a collector converts the OTLP stream or Prometheus scrapes sbx
(docs/telemetry.md lists them).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sandboxer.core.rules.clock import from_iso

if TYPE_CHECKING:
    from sandboxer.core.lifecycle.manager import Manager

# the attributes every series carries, OTLP name -> Prometheus label
ATTRIBUTES = {"sbx.sandbox.id": "sbx_sandbox_id", "sbx.backend": "sbx_backend",
              "sbx.profile": "sbx_profile", "container.id": "container_id"}
UNIT_SUFFIXES = {"By": "bytes", "s": "seconds"}  # annotations ({cpu}) add none
# how long one sandbox's reading may take before it is left out of a one-shot read
READ_TIMEOUT = timedelta(seconds=10)


@dataclass(frozen=True)
class Family:
    name: str  # the OTLP name
    unit: str  # UCUM, as the semantic conventions give it
    kind: str  # "gauge" or "counter" (a cumulative total)
    description: str
    values: Callable[[Mapping[str, Any]], list[tuple[dict[str, str], float | int | None]]]

    @property
    def prometheus_name(self) -> str:
        """The family's Prometheus name (a counter's samples add `_total`)."""
        base = self.name.replace(".", "_")
        suffix = UNIT_SUFFIXES.get(self.unit)
        return f"{base}_{suffix}" if suffix and not base.endswith(suffix) else base

    @property
    def sample_name(self) -> str:
        return self.prometheus_name + ("_total" if self.kind == "counter" else "")

    def points(self, reading: Mapping[str, Any]) -> list[tuple[dict[str, str], float | int]]:
        """(attributes, value) for each known value of one sandbox's reading."""
        base = {name: str(reading.get(key) or "") for name, key in (
            ("sbx.sandbox.id", "sandbox_id"), ("sbx.backend", "backend"),
            ("sbx.profile", "profile"), ("container.id", "backend_ref"))}
        return [({**base, **extra}, value) for extra, value in self.values(reading)
                if value is not None]


def _one(key: str, scale: float = 1) -> Callable[[Mapping[str, Any]], list]:
    def value(reading: Mapping[str, Any]) -> list:
        raw = reading.get(key)
        return [({}, None if raw is None else (raw / scale if scale != 1 else raw))]
    return value


def _network(reading: Mapping[str, Any]) -> list:
    return [({"network.io.direction": "receive"}, reading.get("net_rx_bytes")),
            ({"network.io.direction": "transmit"}, reading.get("net_tx_bytes"))]


def _uptime(reading: Mapping[str, Any]) -> list:
    started, at = reading.get("started_at"), reading.get("time")
    if not started or not at:
        return [({}, None)]
    return [({}, max(0.0, (from_iso(at) - from_iso(started)).total_seconds()))]


FAMILIES = (
    Family("container.cpu.usage", "{cpu}", "gauge",
           "CPU in use, in CPUs (1 = one core busy), averaged over the backend's sample window",
           _one("cpu_pct", 100)),
    Family("container.memory.usage", "By", "gauge",
           "Memory in use, as the backend counts it (on Docker, as docker stats does)",
           _one("memory_bytes")),
    Family("container.network.io", "By", "counter",
           "Bytes received and sent on all the sandbox's interfaces since it started",
           _network),
    Family("container.uptime", "s", "gauge", "Time since the sandbox started", _uptime),
    Family("sbx.sandbox.memory.limit", "By", "gauge",
           "The sandbox's memory limit (no semantic convention has one)", _one("memory_limit")),
    Family("sbx.sandbox.pids", "{process}", "gauge",
           "Processes in the sandbox (no semantic convention has one)", _one("pids")),
)


def reading(row: Mapping[str, Any], view: Mapping[str, Any]) -> dict[str, Any]:
    """One sandbox's reading with what its series are labelled by."""
    return {"sandbox_id": row["id"], "name": row.get("name"), "backend": row["backend"],
            "profile": row.get("profile"), "backend_ref": row.get("backend_ref"),
            "started_at": row.get("started_at"), **{k: v for k, v in view.items()
                                                    if k != "sandbox_id"}}


async def read_all(mgr: Manager, timeout: timedelta = READ_TIMEOUT) -> list[dict[str, Any]]:
    """A live reading of every running sandbox whose backend reports metrics, read at once;
    one that gives none within `timeout` (or has ended meanwhile) is left out."""
    from sandboxer.adapters.base import Capability
    from sandboxer.core.observe import telemetry
    from sandboxer.core.rules.states import State

    telemetry.start_metrics()
    rows = []
    for row in mgr.list(state=State.RUNNING):
        with contextlib.suppress(Exception):  # a backend not installed here: not readable
            if mgr.adapter(row["backend"]).supports(Capability.METRICS):
                rows.append(row)

    async def one(row: Mapping[str, Any]) -> dict[str, Any] | None:
        with contextlib.suppress(Exception):
            async with (asyncio.timeout(timeout.total_seconds()),
                        contextlib.aclosing(mgr.metrics(row["id"])) as views):
                async for view in views:
                    return reading(row, view)
        return None

    found = [r for r in await asyncio.gather(*(one(row) for row in rows)) if r is not None]
    telemetry.record_readings(found)
    return found


class _Collector:
    def __init__(self, readings: list[Mapping[str, Any]]) -> None:
        self.readings = readings

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for family in FAMILIES:
            extra = sorted({key for reading in self.readings
                            for attributes, _ in family.points(reading)
                            for key in attributes if key not in ATTRIBUTES})
            labels = [*ATTRIBUTES.values(), *(key.replace(".", "_") for key in extra)]
            make = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
            metric = make(family.prometheus_name, f"{family.description} ({family.name})",
                          labels=labels)
            for reading in self.readings:
                for attributes, value in family.points(reading):
                    metric.add_metric([attributes.get(k, "") for k in (*ATTRIBUTES, *extra)],
                                      value)
            yield metric


def collector(readings: list[Mapping[str, Any]]) -> _Collector:
    """A prometheus-client collector of these readings (to register in a registry)."""
    return _Collector(readings)


def prometheus_text(readings: list[Mapping[str, Any]]) -> str:
    """The readings in the Prometheus text format, as node-exporter's textfile collector
    reads it: a registry of their own, prometheus-client's generate_latest."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector(readings))
    return generate_latest(registry).decode()
