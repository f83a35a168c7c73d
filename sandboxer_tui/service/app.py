"""The routes of `sbx serve` (docs/service.md). Each parses, calls the library through the
caller's client (acting as the key's owner) and shows the record's `to_dict()`; errors
leave through errors.py, the one mapping to HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from sandboxer import AsyncSandboxer, ExecExit, OutputChunk, ReapReport
from sandboxer._records import output_doc
from sandboxer.core.rules.errors import BadInput, Conflict, SbxError
from sandboxer.core.rules.profiles import refuse_host_files
from sandboxer.core.store.apikeys import Scope
from sandboxer_tui.service import schemas as s
from sandboxer_tui.service import sse
from sandboxer_tui.service.auth import ADMIN, READ, WRITE, Caller, Refused
from sandboxer_tui.service.errors import error_body, error_response, refusal
from sandboxer_tui.service.metrics import ServiceMetrics
from sandboxer_tui.service.watching import InventoryVersions, matches

log = logging.getLogger("sbx.serve")
API_VERSION = "1"
ARCHIVE = "application/gzip"
EXPORT_CHUNK = 1024**2  # an exported archive leaves in pieces this big
# a running sandbox's live reading for a scrape of /metrics: within a scrape's usual timeout
SCRAPE_READ_TIMEOUT = timedelta(seconds=5)

ERRORS = {status: {"model": s.ErrorBody, "description": what} for status, what in (
    (400, "bad input: nothing was written"), (401, "no API key, or not one of ours"),
    (403, "the key's scope does not allow it"), (404, "no such sandbox, checkpoint or profile"),
    (409, "the state does not allow it, or another process holds it"),
    (422, "the request does not follow this document"),
    (503, "a backend or the database cannot be reached"))}

Read = Annotated[Caller, Depends(READ)]
Write = Annotated[Caller, Depends(WRITE)]
Admin = Annotated[Caller, Depends(ADMIN)]
Accept = Annotated[str | None, Header(include_in_schema=False)]


def build_app(client: AsyncSandboxer, *, actor: str, socket_path: str | None = None,
              reap_every: timedelta | None = None, evidence_key: str | None = None) -> FastAPI:
    """The service over `client` (which the caller owns and closes). With `reap_every`, a
    reaper cycle and a delivery run on that timer while the app runs. With `evidence_key`
    (an ed25519 private key file, read at each use), it signs evidence on request."""
    metrics = ServiceMetrics()
    inventory = InventoryVersions(client)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stop = asyncio.Event()
        task = None
        if reap_every is not None:
            task = asyncio.create_task(_reaper(client, reap_every, stop, metrics))
        try:
            yield
        finally:
            stop.set()
            if task is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(task, 30)
            await inventory.close()

    from importlib.metadata import version

    app = FastAPI(title="Sandboxer", version=version("sandboxer"), lifespan=lifespan,
                  openapi_url="/openapi.json", docs_url=None, redoc_url=None,
                  description="Short-lived sandboxes from profiles, on deadlines, on record: "
                              "the `sandboxer` library over HTTP (docs/service.md).")
    app.state.client = client
    app.state.actor = actor
    app.state.socket_path = socket_path
    app.state.metrics = metrics
    app.state.inventory = inventory
    app.state.evidence_key = evidence_key
    _errors(app)
    _routes(app, metrics)
    _document_keys(app)
    _limits(app)
    return app


def _limits(app: FastAPI) -> None:
    """The service's limits (limits.py), from the settings as it starts: bad ones stop it."""
    from sandboxer.core.rules import settings
    from sandboxer_tui.service.limits import Limits, Streams

    app.state.max_exec_output = settings.serve_max_exec_output()
    app.add_middleware(Limits, max_body=settings.serve_max_body(),
                       max_upload=settings.serve_max_upload(),
                       streams=Streams(settings.serve_max_streams(),
                                       settings.serve_max_streams_per_key()),
                       max_connections=settings.serve_max_connections())


def _document_keys(app: FastAPI) -> None:
    """The document says every route but /healthz and /readyz takes a Bearer key."""
    make = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = make()
            doc.setdefault("components", {})["securitySchemes"] = {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "an API key (sbx api-keys create); none over the unix socket"}}
            doc["security"] = [{"bearer": []}]
            for path in ("/healthz", "/readyz"):
                for operation in doc["paths"].get(path, {}).values():
                    operation["security"] = []
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi


def _errors(app: FastAPI) -> None:
    @app.exception_handler(SbxError)
    async def sbx_error(request: Request, exc: SbxError) -> JSONResponse:
        from sandboxer.core.rules.errors import database_cause

        cause = database_cause(exc)
        if cause is not None:  # the body says one line; the statement stays in this log
            log.warning("%s %s: %s", request.method, request.url.path, exc,
                        exc_info=(type(cause), cause, cause.__traceback__))
        return error_response(exc)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> JSONResponse:
        if exc.status == 401:
            return refusal(401, "unauthorized", str(exc), **{"WWW-Authenticate": "Bearer"})
        return refusal(403, "forbidden", str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        from sandboxer.core.rules.errors import plain_problems

        problems = plain_problems([{**e, "loc": e["loc"][:1]} if e["type"] == "json_invalid"
                                   else e for e in exc.errors()])
        return JSONResponse({"error": {"code": 2, "kind": "bad_input",
                                       "message": "; ".join(problems)[:2000],
                                       "problems": problems[:50]}}, status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = {404: "not_found", 405: "bad_input"}.get(exc.status_code, "bad_input")
        code = 3 if exc.status_code == 404 else 2
        return JSONResponse({"error": {"code": code, "kind": kind, "message": str(exc.detail)}},
                            status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        return JSONResponse({"error": {"code": 1, "kind": "failed", "message":
                                       f"the service failed ({type(exc).__name__}); its log "
                                       "says more"}}, status_code=500)


def _since(text: str | None) -> datetime | timedelta | None:
    """A duration ago ("15m") or an ISO 8601 time."""
    if text is None:
        return None
    from sandboxer.core.rules.durations import parse_duration

    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return parse_duration(text, "since")
    if moment.tzinfo is None:
        raise BadInput(f"bad since {text!r}: give a duration (15m) or a time with its zone")
    return moment


def _labels(texts: list[str]) -> dict[str, str] | None:
    from sandboxer.core.rules.labels import parse_labels

    return parse_labels(texts) or None


def _after(after: int | None, last_event_id: str | None) -> int | None:
    if last_event_id is not None:
        try:
            return int(last_event_id)
        except ValueError:
            raise BadInput(f"bad Last-Event-ID {last_event_id[:40]!r}: an event id") from None
    return after


async def _exec_frames(items: AsyncIterator[OutputChunk | ExecExit], metrics: ServiceMetrics,
                       backend: str) -> AsyncIterator[bytes]:
    import time

    from sandboxer.core.rules.errors import classify

    started, result = time.monotonic(), "ok"
    try:
        async for item in items:
            if isinstance(item, OutputChunk):
                yield sse.frame(item.stream, {"data": output_doc(item.data)})
            else:
                yield sse.frame("exit", item.to_dict())
    except Exception as exc:
        result = classify(exc)[1]
        raise
    finally:
        metrics.observe("exec", backend, result, time.monotonic() - started)


async def _capped_exec(items: AsyncIterator[OutputChunk | ExecExit],
                       cap: int) -> dict[str, Any]:
    """An exec's JSON reply: stdout and stderr each kept up to `cap` bytes, the rest counted
    but not kept (32 MiB of output once cost the service 610 MB), and whether each was cut."""
    kept = {"stdout": bytearray(), "stderr": bytearray()}
    sizes = {"stdout": 0, "stderr": 0}
    end: ExecExit | None = None
    async for item in items:
        if isinstance(item, OutputChunk):
            sizes[item.stream] += len(item.data)
            room = cap - len(kept[item.stream])
            if room > 0:
                kept[item.stream] += item.data[:room]
        else:
            end = item
    if end is None:
        from sandboxer.core.rules.errors import OperationFailed

        raise OperationFailed("the command's output ended without its exit status")
    reply = end.to_dict()
    for name in ("stdout", "stderr"):
        data, cut = bytes(kept[name]), sizes[name] > len(kept[name])
        if cut:  # not a character split in two at the cut: that would make it all base64
            try:
                data.decode()
            except UnicodeDecodeError as exc:
                if exc.reason == "unexpected end of data":
                    data = data[:exc.start]
        reply.update({name: output_doc(data), f"{name}_bytes": sizes[name],
                      f"{name}_truncated": cut})
    return reply


async def _log_frames(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield sse.frame("log", {"data": output_doc(chunk)})
    yield sse.frame("end", {})


async def _event_frames(events) -> AsyncIterator[bytes]:
    async for event in events:
        yield sse.frame(str(event.type), event.to_dict(), event_id=event.id)


async def _metric_frames(samples) -> AsyncIterator[bytes]:
    async for sample in samples:
        yield sse.frame("sample", sample.to_dict())


def _routes(app: FastAPI, metrics: ServiceMetrics) -> None:  # noqa: C901 (one per route)
    timed = metrics.timed
    sandbox_tag, ckpt_tag, event_tag = ["sandboxes"], ["checkpoints"], ["events"]

    # -- health ------------------------------------------------------------------------------

    @app.get("/healthz", tags=["health"], summary="The process answers")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], summary="The database answers, schema current",
             responses={503: ERRORS[503]})
    async def readyz(request: Request) -> dict[str, str]:
        await request.app.state.client.ready()
        return {"status": "ready"}

    @app.get("/metrics", tags=["health"], summary="Prometheus metrics (text format)",
             response_class=Response, responses={401: ERRORS[401],
                                                 200: {"content": {"text/plain": {}}}})
    async def prometheus(who: Admin) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        metrics.count_sandboxes(await who.client.sandbox_counts())
        metrics.set_containers(await who.client.current_metrics(timeout=SCRAPE_READ_TIMEOUT))
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # -- sandboxes ---------------------------------------------------------------------------

    @app.post("/v1/sandboxes", tags=sandbox_tag, status_code=201, summary="Create a sandbox",
              response_model=s.SandboxRecord, responses=ERRORS)
    async def create(who: Write, body: s.CreateSandbox,
                     idempotency_key: Annotated[str | None, Header()] = None) -> JSONResponse:
        if isinstance(body.profile, dict):
            who.require(Scope.ADMIN, "a profile document (it may read the service's "
                                     "environment); a write key names a profile")
            refuse_host_files(body.profile)
        who.may_own(body.owner)
        args = dict(ttl=body.ttl, name=body.name, labels=body.labels, owner=body.owner,
                    task=body.task)
        if idempotency_key is not None:
            made = who.client.create_idempotent(idempotency_key, body.profile,
                                                caller=who.principal, **args)
        else:
            made = who.client.create(body.profile, **args)
        box = await timed("create", made)
        return JSONResponse(box.to_dict(), status_code=201)

    @app.get("/v1/sandboxes", tags=sandbox_tag, summary="List sandboxes, a page at a time",
             response_model=s.SandboxPage, responses=ERRORS)
    async def list_sandboxes(who: Read, state: str | None = None, backend: str | None = None,
                             label: Annotated[list[str], Query(
                                 description="K=V; repeat for several (all must match)")] = [],  # noqa: B006
                             include_destroyed: bool = False,
                             limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                             cursor: str | None = None) -> JSONResponse:
        boxes, following = await who.client.list_page(
            state=state, backend=backend, labels=_labels(label),
            include_destroyed=include_destroyed, limit=limit, cursor=cursor)
        return JSONResponse({"items": [b.to_dict() for b in boxes], "next_cursor": following})

    @app.get("/v1/inventory", tags=sandbox_tag,
             summary="Every sandbox, for a watcher: 304 when nothing changed since the ETag",
             response_model=list[s.WatchedSandbox], responses={
                 **ERRORS, 304: {"description": "nothing changed since the listing whose "
                                                "ETag came in If-None-Match"}})
    async def inventory(who: Read, request: Request, include_destroyed: bool = False,
                        if_none_match: Annotated[str | None, Header()] = None) -> Response:
        etag, items = await request.app.state.inventory.current(include_destroyed, who.tenant)
        headers = {"ETag": etag, "Cache-Control": "no-cache"}
        if matches(if_none_match, etag):
            return Response(status_code=304, headers=headers)
        return JSONResponse(items, headers=headers)

    @app.post("/v1/sandboxes/destroy", tags=sandbox_tag, summary="Destroy several sandboxes",
              responses=ERRORS)
    async def destroy_many(who: Write, body: s.DestroyMany) -> dict[str, Any]:
        return await timed("destroy", who.client.destroy(*body.refs), backend="many")

    @app.get("/v1/sandboxes/{ref}", tags=sandbox_tag, summary="One sandbox",
             response_model=s.SandboxRecord, responses=ERRORS)
    async def show(who: Read, ref: str, with_profile: bool = False) -> JSONResponse:
        box = await who.client.get(ref)
        if not with_profile:
            return JSONResponse(box.to_dict())
        resolved = await box.profile_resolved()
        return JSONResponse({**box.to_dict(), "profile_resolved": resolved})

    @app.delete("/v1/sandboxes/{ref}", tags=sandbox_tag, summary="Destroy a sandbox",
                response_model=s.Destroyed, responses=ERRORS)
    async def destroy(who: Write, ref: str) -> JSONResponse:
        box = await who.client.get(ref)
        was = box.to_dict()["state"] == "destroyed"
        await timed("destroy", box.destroy(), backend=box.backend)
        return JSONResponse({**box.to_dict(), "already_destroyed": was})

    @app.post("/v1/sandboxes/{ref}/extend", tags=sandbox_tag, summary="Move the deadline",
              response_model=s.Extended, responses=ERRORS)
    async def extend(who: Write, ref: str, body: s.Extend) -> JSONResponse:
        box = await who.client.get(ref)
        capped = await timed("extend", box.extend(body.by), backend=box.backend)
        return JSONResponse({**box.to_dict(), "capped": capped})

    def state_change(verb: str, summary: str) -> None:
        @app.post(f"/v1/sandboxes/{{ref}}/{verb}", tags=sandbox_tag, summary=summary,
                  response_model=s.SandboxRecord, responses=ERRORS, name=verb)
        async def change(who: Write, ref: str) -> JSONResponse:
            box = await who.client.get(ref)
            await timed(verb, getattr(box, verb)(), backend=box.backend)
            return JSONResponse(box.to_dict())

    state_change("touch", "Record activity (the idle clock starts again)")
    state_change("pause", "Freeze a sandbox")
    state_change("resume", "Unfreeze a sandbox")

    @app.post("/v1/sandboxes/{ref}/exec", tags=sandbox_tag, summary="Run a command",
              response_model=s.ExecResult, responses={
                  **ERRORS, 200: {"description": "the result; with `Accept: text/event-stream`"
                                                 ", `stdout` and `stderr` events as the output "
                                                 "comes, then one `exit` event",
                                  "content": {"text/event-stream": {}}}})
    async def exec_(who: Write, request: Request, ref: str, body: s.Exec,
                    accept: Accept = None) -> Response:
        box = await who.client.get(ref)
        if sse.wants_stream(accept):
            items = await sse.primed(box.exec_stream(body.argv, timeout=body.timeout))
            return sse.stream(_exec_frames(items, metrics, box.backend))
        # the stream form, kept up to the cap: the whole output never sits in the service
        result = await timed("exec", _capped_exec(box.exec_stream(
            body.argv, timeout=body.timeout), request.app.state.max_exec_output),
            backend=box.backend)
        return JSONResponse(result)

    @app.get("/v1/sandboxes/{ref}/logs", tags=sandbox_tag, summary="The main process's output",
             response_class=Response, responses={
                 **ERRORS, 200: {"description": "the output; with `follow` or `Accept: "
                                                "text/event-stream`, `log` events as it comes "
                                                "(`end` when it ends)",
                                 "content": {"application/octet-stream": {},
                                             "text/event-stream": {}}}})
    async def logs(who: Read, ref: str, follow: bool = False,
                   tail: Annotated[int | None, Query(ge=0)] = None,
                   accept: Accept = None) -> Response:
        if follow:
            who.require(Scope.WRITE, "following logs (it counts as activity)")
        box = await who.client.get(ref)
        chunks = await sse.primed(box.logs(follow=follow, tail=tail))
        if follow or sse.wants_stream(accept):
            return sse.stream(_log_frames(chunks))
        return StreamingResponse(chunks, media_type="application/octet-stream")

    @app.get("/v1/sandboxes/{ref}/metrics", tags=sandbox_tag, summary="A live reading",
             response_model=s.MetricSample | None, responses={
                 **ERRORS, 200: {"description": "a sample (null: none yet); with `follow`, "
                                                "`sample` events as they come",
                                 "content": {"application/json": {},
                                             "text/event-stream": {}}}})
    async def sandbox_metrics(who: Read, ref: str, follow: bool = False) -> Response:
        box = await who.client.get(ref)
        if follow:
            return sse.stream(_metric_frames(await sse.primed(box.follow_metrics())))
        sample = await box.metrics()
        return JSONResponse(None if sample is None else sample.to_dict())

    @app.get("/v1/sandboxes/{ref}/metrics/history", tags=sandbox_tag,
             summary="The stored readings", response_model=list[s.MetricSample],
             responses=ERRORS)
    async def metric_history(who: Read, ref: str) -> JSONResponse:
        box = await who.client.get(ref)
        return JSONResponse([m.to_dict() for m in await box.metric_history()])

    @app.get("/v1/sandboxes/{ref}/origin", tags=sandbox_tag,
             summary="The checkpoint it was restored from", response_model=s.Origin,
             responses=ERRORS)
    async def origin(who: Read, ref: str) -> dict[str, str | None]:
        box = await who.client.get(ref)
        return {"restored_from": await box.origin()}

    @app.get("/v1/metrics/samples", tags=sandbox_tag,
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
            return sse.stream(_metric_frames(await sse.primed(samples)))
        if every is not None:
            raise BadInput("every applies to follow=true only")
        if since is None:
            raise BadInput("since is needed: a duration ago (15m) or an ISO 8601 time; or "
                           "follow=true for live samples")
        found = await who.client.recent_metrics(_since(since))
        return JSONResponse([m.to_dict() for m in found])

    @app.get("/v1/sandboxes/{ref}/evidence", tags=sandbox_tag,
             summary="The supervision evidence bundle", responses=ERRORS)
    async def evidence(who: Read, request: Request, ref: str,
                       signed: Annotated[bool, Query(description=(
                           "a DSSE envelope signed with the service's key (sbx serve "
                           "--evidence-key); 409 when it has none"))] = False) -> JSONResponse:
        box = await who.client.get(ref)
        key = request.app.state.evidence_key
        if signed and key is None:
            raise Conflict("this service signs no evidence: start it with sbx serve "
                           "--evidence-key PATH (or sign with your own key)")
        return JSONResponse(await box.evidence(sign=key if signed else None))

    @app.get("/v1/evidence/key", tags=sandbox_tag, summary="The public key the service signs "
             "evidence with", responses=ERRORS)
    async def evidence_key(who: Read, request: Request) -> dict[str, str]:
        key = request.app.state.evidence_key
        if key is None:
            raise Conflict("this service signs no evidence (sbx serve --evidence-key PATH)")
        from sandboxer.core.observe.signing import keyid, public_key_pem

        pem = public_key_pem(key)
        return {"keyid": keyid(pem.encode()), "public_key": pem}

    @app.post("/v1/sandboxes/{ref}/snapshot", tags=ckpt_tag, status_code=201,
              summary="Save a sandbox's filesystem as a checkpoint",
              response_model=s.CheckpointRecord, responses=ERRORS)
    async def snapshot(who: Write, ref: str,
                       body: Annotated[s.Snapshot | None, Body()] = None) -> JSONResponse:
        box = await who.client.get(ref)
        ckpt = await timed("snapshot", box.snapshot(body.name if body else None),
                           backend=box.backend)
        return JSONResponse(ckpt.to_dict(), status_code=201)

    # -- checkpoints -------------------------------------------------------------------------

    @app.get("/v1/checkpoints", tags=ckpt_tag, summary="Checkpoints, oldest first",
             response_model=list[s.CheckpointRecord], responses=ERRORS)
    async def checkpoints(who: Read, sandbox: str | None = None) -> JSONResponse:
        ref = (await who.client.get(sandbox)).id if sandbox else None
        return JSONResponse([c.to_dict() for c in await who.client.checkpoints(ref)])

    @app.post("/v1/checkpoints/prune", tags=ckpt_tag, summary="Remove expired checkpoints",
              responses=ERRORS)
    async def prune(who: Admin) -> dict[str, list[str]]:
        return {"removed": await timed("prune", who.client.prune_checkpoints(),
                                       backend="many")}

    @app.post("/v1/checkpoints/import", tags=ckpt_tag, status_code=201,
              summary="Bring in an archive made by export", response_model=s.CheckpointRecord,
              openapi_extra={"requestBody": {"required": True, "content": {
                  ARCHIVE: {"schema": {"type": "string", "format": "binary"}}}}},
              responses=ERRORS)
    async def import_checkpoint(who: Write, request: Request,
                                name: str | None = None) -> JSONResponse:
        folder = tempfile.mkdtemp(prefix="sbx-import-")
        path = os.path.join(folder, "checkpoint.tar.gz")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:  # capped as it comes (limits.py: 413)
                async for piece in request.stream():
                    out.write(piece)
            ckpt = await timed("import", who.client.import_checkpoint(path, name=name))
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        return JSONResponse(ckpt.to_dict(), status_code=201)

    @app.get("/v1/checkpoints/{ref}", tags=ckpt_tag, summary="One checkpoint",
             response_model=s.CheckpointRecord, responses=ERRORS)
    async def checkpoint(who: Read, ref: str) -> JSONResponse:
        return JSONResponse((await who.client.checkpoint(ref)).to_dict())

    @app.delete("/v1/checkpoints/{ref}", tags=ckpt_tag,
                summary="Remove a checkpoint and its artifact",
                response_model=s.CheckpointRecord, responses=ERRORS)
    async def remove_checkpoint(who: Write, ref: str) -> JSONResponse:
        ckpt = await who.client.checkpoint(ref)
        await timed("remove-checkpoint", ckpt.remove(), backend=ckpt.backend)
        return JSONResponse(ckpt.to_dict())

    @app.post("/v1/checkpoints/{ref}/restore", tags=ckpt_tag, status_code=201,
              summary="A new sandbox from a checkpoint", response_model=s.SandboxRecord,
              responses=ERRORS)
    async def restore(who: Write, ref: str,
                      body: Annotated[s.Restore | None, Body()] = None) -> JSONResponse:
        body = body or s.Restore()
        who.may_own(body.owner)
        ckpt = await who.client.checkpoint(ref)
        box = await timed("restore", ckpt.restore(
            ttl=body.ttl, name=body.name, labels=body.labels, owner=body.owner,
            task=body.task, profile=body.profile))
        return JSONResponse(box.to_dict(), status_code=201)

    @app.post("/v1/checkpoints/{ref}/fork", tags=ckpt_tag, status_code=201,
              summary="n sandboxes from a checkpoint", response_model=list[s.SandboxRecord],
              responses=ERRORS)
    async def fork(who: Write, ref: str, body: s.Fork) -> JSONResponse:
        who.may_own(body.owner)
        ckpt = await who.client.checkpoint(ref)
        boxes = await timed("fork", ckpt.fork(body.n, ttl=body.ttl, labels=body.labels,
                                               owner=body.owner, task=body.task))
        return JSONResponse([b.to_dict() for b in boxes], status_code=201)

    @app.get("/v1/checkpoints/{ref}/archive", tags=ckpt_tag,
             summary="Export: the checkpoint as a portable .tar.gz", response_class=Response,
             responses={**ERRORS, 200: {"content": {ARCHIVE: {}}}})
    async def export(who: Write, ref: str) -> Response:
        ckpt = await who.client.checkpoint(ref)
        folder = tempfile.mkdtemp(prefix="sbx-export-")
        path = os.path.join(folder, "checkpoint.tar.gz")
        try:
            await timed("export", ckpt.export(path), backend=ckpt.backend)
            archive = open(path, "rb")  # noqa: ASYNC230, SIM115 (a local file, read below)
        finally:  # gone from the disk at once; the open file reads on until it is closed
            with contextlib.suppress(OSError):
                os.unlink(path)
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        size = os.fstat(archive.fileno()).st_size

        async def pieces() -> AsyncIterator[bytes]:
            """The archive a piece at a time: a 158 MB export once held it all in memory."""
            with archive:
                while piece := await asyncio.to_thread(archive.read, EXPORT_CHUNK):
                    yield piece

        return StreamingResponse(pieces(), media_type=ARCHIVE, headers={
            "Content-Length": str(size),
            "Content-Disposition": f'attachment; filename="{ckpt.id}.tar.gz"'})

    # -- events ------------------------------------------------------------------------------

    @app.get("/v1/events", tags=event_tag, summary="Events, oldest first",
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
        after = _after(after, last_event_id)
        if sse.wants_stream(accept):
            return sse.stream(_event_frames(who.client.follow_events(ref, after=after)))
        found = await who.client.events(ref, since=_since(since), after=after)
        return JSONResponse([e.to_dict() for e in found])

    @app.get("/v1/events/verify", tags=event_tag, summary="Check the hash chain",
             responses=ERRORS)
    async def verify(who: Read) -> dict[str, Any]:
        return await who.client.verify_events()

    @app.post("/v1/events/deliver", tags=event_tag, summary="Deliver to the sinks now",
              responses=ERRORS)
    async def deliver(who: Admin) -> list[dict[str, Any]]:
        reports = await who.client.deliver_events()
        metrics.count_deliveries(reports)
        return reports

    @app.get("/v1/events/undelivered", tags=event_tag, summary="What a sink refused",
             responses=ERRORS)
    async def undelivered(who: Admin) -> list[dict[str, Any]]:
        return await who.client.undelivered()

    @app.post("/v1/events/redeliver", tags=event_tag, summary="Try parked events again",
              responses=ERRORS)
    async def redeliver(who: Admin,
                        body: Annotated[s.Redeliver | None, Body()] = None) -> list[dict]:
        return await who.client.redeliver(body.event_ids if body else None)

    # -- the reaper --------------------------------------------------------------------------

    @app.post("/v1/reap", tags=["reaper"], summary="One reconcile-and-reap cycle now",
              responses=ERRORS)
    async def reap(who: Admin, body: Annotated[s.Reap | None, Body()] = None) -> dict:
        body = body or s.Reap()
        report = await who.client.reap(body.dry_run, orphans=body.orphans,
                                       timeout=body.timeout)
        return report.to_dict()

    @app.post("/v1/reconcile", tags=["reaper"], summary="Repair the inventory now",
              responses=ERRORS)
    async def reconcile(who: Admin, body: Annotated[s.Reconcile | None, Body()] = None) -> dict:
        return (await who.client.reconcile(body.dry_run if body else False)).to_dict()

    # -- profiles ----------------------------------------------------------------------------

    @app.get("/v1/profiles", tags=["profiles"], summary="The profiles on the search path",
             response_model=list[s.ProfileInfo], responses=ERRORS)
    async def profiles(who: Read) -> JSONResponse:
        return JSONResponse([p.to_dict() for p in await who.client.profiles()])

    @app.post("/v1/profiles/validate", tags=["profiles"],
              summary="Check a profile document (nothing is written)", responses=ERRORS)
    async def validate(who: Read, body: dict[str, Any]) -> dict[str, Any]:
        from sandboxer.core.rules.profiles import dump

        refuse_host_files(body)
        return {"ok": True, "profile": dump(await who.client.check_profile(body))}

    @app.get("/v1/profiles/{name}", tags=["profiles"],
             summary="A profile, resolved (secrets as references)", responses=ERRORS)
    async def profile(who: Read, name: str) -> dict[str, Any]:
        from sandboxer.core.rules.profiles import dump

        resolved = await who.client.profile(name)
        source = next((p.source for p in await who.client.profiles() if p.name == name), None)
        return {**dump(resolved), "source": source}

    # -- warm pools (docs/pools.md) ----------------------------------------------------------

    @app.get("/v1/pools", tags=["pools"], summary="The warm pools",
             response_model=list[s.PoolRecord], responses=ERRORS)
    async def pools(who: Read) -> JSONResponse:
        return JSONResponse([p.to_dict() for p in await who.client.pools()])

    @app.put("/v1/pools/{profile}", tags=["pools"],
             summary="Set a pool's size (filled or shrunk before the answer)",
             response_model=s.PoolRecord, responses=ERRORS)
    async def set_pool_size(who: Admin, profile: str, body: s.PoolSize) -> JSONResponse:
        return JSONResponse((await who.client.set_pool_size(profile, body.size)).to_dict())

    @app.post("/v1/pools/{profile}/drain", tags=["pools"],
              summary="Destroy a pool's members and keep it empty",
              response_model=s.PoolDrained, responses=ERRORS)
    async def drain_pool(who: Admin, profile: str) -> dict[str, Any]:
        return await timed("drain", who.client.drain_pool(profile), backend="many")

    # -- health of the backends, and the keys ------------------------------------------------

    @app.get("/v1/doctor", tags=["health"], summary="Backends, the database, versions",
             responses=ERRORS)
    async def doctor(who: Read) -> dict[str, Any]:
        return await who.client.doctor()

    @app.get("/v1/backends", tags=["health"],
             summary="Each backend as the service reaches it: loaded, capabilities, health",
             response_model=list[s.BackendStatus], responses=ERRORS)
    async def backends(who: Read,
                       name: Annotated[list[str], Query(
                           max_length=64, description="a backend; repeat for several "
                                                      "(default: every registered one)")] = [],  # noqa: B006
                       check: bool = True,
                       timeout: Annotated[float, Query(
                           gt=0, le=60, description="seconds a backend has to answer")] = 5.0,
                       ) -> JSONResponse:
        statuses = await who.client.backends(name or None, check=check, timeout=timeout)
        return JSONResponse([status.to_dict() for status in statuses])

    @app.get("/v1/api-keys", tags=["keys"], summary="The service's keys (never the keys "
                                                    "themselves)",
             response_model=list[s.ApiKey], responses=ERRORS)
    async def api_keys(who: Admin) -> JSONResponse:
        return JSONResponse(await who.client.api_keys())

    @app.post("/v1/api-keys", tags=["keys"], status_code=201, summary="A new key (shown once)",
              response_model=s.NewApiKey, responses=ERRORS)
    async def create_api_key(who: Admin, body: s.CreateKey) -> JSONResponse:
        ttl = None if body.max_ttl_s is None else timedelta(seconds=body.max_ttl_s)
        key, token = await who.client.create_api_key(
            body.scope, owner=body.owner, max_sandboxes=body.max_sandboxes, max_ttl=ttl,
            max_execs=body.max_execs)
        return JSONResponse({"key": key, "token": token}, status_code=201)

    @app.delete("/v1/api-keys/{key_id}", tags=["keys"], summary="Revoke a key",
                response_model=s.ApiKey, responses=ERRORS)
    async def revoke_api_key(who: Admin, key_id: str) -> JSONResponse:
        return JSONResponse(await who.client.revoke_api_key(key_id))


async def _reaper(client: AsyncSandboxer, every: timedelta, stop: asyncio.Event,
                  metrics: ServiceMetrics) -> None:
    """The service's timer: a reaper cycle, then delivery, every `every`. Several services
    on one database share the work through the sandboxes' and the sinks' leases."""
    pending: set[asyncio.Task] = set()

    async def count_reasons(ids: tuple[str, ...]) -> None:
        for sandbox_id in ids:
            with contextlib.suppress(Exception):
                reasons = [e.reason for e in await client.events(sandbox_id)
                           if str(e.type) == "sandbox.destroying"]
                metrics.reaped.labels(str(reasons[-1]) if reasons else "unknown").inc()

    def on_report(outcome: ReapReport | SbxError) -> None:
        if isinstance(outcome, ReapReport):
            metrics.reaper_runs.labels("failed" if outcome.failed else "ok").inc()
            if outcome.destroyed:
                task = asyncio.create_task(count_reasons(outcome.destroyed))
                pending.add(task)
                task.add_done_callback(pending.discard)
            for failure in outcome.failed:
                log.warning("reap: %s: %s", failure.get("id"), failure.get("error"))
        else:
            if not str(outcome).startswith("delivery to "):
                metrics.reaper_runs.labels(outcome.kind).inc()
            log.warning("reap: %s", error_body(outcome)["error"]["message"])

    await client.run_reaper(every, stop=stop, on_report=on_report,
                            on_delivery=metrics.count_deliveries)
