"""The container metric families: each OpenTelemetry container semantic-convention name with
its unit, kind, description and how to read its values from one sandbox's reading. One table
for both ways out: OTLP (sandboxer.core.observe.telemetry) and the Prometheus text format
(sandboxer.core.follow.containermetrics); docs/telemetry.md lists them.

The Prometheus names are the OTLP names as OpenTelemetry's Prometheus compatibility rules
turn them (dots to underscores, the unit as a suffix, `_total` on counters), so a dashboard
reads the same series whether a collector converts the OTLP stream or Prometheus scrapes sbx.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sandboxer.core.rules.clock import from_iso

# the attributes every series carries, OTLP name -> Prometheus label
ATTRIBUTES = {"sbx.sandbox.id": "sbx_sandbox_id", "sbx.backend": "sbx_backend",
              "sbx.profile": "sbx_profile", "container.id": "container_id"}
UNIT_SUFFIXES = {"By": "bytes", "s": "seconds"}  # annotations ({cpu}) add none


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
