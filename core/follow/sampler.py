"""Following the metrics of every running sandbox at once (`sbx metrics --all`, the
dashboard): one stream per sandbox, started and stopped as sandboxes come and go."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sandboxer.adapters.base import Capability
from sandboxer.core.rules.states import State

if TYPE_CHECKING:
    from sandboxer.core.lifecycle.manager import Manager


async def follow_all(mgr: Manager, on_sample: Callable[[dict[str, Any]], None],
                     stop: asyncio.Event, refresh: timedelta = timedelta(seconds=5)) -> None:
    """Each refresh reads only the rows changed since the last (core/follow/watch.py), so a
    fleet where nothing changes costs no more to follow at 10,000 sandboxes than at 10."""
    from sandboxer.core.follow import containermetrics
    from sandboxer.core.follow.watch import InventoryWatcher
    from sandboxer.core.observe import telemetry
    from sandboxer.core.store import tenancy

    telemetry.start_metrics()
    streams: dict[str, asyncio.Task] = {}
    running: dict[str, dict[str, Any]] = {}  # on a backend that reports metrics
    watcher = InventoryWatcher(mgr.db.url, owner=tenancy.current())

    def reports_metrics(backend: str) -> bool:
        try:
            return mgr.adapter(backend).supports(Capability.METRICS)
        except Exception:
            return False  # a backend not installed here: not readable

    async def follow(row: dict[str, Any]) -> None:
        try:
            with contextlib.suppress(Exception):  # a sandbox that ends ends its stream
                async for view in mgr.metrics(row["id"], follow=True):
                    on_sample(view)
                    telemetry.record_readings([containermetrics.reading(row, view)])
        finally:
            telemetry.forget(row["id"])

    try:
        while not stop.is_set():
            delta = watcher.read()
            if delta is None:  # no current database yet: every row, through the Manager
                delta = watcher.apply(mgr.list(pool_members=False))
            for sandbox_id in delta.removed:
                running.pop(sandbox_id, None)
            for row in (*delta.added, *delta.changed):
                if row["state"] == State.RUNNING and reports_metrics(row["backend"]):
                    running[row["id"]] = row
                else:
                    running.pop(row["id"], None)
            for sandbox_id in running.keys() - streams.keys():
                streams[sandbox_id] = asyncio.create_task(follow(running[sandbox_id]))
            for sandbox_id in [s for s, t in streams.items() if s not in running or t.done()]:
                streams.pop(sandbox_id).cancel()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), refresh.total_seconds())
    finally:
        watcher.close()
        if _on_a_running_loop():  # not when collected after its loop ended: nothing runs
            for task in streams.values():
                task.cancel()
            await asyncio.gather(*streams.values(), return_exceptions=True)


def _on_a_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def samples_of_all(mgr: Manager, refresh: timedelta = timedelta(seconds=5),
                         ) -> AsyncIterator[dict[str, Any]]:
    """follow_all as an async iterator, for the library: it stops when the caller does."""
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    stop = asyncio.Event()
    task = asyncio.create_task(follow_all(mgr, queue.put_nowait, stop, refresh))
    getter: asyncio.Future | None = None
    try:
        while True:
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                task.result()  # follow_all ended: its error, if any
                return
            yield getter.result()
    finally:
        if getter is not None:  # the caller stopped while we waited: no get left behind
            getter.cancel()
        stop.set()
        with contextlib.suppress(Exception):
            await task
