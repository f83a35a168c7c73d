"""The service's timer (`sbx serve --reap-every`): a reaper cycle, then delivery, on a
period, counted in the service's metrics. Several services on one database share the work
through the sandboxes' and the sinks' leases."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from sandboxer import AsyncSandboxer, ReapReport
from sandboxer import Error as SbxError
from sandboxer_tui.service.errors import error_body
from sandboxer_tui.service.metrics import ServiceMetrics

log = logging.getLogger("sbx.serve")


async def run(client: AsyncSandboxer, every: timedelta, stop: asyncio.Event,
              metrics: ServiceMetrics) -> None:
    """Reap and deliver every `every` until `stop` is set."""
    def on_report(outcome: ReapReport | SbxError) -> None:
        if isinstance(outcome, ReapReport):
            metrics.reaper_runs.labels("failed" if outcome.failed else "ok").inc()
            for sandbox_id in outcome.destroyed:
                metrics.reaped.labels(outcome.reasons.get(sandbox_id, "unknown")).inc()
            for failure in outcome.failed:
                log.warning("reap: %s: %s", failure.get("id"), failure.get("error"))
        else:
            if not str(outcome).startswith("delivery to "):
                metrics.reaper_runs.labels(outcome.kind).inc()
            log.warning("reap: %s", error_body(outcome)["error"]["message"])

    await client.run_reaper(every, stop=stop, on_report=on_report,
                            on_delivery=metrics.count_deliveries)
