"""Server-sent events (text/event-stream), the way streams leave the service: exec output,
logs, events, metrics. Output bytes travel as the records' `to_dict` shape: text where they
are UTF-8, else `{"base64": ...}`."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

MEDIA = "text/event-stream"
KEEPALIVE_S = 15.0  # a comment line this often, so proxies keep an idle stream open


def wants_stream(accept: str | None) -> bool:
    return MEDIA in (accept or "")


def asks_for_stream(scope: Any) -> bool:
    """Whether an HTTP request asks for a stream (`Accept: text/event-stream`, or
    `follow=true`): while it runs it holds one of the service's stream slots (limits.py)."""
    from starlette.requests import Request

    request = Request(scope)
    follow = request.query_params.get("follow", "").lower() in ("true", "1", "yes", "on", "t",
                                                                "y")
    return follow or wants_stream(request.headers.get("accept"))


def frame(event: str, data: Any, event_id: int | str | None = None) -> bytes:
    lines = [f"event: {event}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append(f"data: {json.dumps(data, separators=(',', ':'))}")
    return ("\n".join(lines) + "\n\n").encode()


async def with_keepalive(frames: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`frames`, with a comment line whenever none came for KEEPALIVE_S."""
    queue: asyncio.Queue = asyncio.Queue(maxsize=1)
    done = object()

    async def pump() -> None:
        try:
            async for item in frames:
                await queue.put(item)
        except Exception as exc:  # shown to the client as the stream's error event
            await queue.put(exc)
        finally:
            await queue.put(done)

    task = asyncio.create_task(pump())
    try:
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
            if item is done:
                return
            if isinstance(item, Exception):
                from sandboxer_tui.service.errors import error_body

                yield frame("error", error_body(item))
                return
            yield item
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if hasattr(frames, "aclose"):
            with contextlib.suppress(Exception):
                await frames.aclose()


PRIME_S = 2.0


async def primed(items: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """`items`, whose first item (or error) is awaited up to PRIME_S before the response
    starts: an error at once (no such sandbox, a state that forbids it) is then an HTTP
    error with its status, not an event in a stream that already said 200. Raises it."""
    first = asyncio.ensure_future(items.__anext__())
    done, _ = await asyncio.wait({first}, timeout=PRIME_S)
    if done and first.exception() is not None and not isinstance(first.exception(),
                                                                 StopAsyncIteration):
        raise first.exception()

    async def rest() -> AsyncIterator[Any]:
        try:
            try:
                yield await first
            except StopAsyncIteration:
                return
            async for item in items:
                yield item
        finally:
            if not first.done():
                first.cancel()
                await asyncio.gather(first, return_exceptions=True)
            if hasattr(items, "aclose"):
                with contextlib.suppress(Exception):
                    await items.aclose()

    return rest()


def stream(frames: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(with_keepalive(frames), media_type=MEDIA,
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
