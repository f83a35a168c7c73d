"""Per-sandbox metrics of every running sandbox, read through the Manager, under the
container metric families (sandboxer.core.observe.families): the Prometheus text format
(`sbx metrics --all --format prometheus`, the service's `/metrics`) and the readings OTLP
sends (sandboxer.core.observe.telemetry).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sandboxer.core.observe.families import ATTRIBUTES, FAMILIES

if TYPE_CHECKING:
    from sandboxer.core.lifecycle.manager import Manager

# how long one sandbox's reading may take before it is left out of a one-shot read
READ_TIMEOUT = timedelta(seconds=10)


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
