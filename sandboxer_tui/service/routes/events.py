"""The event log: read it (or follow it as a stream), check its hash chain, and deliver it to
the sinks (now, what a sink refused, again)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query
from fastapi.responses import JSONResponse, Response

from sandboxer import Event
from sandboxer_tui.service import params, sse
from sandboxer_tui.service import schemas as s
from sandboxer_tui.service.deps import ERRORS, Accept, Admin, Metrics, Read

router = APIRouter(tags=["events"])


@router.get("/v1/events", summary="Events, oldest first",
            response_model=list[s.Event], responses={
                **ERRORS, 200: {"description": "the events; with `Accept: text/event-stream`"
                                               ", new ones as they are written (each with its "
                                               "id: a reconnect resumes from Last-Event-ID)",
                                "content": {"application/json": {},
                                            "text/event-stream": {}}}})
async def events(who: Read, sandbox: str | None = None,
                 since: Annotated[str | None, Query(
                     description="a duration ago (15m) or an ISO 8601 time")] = None,
                 after: Annotated[int | None, Query(ge=0, description="an event id")] = None,
                 last_event_id: Annotated[str | None, Header()] = None,
                 accept: Accept = None) -> Response:
    ref = (await who.client.get(sandbox)).id if sandbox else None
    after = params.after(after, last_event_id)
    if sse.wants_stream(accept):
        return sse.stream(_event_frames(who.client.follow_events(ref, after=after)))
    found = await who.client.events(ref, since=params.since(since), after=after)
    return JSONResponse([e.to_dict() for e in found])


async def _event_frames(events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
    async for event in events:
        yield sse.frame(str(event.type), event.to_dict(), event_id=event.id)


@router.get("/v1/events/verify", summary="Check the hash chain", responses=ERRORS)
async def verify(who: Read) -> dict[str, Any]:
    return await who.client.verify_events()


@router.post("/v1/events/deliver", summary="Deliver to the sinks now", responses=ERRORS)
async def deliver(who: Admin, metrics: Metrics) -> list[dict[str, Any]]:
    reports = await who.client.deliver_events()
    metrics.count_deliveries(reports)
    return reports


@router.get("/v1/events/undelivered", summary="What a sink refused", responses=ERRORS)
async def undelivered(who: Admin) -> list[dict[str, Any]]:
    return await who.client.undelivered()


@router.post("/v1/events/redeliver", summary="Try parked events again", responses=ERRORS)
async def redeliver(who: Admin,
                    body: Annotated[s.Redeliver | None, Body()] = None) -> list[dict]:
    return await who.client.redeliver(body.event_ids if body else None)
