"""Following the metrics of every running sandbox at once (`sbx metrics --all`, the
dashboard): one stream per sandbox, started and stopped as sandboxes come and go."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from adapters.base import Capability
from core.states import State

if TYPE_CHECKING:
    from core.manager import Manager


async def follow_all(mgr: Manager, on_sample: Callable[[dict[str, Any]], None],
                     stop: asyncio.Event, refresh: timedelta = timedelta(seconds=5)) -> None:
    streams: dict[str, asyncio.Task] = {}

    async def follow(sandbox_id: str) -> None:
        with contextlib.suppress(Exception):  # a sandbox that ends ends its stream
            async for view in mgr.metrics(sandbox_id, follow=True):
                on_sample(view)

    try:
        while not stop.is_set():
            running = {r["id"] for r in mgr.list(state=State.RUNNING)
                       if mgr.adapter(r["backend"]).supports(Capability.METRICS)}
            for sandbox_id in running - streams.keys():
                streams[sandbox_id] = asyncio.create_task(follow(sandbox_id))
            for sandbox_id in [s for s, t in streams.items() if s not in running or t.done()]:
                streams.pop(sandbox_id).cancel()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), refresh.total_seconds())
    finally:
        for task in streams.values():
            task.cancel()
        await asyncio.gather(*streams.values(), return_exceptions=True)
