"""Sandboxes: create (once per idempotency key), list a page at a time, the inventory for
watchers, show, destroy, extend, and the state changes (touch, pause, resume)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import Field

from sandboxer.core.rules.errors import BadInput
from sandboxer.core.rules.profiles import refuse_host_files
from sandboxer.service import Scope
from sandboxer_tui.service import params
from sandboxer_tui.service import schemas as s
from sandboxer_tui.service.auth import Caller
from sandboxer_tui.service.deps import ERRORS, Metrics, Read, Service, Write
from sandboxer_tui.service.watching import matches

router = APIRouter(tags=["sandboxes"])


@router.post("/v1/sandboxes", status_code=201, summary="Create a sandbox",
             response_model=s.SandboxRecord, responses=ERRORS)
async def create(who: Write, metrics: Metrics, body: s.CreateSandbox,
                 idempotency_key: Annotated[str | None, Header()] = None) -> JSONResponse:
    if isinstance(body.profile, dict):
        who.require(Scope.ADMIN, "a profile document (it may read the service's "
                                 "environment); a write key names a profile")
        refuse_host_files(body.profile)
    who.may_own(body.owner)
    args = dict(ttl=body.ttl, name=body.name, labels=body.labels, owner=body.owner,
                task=body.task)
    if body.volumes:  # docs/volumes.md
        if idempotency_key is not None:
            raise BadInput("volumes cannot be given with an Idempotency-Key yet: name them "
                           "in the profile, or create without the key")
        args["volumes"] = body.volumes
    if idempotency_key is not None:
        made = who.client.create_idempotent(idempotency_key, body.profile,
                                            caller=who.principal, **args)
    else:
        made = who.client.create(body.profile, **args)
    box = await metrics.timed("create", made)
    return JSONResponse(box.to_dict(), status_code=201)


# `limit=all`: every sandbox in one answer, streamed a chunk of records at a time (docs/service.md)
ALL = "all"
STREAM_CHUNK = 1000


@router.get("/v1/sandboxes", summary="List sandboxes, a page at a time (or all, streamed)",
            response_model=s.SandboxPage, responses=ERRORS)
async def list_sandboxes(who: Read, state: str | None = None, backend: str | None = None,
                         label: Annotated[list[str], Query(
                             description="K=V; repeat for several (all must match)")] = [],  # noqa: B006
                         include_destroyed: bool = False,
                         limit: Annotated[Annotated[int, Field(ge=1, le=1000)] | Literal["all"],
                                          Query(description="a page's size, 1 to 1000; `all`: "
                                                "every sandbox in one streamed answer, "
                                                "next_cursor null")] = 100,
                         cursor: str | None = None) -> Response:
    if limit == ALL:
        if cursor is not None:
            raise BadInput("limit=all lists every sandbox from the first: give no cursor")
        boxes = await who.client.list(state=state, backend=backend,
                                      labels=params.labels(label),
                                      include_destroyed=include_destroyed)
        return StreamingResponse(_page_chunks([b.to_dict() for b in boxes]),
                                 media_type="application/json")
    boxes, following = await who.client.list_page(
        state=state, backend=backend, labels=params.labels(label),
        include_destroyed=include_destroyed, limit=limit, cursor=cursor)
    return JSONResponse({"items": [b.to_dict() for b in boxes], "next_cursor": following})


def _page_chunks(views: list[dict[str, Any]]) -> Iterator[bytes]:
    """The page document `{"items": [...], "next_cursor": null}`, encoded and sent a chunk of
    records at a time: the first bytes leave before the last record is encoded, and no
    document of the whole listing is held as one string (JSONResponse's encoding)."""
    encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False,
                              separators=(",", ":")).encode
    yield b'{"items":['
    for start in range(0, len(views), STREAM_CHUNK):
        chunk = ",".join(map(encode, views[start:start + STREAM_CHUNK]))
        yield (("," if start else "") + chunk).encode()
    yield b'],"next_cursor":null}'


@router.get("/v1/inventory",
            summary="Every sandbox, for a watcher: 304 when nothing changed since the ETag",
            response_model=list[s.WatchedSandbox], responses={
                **ERRORS, 304: {"description": "nothing changed since the listing whose "
                                               "ETag came in If-None-Match"}})
async def inventory(who: Read, service: Service, include_destroyed: bool = False,
                    if_none_match: Annotated[str | None, Header()] = None) -> Response:
    etag, items = await service.inventory.current(include_destroyed, who.tenant)
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if matches(if_none_match, etag):
        return Response(status_code=304, headers=headers)
    return JSONResponse(items, headers=headers)


@router.post("/v1/sandboxes/destroy", summary="Destroy several sandboxes", responses=ERRORS)
async def destroy_many(who: Write, metrics: Metrics, body: s.DestroyMany) -> dict[str, Any]:
    return await metrics.timed("destroy", who.client.destroy(*body.refs), backend="many")


@router.get("/v1/sandboxes/{ref}", summary="One sandbox", response_model=s.SandboxRecord,
            responses=ERRORS)
async def show(who: Read, ref: str, with_profile: bool = False) -> JSONResponse:
    box = await who.client.get(ref)
    if not with_profile:
        return JSONResponse(box.to_dict())
    resolved = await box.profile_resolved()
    return JSONResponse({**box.to_dict(), "profile_resolved": resolved})


@router.delete("/v1/sandboxes/{ref}", summary="Destroy a sandbox",
               response_model=s.Destroyed, responses=ERRORS)
async def destroy(who: Write, metrics: Metrics, ref: str) -> JSONResponse:
    box = await who.client.get(ref)
    ended_now = await metrics.timed("destroy", box.destroy(), backend=box.backend)
    return JSONResponse({**box.to_dict(), "already_destroyed": not ended_now})


@router.post("/v1/sandboxes/{ref}/extend", summary="Move the deadline",
             response_model=s.Extended, responses=ERRORS)
async def extend(who: Write, metrics: Metrics, ref: str, body: s.Extend) -> JSONResponse:
    box = await who.client.get(ref)
    capped = await metrics.timed("extend", box.extend(body.by), backend=box.backend)
    return JSONResponse({**box.to_dict(), "capped": capped})


async def _change(who: Caller, metrics: Metrics, ref: str, verb: str) -> JSONResponse:
    """touch, pause or resume: the record as it is after."""
    box = await who.client.get(ref)
    await metrics.timed(verb, getattr(box, verb)(), backend=box.backend)
    return JSONResponse(box.to_dict())


@router.post("/v1/sandboxes/{ref}/touch",
             summary="Record activity (the idle clock starts again)",
             response_model=s.SandboxRecord, responses=ERRORS)
async def touch(who: Write, metrics: Metrics, ref: str) -> JSONResponse:
    return await _change(who, metrics, ref, "touch")


@router.post("/v1/sandboxes/{ref}/pause", summary="Freeze a sandbox",
             response_model=s.SandboxRecord, responses=ERRORS)
async def pause(who: Write, metrics: Metrics, ref: str) -> JSONResponse:
    return await _change(who, metrics, ref, "pause")


@router.post("/v1/sandboxes/{ref}/resume", summary="Unfreeze a sandbox",
             response_model=s.SandboxRecord, responses=ERRORS)
async def resume(who: Write, metrics: Metrics, ref: str) -> JSONResponse:
    return await _change(who, metrics, ref, "resume")


@router.get("/v1/sandboxes/{ref}/origin", summary="The checkpoint it was restored from",
            response_model=s.Origin, responses=ERRORS)
async def origin(who: Read, ref: str) -> dict[str, str | None]:
    box = await who.client.get(ref)
    return {"restored_from": await box.origin()}
