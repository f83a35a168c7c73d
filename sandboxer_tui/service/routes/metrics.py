"""Metrics: the Prometheus scrape (the service's own families and every running sandbox's
containers), one sandbox's live and stored readings, and every sandbox's samples."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from sandboxer import MetricSample
from sandboxer.core.rules.errors import BadInput
from sandboxer_tui.service import params, sse
from sandboxer_tui.service import schemas as s
from sandboxer_tui.service.deps import ERRORS, Admin, Metrics, Read

# a running sandbox's live reading for a scrape of /metrics: within a scrape's usual timeout
SCRAPE_READ_TIMEOUT = timedelta(seconds=5)

router = APIRouter()


@router.get("/metrics", tags=["health"], summary="Prometheus metrics (text format)",
            response_class=Response, responses={401: ERRORS[401],
                                                200: {"content": {"text/plain": {}}}})
async def prometheus(who: Admin, metrics: Metrics) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    metrics.count_sandboxes(await who.client.sandbox_counts())
    metrics.set_containers(await who.client.current_metrics(timeout=SCRAPE_READ_TIMEOUT))
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def _sample_frames(samples: AsyncIterator[MetricSample]) -> AsyncIterator[bytes]:
    async for sample in samples:
        yield sse.frame("sample", sample.to_dict())


@router.get("/v1/sandboxes/{ref}/metrics", tags=["sandboxes"], summary="A live reading",
            response_model=s.MetricSample | None, responses={
                **ERRORS, 200: {"description": "a sample (null: none yet); with `follow`, "
                                               "`sample` events as they come",
                                "content": {"application/json": {},
                                            "text/event-stream": {}}}})
async def sandbox_metrics(who: Read, ref: str, follow: bool = False) -> Response:
    box = await who.client.get(ref)
    if follow:
        return sse.stream(_sample_frames(await sse.primed(box.follow_metrics())))
    sample = await box.metrics()
    return JSONResponse(None if sample is None else sample.to_dict())


@router.get("/v1/sandboxes/{ref}/metrics/history", tags=["sandboxes"],
            summary="The stored readings", response_model=list[s.MetricSample],
            responses=ERRORS)
async def metric_history(who: Read, ref: str) -> JSONResponse:
    box = await who.client.get(ref)
    return JSONResponse([m.to_dict() for m in await box.metric_history()])


@router.get("/v1/metrics/samples", tags=["sandboxes"],
            summary="Stored samples of every sandbox since a time; with follow, live ones",
            response_model=list[s.MetricSample], responses={
                **ERRORS, 200: {"description": "the stored samples since `since`, oldest "
                                               "first; with `follow`, `sample` events of "
                                               "every running sandbox as they come (running "
                                               "ones looked for every `every` seconds)",
                                "content": {"application/json": {},
                                            "text/event-stream": {}}}})
async def all_metrics(who: Read,
                      since: Annotated[str | None, Query(
                          description="a duration ago (15m) or an ISO 8601 time")] = None,
                      follow: bool = False,
                      every: Annotated[float | None, Query(
                          ge=1, le=3600, description="with follow: seconds (default "
                                                     "5)")] = None) -> Response:
    if follow:
        if since is not None:
            raise BadInput("give since (stored samples) or follow (live ones), not both")
        samples = who.client.follow_all_metrics(every=every)
        return sse.stream(_sample_frames(await sse.primed(samples)))
    if every is not None:
        raise BadInput("every applies to follow=true only")
    if since is None:
        raise BadInput("since is needed: a duration ago (15m) or an ISO 8601 time; or "
                       "follow=true for live samples")
    found = await who.client.recent_metrics(params.since(since))
    return JSONResponse([m.to_dict() for m in found])
