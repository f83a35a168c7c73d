"""The E2B API as one ASGI app (docs/e2b-api.md): the control plane's routes and envd's, each
call made through the library client of the request's caller (what `resolve` gives: the
key's owner acting, narrowed to its tenant), so sbx's deadlines, tenants, scopes and event
log hold as on its own routes. Exec, files and processes are the library's: a command is a
background process (`box.processes`), so foreground and background runs, kill, stdin, list
and connect are one thing, as on envd."""

from __future__ import annotations

import asyncio
import contextlib
import re
import stat as stat_module
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, unquote

from sandboxer import AsyncSandbox, AsyncSandboxer, ExecExit
from sandboxer_tui.e2b_api import watch, wire
from sandboxer_tui.e2b_api.wire import Reply, RpcError, unimplemented

ENVD_VERSION = "0.6.4"  # the envd whose protocol this speaks (the SDK gates features on it)
CLIENT_ID = "sbx"
DEFAULT_TEMPLATE = "base"  # E2B's default template: sbx's `default` profile
MAX_TIMEOUT_S = 24 * 3600
PAGE = 100
MAX_FORKS = 20  # forks of one call (the SDK's own bound)
# a terminal's pid as the SDK sees it: sbx's terminals have ids, not pids, so the facade
# numbers them from above Linux's largest pid (pid_max, 2**22), where no process's pid is
PTY_PID_BASE = 1 << 22
# a command run as an exec (a backend without background processes: docs/e2b-api.md,
# "Backends"), numbered above the terminals' range
EXEC_PID_BASE = 1 << 23

Resolve = Callable[[dict[str, Any], bool], Awaitable[tuple[AsyncSandboxer, str]]]
"""(ASGI scope, needs write) -> (the caller's client, its token); raises `Denied`."""


class Denied(Exception):
    """No usable key (401) or a key whose scope does not allow the call (403)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (method, re.compile(pattern), name) for method, pattern, name in [
        ("POST", r"/v2/sandboxes", "create"),
        ("POST", r"/sandboxes", "create"),
        ("GET", r"/v2/sandboxes", "list"),
        ("GET", r"/sandboxes", "list"),
        ("GET", r"/sandboxes/(?P<sid>[^/]+)", "get"),
        ("DELETE", r"/sandboxes/(?P<sid>[^/]+)", "kill"),
        ("POST", r"/sandboxes/(?P<sid>[^/]+)/timeout", "timeout"),
        ("POST", r"/sandboxes/(?P<sid>[^/]+)/pause", "pause"),
        ("POST", r"/sandboxes/(?P<sid>[^/]+)/resume", "resume"),
        ("POST", r"/v2/sandboxes/(?P<sid>[^/]+)/connect", "connect"),
        ("POST", r"/sandboxes/(?P<sid>[^/]+)/connect", "connect"),
        ("GET", r"/sandboxes/(?P<sid>[^/]+)/metrics", "metrics"),
        ("POST", r"/sandboxes/(?P<sid>[^/]+)/snapshots", "snapshot"),
        ("GET", r"/snapshots", "snapshots"),
        ("DELETE", r"/templates/(?P<tid>ckpt-[^/]+)", "delete_snapshot"),
        ("POST", r"/sandboxes/(?P<sid>[^/]+)/fork", "fork"),
    ]
]
# what the facade knows it does not do: a 501 naming the feature
REFUSED: list[tuple[re.Pattern[str], str]] = [
    (re.compile(p), feature) for p, feature in [
        (r"/sandboxes/metrics", "metrics of several sandboxes at once"),
        (r"/sandboxes/[^/]+/snapshots|/snapshots.*", "snapshots"),
        (r"/sandboxes/[^/]+/refreshes", "refreshing a sandbox"),
        (r"/sandboxes/[^/]+/logs|/v2/sandboxes/[^/]+/logs", "sandbox logs"),
        (r"/templates.*|/v2/templates.*|/v3/templates.*", "templates"),
        (r"/volumes.*", "volumes"),
        (r"/secrets.*", "secrets"),
        (r"/teams.*", "teams"),
        (r"/sandboxes/[^/]+/network.*", "sandbox network settings"),
    ]
]
ENVD_WRITE = {"Start", "SendInput", "SendSignal", "CloseStdin", "MakeDir", "Move", "Remove",
              "Update", "StreamInput"}


class E2BApi:
    """The ASGI app. `resolve` says who calls; `envs` keeps the variables a create gave, in
    this process's memory only (values are secrets: never stored, never logged)."""

    def __init__(self, resolve: Resolve) -> None:
        self.resolve = resolve
        self.envs: dict[str, dict[str, str]] = {}
        self.homes: dict[str, str] = {}  # a sandbox's home, where relative paths are
        self.ptys: dict[int, tuple[str, str]] = {}  # pid -> (sandbox id, terminal id)
        self.killed: set[int] = set()  # the ptys killed through the SDK (SIGKILL)
        self.pty_count = 0  # terminals opened: a pty's pid is never given twice
        # the SDK's polling watchers: id -> (sandbox id, path, recursive, entries?, last look)
        self.watchers: dict[str, tuple[str, str, bool, bool, watch.Look]] = {}
        self.capabilities: dict[str, frozenset[str]] = {}  # a backend's, as loaded here
        self.exec_count = 0  # commands run as an exec: their pids are never given twice

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        path = _route_path(scope)
        if path.startswith(("/process.Process/", "/filesystem.Filesystem/")):
            await self._rpc(scope, receive, send, path)
        elif path == "/files":
            await self._files(scope, receive, send)
        elif path == "/health":
            await self._health(scope, send)
        else:
            await self._control(scope, receive, send, path)

    # -- the control plane ---------------------------------------------------------------

    async def _control(self, scope, receive, send, path: str) -> None:
        method = scope["method"]
        route = next(((name, m) for verb, pattern, name in ROUTES
                      if verb == method and (m := pattern.fullmatch(path))), None)
        try:
            if route is None:
                feature = next((f for p, f in REFUSED if p.fullmatch(path)),
                               f"{method} {path}")
                raise Reply(501, unimplemented(feature))
            name, match = route
            client, token = await self._caller(scope, method != "GET")
            body = wire.parse(await wire.read_body(receive)) if method == "POST" else {}
            query = parse_qsl(scope.get("query_string", b"").decode(), keep_blank_values=True)
            args = {k: unquote(v) for k, v in match.groupdict().items()}
            status, payload, headers = await getattr(self, f"_{name}")(
                client, token, body, dict(query), **args)
        except Denied as exc:
            status, payload, headers = exc.status, {"code": exc.status,
                                                    "message": str(exc)}, {}
        except RpcError as exc:
            status, payload, headers = 400, {"code": 400, "message": exc.message}, {}
        except Exception as exc:  # an sbx error: its status and one line
            reply = wire.reply_of(exc)
            status, payload, headers = reply.status, {"code": reply.status,
                                                      "message": reply.message}, {}
        await wire.send_json(send, status, payload, headers)

    async def _caller(self, scope, write: bool) -> tuple[AsyncSandboxer, str]:
        return await self.resolve(scope, write)

    async def _box(self, client: AsyncSandboxer, sid: str) -> AsyncSandbox:
        from sandboxer.core.rules.errors import NotFound

        try:
            box = await client.get(sid)
        except NotFound:
            raise Reply(404, f"sandbox \"{sid}\" doesn't exist or you don't have access to "
                             "it") from None
        if box.id != sid or str(box.state) in ("destroyed", "failed", "lost"):
            raise Reply(404, f"sandbox \"{sid}\" doesn't exist or you don't have access to it")
        return box

    async def _needs(self, client: AsyncSandboxer, box: AsyncSandbox, capability: str,
                     feature: str) -> None:
        """501 naming the feature and the backend when the sandbox's backend lacks it: the
        library's answer is a conflict (409), which the SDK reads as done for some calls
        (a pause of a paused sandbox), and the caller must learn it never will be."""
        if capability not in await self._capable(client, box.backend):
            raise Reply(501, unimplemented(f"{feature} on the {box.backend} backend"))

    async def _capable(self, client: AsyncSandboxer, backend: str) -> frozenset[str]:
        """What `backend` can do (capability values), looked up once a service process."""
        found = self.capabilities.get(backend)
        if found is None:
            statuses = await client.backends([backend], check=False)
            found = statuses[0].capabilities if statuses else frozenset()
            self.capabilities[backend] = found
        return found

    def _without_processes(self, box: AsyncSandbox, feature: str) -> None:
        """envd's unimplemented, naming the feature and the backend, when the sandbox's
        backend has no background processes (its commands ran as execs)."""
        if "processes" not in self.capabilities.get(box.backend, frozenset({"processes"})):
            raise RpcError("unimplemented", unimplemented(
                f"{feature} on the {box.backend} backend (it has no background processes)"))

    def _created(self, box: AsyncSandbox, token: str) -> dict[str, Any]:
        return {"templateID": box.profile, "sandboxID": box.id, "clientID": CLIENT_ID,
                "envdVersion": ENVD_VERSION, "alias": box.profile, "envdAccessToken": token,
                "trafficAccessToken": None, "domain": None}

    def _listed(self, box: AsyncSandbox) -> dict[str, Any]:
        return {"templateID": box.profile, "alias": box.profile, "sandboxID": box.id,
                "clientID": CLIENT_ID, "startedAt": _iso(box.started_at or box.created_at),
                "endAt": _iso(box.deadline), "cpuCount": 1, "memoryMB": 512,
                "diskSizeMB": 1024, "state": "paused" if str(box.state) == "paused"
                else "running", "envdVersion": ENVD_VERSION,
                "metadata": dict(box.labels)}

    async def _create(self, client, token, body, query):
        template = body.get("templateID")
        if not isinstance(template, str) or not template:
            raise Reply(400, "templateID (an sbx profile name) is required")
        timeout = _timeout(body.get("timeout", 300), minimum=1)
        metadata = body.get("metadata") or {}
        envs = body.get("envVars") or {}
        for what, doc in (("metadata", metadata), ("envVars", envs)):
            if not isinstance(doc, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in doc.items()):
                raise Reply(400, f"{what} must map strings to strings")
        for field, feature in (("autoPause", "auto-pause"), ("autoResume", "auto-resume"),
                               ("mcp", "MCP gateways"), ("volumeMounts", "volume mounts"),
                               ("network", "network rules"), ("iam", "IAM")):
            if body.get(field) not in (None, False, [], {}):
                raise Reply(501, unimplemented(f"creating a sandbox with {feature}"))
        profile = "default" if template == DEFAULT_TEMPLATE else template
        box = await _create_from(client, profile, timedelta(seconds=timeout), metadata)
        if envs:
            self.envs[box.id] = dict(envs)
        return 201, self._created(box, token), {}

    async def _list(self, client, token, body, query):
        wanted: dict[str, str] = {}
        if query.get("metadata"):  # quoted by the SDK, urlencoded, then sent as a value
            wanted = {unquote(k): unquote(v)
                      for k, v in parse_qsl(query["metadata"], keep_blank_values=True)}
        states = set(query["state"].split(",")) if query.get("state") else {"running",
                                                                             "paused"}
        if not states <= {"running", "paused"}:
            raise Reply(400, f"state filter {query['state']!r}: running and paused only")
        try:
            limit = min(int(query.get("limit") or PAGE), 1000)
        except ValueError:
            raise Reply(400, "limit must be a whole number") from None
        order = query.get("order") or "desc"
        if order not in ("asc", "desc"):
            raise Reply(400, f"order {order!r}: asc or desc")
        after = None
        if query.get("startedAfter"):
            try:
                after = datetime.fromisoformat(query["startedAfter"].replace("Z", "+00:00"))
            except ValueError:
                raise Reply(400, "startedAfter must be an RFC 3339 time") from None
        try:
            offset = int(query.get("nextToken") or 0)
        except ValueError:
            raise Reply(400, "nextToken is not one this service gave") from None
        # E2B pages newest first by default: the filtered list is sorted, then cut here
        found = [b for b in await client.list(labels=wanted or None)
                 if str(b.state) in states
                 and (after is None or (b.started_at or b.created_at) >= after)
                 and (not query.get("template") or query["template"] in (
                     b.profile, DEFAULT_TEMPLATE if b.profile == "default" else None))]
        found.sort(key=lambda b: (b.created_at, b.id), reverse=order == "desc")
        page = found[offset:offset + limit]
        headers = {"x-next-token": str(offset + limit)} if offset + limit < len(found) else {}
        return 200, [self._listed(b) for b in page], headers

    async def _get(self, client, token, body, query, sid):
        box = await self._box(client, sid)
        doc = self._listed(box)
        doc.update(envdAccessToken=token, domain=None)
        return 200, doc, {}

    async def _kill(self, client, token, body, query, sid):
        box = await self._box(client, sid)
        await box.destroy()
        self._forget(sid)
        return 204, None, {}

    def _forget(self, sid: str) -> None:
        """What this process kept of a sandbox it destroyed: its variables, home, terminals'
        pids and watchers (one the reaper ends is forgotten when the process ends)."""
        self.envs.pop(sid, None)
        self.homes.pop(sid, None)
        for pid in [p for p, (owner, _) in self.ptys.items() if owner == sid]:
            del self.ptys[pid]
            self.killed.discard(pid)
        for watcher in [w for w, kept in self.watchers.items() if kept[0] == sid]:
            del self.watchers[watcher]

    async def _timeout(self, client, token, body, query, sid):
        """E2B sets the end to now + timeout, earlier or later; sbx's deadline only moves
        later (extend), never past the hard deadline: a shorter timeout leaves it."""
        timeout = _timeout(body.get("timeout"), minimum=0)
        box = await self._box(client, sid)
        if str(box.state) != "running":
            raise Reply(404, f"sandbox \"{sid}\" is not running")
        await _extend_to(box, timeout)
        return 204, None, {}

    async def _metrics(self, client, token, body, query, sid):
        """The stored readings (sbx's metric history) between `start` and `end` (unix
        seconds), or a live one when none is stored: CPU and memory; disk is not measured
        (0)."""
        box = await self._box(client, sid)
        await self._needs(client, box, "metrics", "metrics")
        try:
            start = int(query.get("start") or 0)
            end = int(query.get("end") or 2**62)
        except ValueError:
            raise Reply(400, "start and end are unix times in seconds") from None
        samples = await box.metric_history()
        if not samples and str(box.state) == "running":
            live = await box.metrics()
            samples = [live] if live is not None else []
        shown = []
        for m in samples:
            moment = int(m.time.timestamp())
            if start <= moment <= end:
                shown.append({"timestamp": _iso(m.time), "timestampUnix": moment,
                              "cpuCount": 1, "cpuUsedPct": float(m.cpu_pct or 0.0),
                              "memUsed": int(m.memory_bytes or 0),
                              "memTotal": int(m.memory_limit or 0), "memCache": 0,
                              "diskUsed": 0, "diskTotal": 0})
        return 200, shown, {}

    async def _snapshot(self, client, token, body, query, sid):
        """A snapshot is an sbx checkpoint of the sandbox's filesystem (its processes and
        memory are not kept): `Sandbox.create(snapshot_id)` restores it."""
        box = await self._box(client, sid)
        await self._needs(client, box, "snapshot", "snapshots")
        if body.get("memory") is True:
            raise Reply(501, unimplemented("snapshots with memory (mode='full'; sbx's "
                                           "checkpoints keep the filesystem)"))
        name = body.get("name")
        if name is not None and not isinstance(name, str):
            raise Reply(400, "name must be text")
        return 201, _snapshot_info(await box.snapshot(name or None)), {}

    async def _snapshots(self, client, token, body, query):
        """The caller's checkpoints, newest first (of one sandbox, of one name), in pages."""
        try:
            limit = min(int(query.get("limit") or PAGE), 1000)
            offset = int(query.get("nextToken") or 0)
        except ValueError:
            raise Reply(400, "limit and nextToken are whole numbers") from None
        from sandboxer.core.rules.errors import NotFound

        try:  # a sandbox's outlive it; another tenant's are not found: none
            found = await client.checkpoints(query.get("sandboxID") or None)
        except NotFound:
            found = []
        found = [c for c in found if not query.get("name") or c.name == query["name"]]
        found.reverse()
        headers = {"x-next-token": str(offset + limit)} if offset + limit < len(found) else {}
        return 200, [_snapshot_info(c) for c in found[offset:offset + limit]], headers

    async def _delete_snapshot(self, client, token, body, query, tid):
        from sandboxer.core.rules.errors import NotFound

        try:
            checkpoint = await client.checkpoint(tid)
        except NotFound:
            raise Reply(404, f"snapshot \"{tid}\" not found") from None
        await checkpoint.remove()
        return 204, None, {}

    async def _fork(self, client, token, body, query, sid):
        """`count` new sandboxes from a checkpoint of this one's filesystem taken now (kept:
        `sbx checkpoints` lists it); each fork succeeds or fails on its own, as on E2B."""
        box = await self._box(client, sid)
        await self._needs(client, box, "snapshot", "forks (a snapshot restored)")
        timeout = _timeout(body.get("timeout", 300), minimum=1)
        count = body.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or \
                not 1 <= count <= MAX_FORKS:
            raise Reply(400, f"count must be a whole number from 1 to {MAX_FORKS}")
        if str(box.state) != "running":
            raise Reply(409, f"sandbox \"{sid}\" is not running")
        checkpoint = await box.snapshot(None)
        made = await asyncio.gather(*(checkpoint.restore(
            ttl=timedelta(seconds=timeout), labels=dict(box.labels) or None)
            for _ in range(count)), return_exceptions=True)
        results = []
        for fork in made:
            if isinstance(fork, BaseException):
                reply = wire.reply_of(fork) if isinstance(fork, Exception) else Reply(
                    500, "the fork did not start")
                results.append({"error": {"code": reply.status, "message": reply.message}})
                continue
            if box.id in self.envs:
                self.envs[fork.id] = dict(self.envs[box.id])
            results.append({"sandbox": self._created(fork, token)})
        return 201, results, {}

    async def _pause(self, client, token, body, query, sid):
        box = await self._box(client, sid)
        await self._needs(client, box, "pause", "pausing")
        if str(box.state) == "paused":
            raise Reply(409, f"sandbox \"{sid}\" is already paused")
        await box.pause()
        return 204, None, {}

    async def _resume(self, client, token, body, query, sid):
        box = await self._box(client, sid)
        if str(box.state) != "paused":
            raise Reply(409, f"sandbox \"{sid}\" is not paused")
        await box.resume()
        await _extend_to(box, _timeout(body.get("timeout", 300), minimum=0))
        return 201, self._created(box, token), {}

    async def _connect(self, client, token, body, query, sid):
        box = await self._box(client, sid)
        timeout = _timeout(body.get("timeout", 300), minimum=0)
        resumed = str(box.state) == "paused"
        if resumed:
            await box.resume()
        await _extend_to(box, timeout)
        return (201 if resumed else 200), self._created(box, token), {}

    # -- envd ----------------------------------------------------------------------------

    async def _health(self, scope, send) -> None:
        """envd answers while its sandbox runs; E2B's proxy answers 502 otherwise."""
        try:
            await self._envd_box(scope, False)
        except Denied as exc:
            await wire.send_json(send, exc.status, {"code": exc.status, "message": str(exc)})
            return
        except Exception as exc:  # E2B's proxy's words, which the SDK reads as "not running"
            error = wire.rpc_error_of(exc)
            await wire.send_json(send, 502, {"code": 502, "message": "The sandbox was not "
                                             f"found or is not running ({error.message})"})
            return
        await wire.send_json(send, 204, None)

    async def _envd_box(self, scope, write: bool) -> AsyncSandbox:
        client, _ = await self._caller(scope, write)
        sid = _header(scope, "e2b-sandbox-id")
        if not sid:
            raise RpcError("invalid_argument", "the E2b-Sandbox-Id header is missing")
        try:
            box = await self._box(client, sid)
        except Reply as exc:
            raise RpcError("not_found", exc.message) from None
        if str(box.state) != "running":
            raise RpcError("unavailable", f"sandbox \"{sid}\" is not running")
        await self._capable(client, box.backend)  # known to the envd calls from here on
        return box

    async def _rpc(self, scope, receive, send, path: str) -> None:
        service, _, method = path[1:].partition("/")
        streaming = _header(scope, "content-type").startswith(wire.STREAM_TYPE)
        handler = getattr(self, f"_rpc_{service.split('.')[0]}_{method}", None)
        if path == "/process.Process/StreamInput" and streaming and scope["method"] == "POST":
            await self._stream_input(scope, receive, send)
            return
        try:
            body = await wire.read_body(receive)
            if scope["method"] != "POST":
                raise RpcError("unimplemented", unimplemented(f"{scope['method']} {path}"))
            if handler is None:
                raise RpcError("unimplemented", unimplemented(path[1:]))
            request = wire.first_envelope(body) if streaming else wire.parse(body)
            box = await self._envd_box(scope, method in ENVD_WRITE)
            if not streaming:
                answer = await handler(box, request, scope)
                await wire.send_json(send, 200, answer)
                return
        except Denied as exc:
            error = RpcError("unauthenticated" if exc.status == 401 else "permission_denied",
                             str(exc))
            await self._rpc_fail(send, error, streaming)
            return
        except Exception as exc:
            await self._rpc_fail(send, wire.rpc_error_of(exc), streaming)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", wire.STREAM_TYPE.encode())]})
        error = None
        limit = _deadline_s(scope)  # Connect's timeout header: the stream ends by then
        try:  # a client that goes away ends the stream here; the process runs on, as on envd
            async with asyncio.timeout(limit), \
                    contextlib.aclosing(handler(box, request, scope)) as messages:
                async for message in messages:
                    await send({"type": "http.response.body",
                                "body": wire.envelope(message), "more_body": True})
        except TimeoutError:
            error = RpcError("deadline_exceeded", f"the call's timeout ({limit:g} s) passed")
        except Exception as exc:
            error = wire.rpc_error_of(exc)
        with contextlib.suppress(Exception):  # gone already: nobody to tell
            await send({"type": "http.response.body", "body": wire.end_of_stream(error)})

    async def _stream_input(self, scope, receive, send) -> None:
        """`commands.stream_input` / `pty.stream_input`: envd's client stream, a start
        naming the process then its input, each message written to the process (or the
        terminal) as it comes; answered once the stream ends."""
        receive = _Receive(receive)
        error = None
        try:
            box = await self._envd_box(scope, True)
            messages = wire.envelopes(wire.body_chunks(receive))
            start = (await anext(messages, None) or {}).get("start")
            if not isinstance(start, dict):
                raise RpcError("invalid_argument", "a stream of input starts with its start")
            request = {"process": start.get("process") or {}}
            terminal = await self._terminal(box, request)
            if terminal is None:
                self._without_processes(box, "a command's input")
            proc = None if terminal is not None else await _process(box, request)
            kind = "stdin" if terminal is None else "pty"
            async for message in messages:
                given = (message.get("data") or {}).get("input")
                if given is None:  # a keepalive
                    continue
                if kind not in given:
                    raise RpcError("invalid_argument", f"this process takes input as {kind}")
                data = wire.unb64(given[kind])
                await (proc.write(data) if terminal is None else terminal.write(data))
        except Denied as exc:
            error = RpcError("unauthenticated" if exc.status == 401 else "permission_denied",
                             str(exc))
        except Exception as exc:
            error = wire.rpc_error_of(exc)
        await _drain(receive, "POST")  # a refused stream's rest, so that its sender reads
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", wire.STREAM_TYPE.encode())]})
        await send({"type": "http.response.body", "body": (
            wire.envelope({}) if error is None else b"") + wire.end_of_stream(error)})

    async def _rpc_fail(self, send, error: RpcError, streaming: bool) -> None:
        if not streaming:
            await wire.send_rpc_error(send, error)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", wire.STREAM_TYPE.encode())]})
        await send({"type": "http.response.body", "body": wire.end_of_stream(error)})

    # process.Process

    async def _rpc_process_Start(self, box: AsyncSandbox, request, scope):
        if request.get("pty"):
            async for message in self._pty_start(box, request, scope):
                yield message
            return
        config = request.get("process") or {}
        cmd, args = config.get("cmd"), list(config.get("args") or [])
        if not isinstance(cmd, str) or not cmd:
            raise RpcError("invalid_argument", "process.cmd is required")
        if cmd in ("/bin/bash", "bash") and args[:2] == ["-l", "-c"] and len(args) == 3:
            argv = ["sh", "-c", args[2]]  # the SDK's `bash -l -c CMD`, for images without bash
        else:
            argv = [cmd, *args]
        env = {**self.envs.get(box.id, {}), **(config.get("envs") or {})}
        cwd = await self._absolute(box, config.get("cwd") or ".")  # the home, by default
        if "processes" not in self.capabilities.get(box.backend, frozenset({"processes"})):
            if request.get("stdin"):
                self._without_processes(box, "a command's input (stdin=True)")
            async for message in self._exec(box, argv, env, cwd, _user(scope)):
                yield message
            return
        proc = await box.processes.start(argv, env=env or None, cwd=cwd,
                                         user=_user(scope), stdin=bool(request.get("stdin")))
        yield {"event": {"start": {"pid": proc.pid}}}
        async for message in _follow(box, proc):
            yield message

    async def _exec(self, box: AsyncSandbox, argv: list[str], env: dict[str, str],
                    cwd: str, user: str | None):
        """A command on a backend without background processes: the library's exec
        (`exec_stream`), its output streamed as it comes. It is not listed, and cannot be
        fed, killed or connected to (501 naming the backend)."""
        self.exec_count += 1
        yield {"event": {"start": {"pid": EXEC_PID_BASE + self.exec_count}}}
        async for item in box.exec_stream(argv, env=env or None, cwd=cwd, user=user):
            if isinstance(item, ExecExit):
                code = item.exit_code
                yield {"event": {"end": {"exitCode": code, "exited": True,
                                         "status": f"exit status {code}"}}}
            else:
                yield {"event": {"data": {item.stream: wire.b64(item.data)}}}

    async def _rpc_process_Connect(self, box: AsyncSandbox, request, scope):
        if (terminal := await self._terminal(box, request)) is not None:
            yield {"event": {"start": {"pid": int(request["process"]["pid"])}}}
            async for message in self._follow_pty(box, terminal, int(
                    request["process"]["pid"])):
                yield message
            return
        self._without_processes(box, "connecting to a command")
        proc = await _process(box, request)
        yield {"event": {"start": {"pid": proc.pid}}}
        async for message in _follow(box, proc):
            yield message

    async def _rpc_process_List(self, box: AsyncSandbox, request, scope):
        shown = []
        running = await box.processes.list() if "processes" in self.capabilities.get(
            box.backend, frozenset({"processes"})) else []  # an exec is not listed
        for proc in running:
            if proc.running:
                argv = proc.argv
                config = {"cmd": argv[0], "args": argv[1:], "envs": {}}
                if proc.cwd:
                    config["cwd"] = proc.cwd
                shown.append({"config": config, "pid": proc.pid})
        for pid, (sid, _) in list(self.ptys.items()):
            terminal = await self._terminal(box, {"process": {"pid": pid}}) \
                if sid == box.id else None
            if terminal is not None and terminal.running:
                argv = terminal.argv
                shown.append({"config": {"cmd": argv[0], "args": argv[1:], "envs": {}},
                              "pid": pid})
        return {"processes": shown}

    async def _rpc_process_SendInput(self, box: AsyncSandbox, request, scope):
        given = request.get("input") or {}
        if (terminal := await self._terminal(box, request)) is not None:
            if "pty" not in given:
                raise RpcError("invalid_argument", "a pty takes input as pty, not stdin")
            await terminal.write(wire.unb64(given["pty"]))
            return {}
        self._without_processes(box, "a command's input")
        proc = await _process(box, request)
        if "stdin" not in given:
            raise RpcError("invalid_argument", "a process without a pty takes stdin")
        await proc.write(wire.unb64(given["stdin"]))
        return {}

    async def _rpc_process_SendSignal(self, box: AsyncSandbox, request, scope):
        if (terminal := await self._terminal(box, request)) is not None:
            if request.get("signal") not in ("SIGNAL_SIGKILL", "SIGNAL_SIGTERM", 9, 15):
                raise RpcError("invalid_argument",
                               f"unknown signal {request.get('signal')!r}")
            if not terminal.running:  # as envd: an ended process is not found
                raise RpcError("not_found", f"process with pid "
                                            f"{request['process']['pid']} not found")
            self.killed.add(int(request["process"]["pid"]))
            await terminal.close()  # its terminal hangs up: the program ends
            return {}
        self._without_processes(box, "killing a command")
        proc = await _process(box, request)
        number = {"SIGNAL_SIGKILL": 9, "SIGNAL_SIGTERM": 15, 9: 9, 15: 15}.get(
            request.get("signal"))
        if number is None:
            raise RpcError("invalid_argument", f"unknown signal {request.get('signal')!r}")
        if proc.running:
            await proc.kill(number)
        return {}

    async def _rpc_process_Update(self, box: AsyncSandbox, request, scope):
        """Resize a pty (the only thing envd's Update changes)."""
        terminal = await self._terminal(box, request)
        if terminal is None:
            await _process(box, request)  # not found, or found without a pty:
            raise RpcError("invalid_argument", "only a pty can be resized")
        size = (request.get("pty") or {}).get("size") or {}
        await terminal.resize(int(size.get("cols") or 0), int(size.get("rows") or 0))
        return {}

    async def _pty_start(self, box: AsyncSandbox, request, scope):
        """`sandbox.pty.create`: a library terminal (box.pty). The SDK's `/bin/bash -i -l` is
        the library's login shell (bash where the image has it, else sh)."""
        size = (request.get("pty") or {}).get("size") or {}
        config = request.get("process") or {}
        cmd, args = config.get("cmd"), list(config.get("args") or [])
        if not isinstance(cmd, str) or not cmd:
            raise RpcError("invalid_argument", "process.cmd is required")
        user = _user(scope)
        if user not in (None, "root"):
            raise RpcError("unimplemented", unimplemented(f"a pty as user {user!r}"))
        login = cmd in ("/bin/bash", "bash") and set(args) <= {"-i", "-l"}
        env = {**self.envs.get(box.id, {}), **(config.get("envs") or {})}
        cwd = await self._absolute(box, config.get("cwd") or ".")
        try:
            cols, rows = int(size.get("cols") or 80), int(size.get("rows") or 24)
        except (TypeError, ValueError):
            raise RpcError("invalid_argument", "pty.size is rows and cols") from None
        terminal = await box.pty(None if login else [cmd, *args], cols=cols, rows=rows,
                                 env=env or None, cwd=cwd)
        self.pty_count += 1
        pid = PTY_PID_BASE + self.pty_count
        self.ptys[pid] = (box.id, terminal.id)
        yield {"event": {"start": {"pid": pid}}}
        async for message in self._follow_pty(box, terminal, pid):
            yield message

    async def _follow_pty(self, box: AsyncSandbox, terminal, pid: int):
        """A terminal's output as envd's pty data events, then its end. The client going
        away drops the connection to the terminal, not the terminal (as on envd)."""
        try:
            async for data in terminal:
                yield {"event": {"data": {"pty": wire.b64(data)}}}
        except Exception:
            await _still_there(box)
            raise
        finally:
            await terminal.attach()  # drops the stream it read on
        code = terminal.exit_code
        if pid in self.killed:
            yield {"event": {"end": {"exitCode": -1, "exited": False,
                                     "status": "signal: killed"}}}
        elif code is None:
            await _still_there(box)
            yield {"event": {"end": {"exitCode": -1, "exited": False, "status": "unknown",
                                     "error": "how the program ended is not known"}}}
        else:
            yield {"event": {"end": {"exitCode": code, "exited": True,
                                     "status": f"exit status {code}"}}}

    async def _terminal(self, box: AsyncSandbox, request: dict[str, Any]):
        """The library terminal a request's pid names, or None when it names no pty."""
        from sandboxer.core.rules.errors import NotFound

        selector = request.get("process") or {}
        try:
            pid = int(selector.get("pid"))
        except (TypeError, ValueError):
            return None
        found = self.ptys.get(pid)
        if found is None:
            return None
        if found[0] != box.id:
            raise RpcError("not_found", f"process with pid {pid} not found")
        try:
            return await box.terminal(found[1])
        except NotFound:
            raise RpcError("not_found", f"process with pid {pid} not found") from None

    async def _rpc_process_CloseStdin(self, box: AsyncSandbox, request, scope):
        self._without_processes(box, "a command's input")
        proc = await _process(box, request)
        await proc.close_stdin()
        return {}

    # filesystem.Filesystem

    async def _rpc_filesystem_Stat(self, box: AsyncSandbox, request, scope):
        info = await box.files.stat(await self._p(box, request, "path"))
        return {"entry": _entry(info, await _link_end(box, info))}

    async def _rpc_filesystem_ListDir(self, box: AsyncSandbox, request, scope):
        path = await self._p(box, request, "path")
        top = await box.files.stat(path)
        if not top.is_dir:
            raise RpcError("invalid_argument", f"path '{path}' is not a directory")
        depth = int(request.get("depth") or 1)
        found = await box.files.list(path, depth)
        return {"entries": [_entry(info, await _link_end(box, info)) for info in found
                            if info.path != top.path]}

    async def _rpc_filesystem_MakeDir(self, box: AsyncSandbox, request, scope):
        path = await self._p(box, request, "path")
        if await box.files.exists(path):
            raise RpcError("already_exists", f"path '{path}' already exists")
        await box.files.mkdir(path, parents=True)
        return {"entry": _entry(await box.files.stat(path))}

    async def _rpc_filesystem_Move(self, box: AsyncSandbox, request, scope):
        source = await self._p(box, request, "source")
        destination = await self._p(box, request, "destination")
        await box.files.rename(source, destination)
        return {"entry": _entry(await box.files.stat(destination))}

    async def _rpc_filesystem_Remove(self, box: AsyncSandbox, request, scope):
        from sandboxer.core.rules.errors import NotFound

        with contextlib.suppress(NotFound):  # as envd: removing what is not there is done
            await box.files.remove(await self._p(box, request, "path"), recursive=True)
        return {}

    async def _rpc_filesystem_WatchDir(self, box: AsyncSandbox, request, scope):
        """The streaming watch (the async SDK's): a look every watch.POLL_S, its changes as
        events, until the client goes or the call's timeout passes."""
        path, recursive, entries = await self._watched(box, request)
        before = await watch.look(box, path, recursive) or {}
        yield {"start": {}}  # a oneof: its field is the message's own, in JSON
        while True:
            await asyncio.sleep(watch.POLL_S)
            try:
                after = await watch.look(box, path, recursive)
            except Exception:
                await _still_there(box)
                raise
            if after is None:  # the folder is gone, or the sandbox: then the stream ends
                await _still_there(box)
                after = {}
            for event in _events(watch.changes(before, after), entries):
                yield {"filesystem": event}
            before = after

    async def _rpc_filesystem_CreateWatcher(self, box: AsyncSandbox, request, scope):
        """The polling watch (the sync SDK's): a look now, and one each GetWatcherEvents."""
        import secrets

        if len(self.watchers) >= watch.MAX_WATCHERS:
            raise RpcError("resource_exhausted", f"{watch.MAX_WATCHERS} watchers are open: "
                                                 "stop one first")
        path, recursive, entries = await self._watched(box, request)
        first = await watch.look(box, path, recursive) or {}
        watcher = "watch-" + secrets.token_hex(8)
        self.watchers[watcher] = (box.id, path, recursive, entries, first)
        return {"watcherId": watcher}

    async def _rpc_filesystem_GetWatcherEvents(self, box: AsyncSandbox, request, scope):
        watcher = self._watcher(box, request)
        sid, path, recursive, entries, before = self.watchers[watcher]
        after = await watch.look(box, path, recursive) or {}  # gone: all of it removed
        self.watchers[watcher] = (sid, path, recursive, entries, after)
        return {"events": _events(watch.changes(before, after), entries)}

    async def _rpc_filesystem_RemoveWatcher(self, box: AsyncSandbox, request, scope):
        self.watchers.pop(self._watcher(box, request))
        return {}

    def _watcher(self, box: AsyncSandbox, request: dict[str, Any]) -> str:
        watcher = request.get("watcherId")
        if not isinstance(watcher, str) or self.watchers.get(watcher, ("",))[0] != box.id:
            raise RpcError("not_found", f"watcher {watcher!r} not found")
        return watcher

    async def _watched(self, box: AsyncSandbox, request) -> tuple[str, bool, bool]:
        path = await self._p(box, request, "path")
        if not (await box.files.stat(path)).is_dir:
            raise RpcError("invalid_argument", f"path '{path}' is not a directory")
        return path, bool(request.get("recursive")), bool(request.get("includeEntry"))

    async def _p(self, box: AsyncSandbox, request: dict[str, Any], field: str) -> str:
        return await self._absolute(box, _path(request, field))

    async def _absolute(self, box: AsyncSandbox, path: str) -> str:
        """A path as envd takes it: a relative one is under the user's home, which is
        /home/user where the image has it (E2B's), else /root, else /."""
        if path.startswith("/"):
            return path
        home = self.homes.get(box.id)
        if home is None:
            home = "/"
            for candidate in ("/home/user", "/root"):
                with contextlib.suppress(Exception):
                    if (await box.files.stat(candidate)).is_dir:
                        home = candidate
                        break
            self.homes[box.id] = home
        if path in ("", "."):
            return home
        return home.rstrip("/") + "/" + path

    # /files

    async def _files(self, scope, receive, send) -> None:
        receive = _Receive(receive)
        query = dict(parse_qsl(scope.get("query_string", b"").decode(), keep_blank_values=True))
        method = scope["method"]
        try:
            if method not in ("GET", "POST"):
                raise Reply(501, unimplemented(f"{method} /files"))
            path = query.get("path")
            if not path and method == "GET":
                raise Reply(400, "path is required")
            if any(k.lower().startswith(b"x-metadata-") for k, _ in scope["headers"]):
                raise Reply(501, unimplemented("file metadata (metadata=)"))
            kind = _header(scope, "content-type")
            encoding = _header(scope, "content-encoding").strip().lower()
            if method == "POST" and encoding not in ("", "identity", "gzip"):
                raise Reply(501, unimplemented(f"uploads encoded as {encoding}"))
            multipart = kind.startswith("multipart/form-data")
            if method == "POST" and not (multipart or kind.startswith(
                    "application/octet-stream")):
                raise Reply(400, f"an upload is application/octet-stream or "
                                 f"multipart/form-data, not {kind or 'untyped'}")
            try:
                box = await self._envd_box(scope, method == "POST")
            except RpcError as exc:
                raise Reply(wire.HTTP_OF.get(exc.code, 500), exc.message) from None
            if path:
                path = await self._absolute(box, path)
            if method == "GET":
                chunks = box.files.stream(path)
                first = await anext(chunks, b"")  # a missing file fails before the answer
                await send({"type": "http.response.start", "status": 200, "headers": [
                    (b"content-type", b"application/octet-stream")]})
                if first:
                    await send({"type": "http.response.body", "body": first,
                                "more_body": True})
                async for chunk in chunks:
                    await send({"type": "http.response.body", "body": chunk,
                                "more_body": True})
                await send({"type": "http.response.body", "body": b""})
                return
            chunks = wire.body_chunks(receive)
            if encoding == "gzip":
                chunks = wire.gunzip(chunks)
            if multipart:  # the SDK's default for text and bytes: buffered, as it sends it
                body = b"".join([chunk async for chunk in chunks])
                parts = wire.multipart_files(kind, body)
                if len(parts) == 1 and path:
                    parts = [(path, parts[0][1])]
                parts = [(await self._absolute(box, target), data) for target, data in parts]
                for target, data in parts:
                    await box.files.write(target, data)
                written = [target for target, _ in parts]
            else:
                await box.files.write(path, chunks)
                written = [path]
            await wire.send_json(send, 200, [
                {"name": p.rstrip("/").rpartition("/")[2], "type": "file", "path": p}
                for p in written])
        except Denied as exc:
            await _drain(receive, method)
            await wire.send_json(send, exc.status, {"code": exc.status, "message": str(exc)})
        except Exception as exc:
            reply = wire.reply_of(exc)
            await _drain(receive, method)
            await wire.send_json(send, reply.status, {"code": reply.status,
                                                      "message": reply.message})


class _Receive:
    """An ASGI receive that knows whether the request's body has all been read."""

    def __init__(self, receive) -> None:
        self.receive = receive
        self.done = False

    async def __call__(self):
        message = await self.receive()
        if message["type"] != "http.request" or not message.get("more_body"):
            self.done = True
        return message


async def _drain(receive: _Receive, method: str) -> None:
    """Read what is left of a refused upload (the service caps it), so that a client still
    sending it reads the answer instead of a closed connection."""
    if method != "POST" or receive.done:
        return
    with contextlib.suppress(Exception):
        async for _ in wire.body_chunks(receive):
            pass


async def _follow(box: AsyncSandbox, proc):
    """A process's output as envd's data events, then its end; when the sandbox went away
    meanwhile (killed, expired), envd's connection ends instead: UNAVAILABLE."""
    try:
        async for out in proc.output(follow=True):
            yield {"event": {"data": {out.stream: wire.b64(out.data)}}}
    except Exception:
        await _still_there(box)
        raise
    if proc.running:  # the output's end carries the record; read it again only if not
        with contextlib.suppress(Exception):
            await proc.refresh()
    code = proc.exit_code
    if code is None:
        await _still_there(box)
        yield {"event": {"end": {"exitCode": -1, "exited": False, "status": "unknown",
                                 "error": "how the process ended is not known"}}}
    else:
        yield {"event": {"end": {"exitCode": code, "exited": True,
                                 "status": f"exit status {code}"}}}


async def _still_there(box: AsyncSandbox) -> None:
    """UNAVAILABLE when the sandbox no longer runs (the SDK then asks /health why)."""
    from sandboxer.core.rules.errors import NotFound

    gone = False
    try:
        await box.refresh()
    except NotFound:
        gone = True
    except Exception:  # noqa: BLE001 (cannot tell: the original error stands)
        return
    if gone or str(box.state) != "running":
        raise RpcError("unavailable", f"the connection to sandbox {box.id} ended: it "
                                      "no longer runs")


def _deadline_s(scope) -> float | None:
    try:
        value = int(_header(scope, "connect-timeout-ms"))
    except ValueError:
        return None
    return value / 1000 if value > 0 else None


async def _process(box: AsyncSandbox, request: dict[str, Any]):
    from sandboxer.core.rules.errors import NotFound

    selector = request.get("process") or {}
    if "pid" not in selector:
        raise RpcError("unimplemented", unimplemented("selecting a process by tag"))
    try:
        return await box.processes.get(int(selector["pid"]))
    except (NotFound, ValueError):
        raise RpcError("not_found", f"process with pid {selector['pid']} not found") from None


async def _link_end(box: AsyncSandbox, info, hops: int = 8):
    """A symbolic link's end, as envd reports a link: (its absolute target, that target's
    FileInfo, None when it dangles), following links up to `hops`; None for anything else."""
    import posixpath

    from sandboxer.core.rules.errors import NotFound

    if info.type != "symlink" or not info.target:
        return None
    target, end = info.path, info
    while end is not None and end.type == "symlink" and end.target and hops > 0:
        target = posixpath.normpath(posixpath.join(posixpath.dirname(target), end.target))
        hops -= 1
        try:
            end = await box.files.stat(target)
        except NotFound:
            end = None
    return target, end


def _entry(info, link=None) -> dict[str, Any]:
    """An sbx FileInfo as envd's EntryInfo (JSON mapping: int64 as text, enums by name). A
    symbolic link is as envd 0.6 has it: `type` its end's (what `link`, from _link_end,
    found; a dangling link's is SYMLINK, as older envd says, which the SDK lists),
    `isSymlink` true, `symlinkTarget` the end's absolute path."""
    kind = "FILE_TYPE_DIRECTORY" if info.type == "dir" else "FILE_TYPE_FILE"
    if link is not None:
        kind = "FILE_TYPE_SYMLINK" if link[1] is None else \
            "FILE_TYPE_DIRECTORY" if link[1].type == "dir" else "FILE_TYPE_FILE"
    bits = stat_module.S_IFDIR if info.type == "dir" else stat_module.S_IFLNK \
        if info.type == "symlink" else stat_module.S_IFREG
    doc = {"name": info.name, "type": kind, "path": info.path, "size": str(info.size),
           "mode": info.mode, "permissions": stat_module.filemode(bits | info.mode),
           "owner": "", "group": "", "modifiedTime": _iso(info.mtime, z=True),
           "isSymlink": info.type == "symlink"}
    if link is not None:
        doc["symlinkTarget"] = link[0]
    elif info.target:
        doc["symlinkTarget"] = info.target
    return doc


async def _create_from(client: AsyncSandboxer, template: str, ttl: timedelta,
                       metadata: dict[str, str]) -> AsyncSandbox:
    """A sandbox from an E2B template: a checkpoint's id or name (a snapshot's) restores
    it, anything else is a profile's name."""
    from sandboxer.core.rules.errors import NotFound
    from sandboxer.core.rules.ids import CHECKPOINT_PREFIX

    if not template.startswith(CHECKPOINT_PREFIX):
        try:
            return await client.create(template, ttl=ttl, labels=metadata or None)
        except NotFound as missing:  # no such profile: a snapshot's name, or that error
            try:
                checkpoint = await client.checkpoint(template)
            except NotFound:
                raise missing from None
    else:
        checkpoint = await client.checkpoint(template)
    return await checkpoint.restore(ttl=ttl, labels=metadata or None)


def _snapshot_info(checkpoint) -> dict[str, Any]:
    return {"snapshotID": checkpoint.id, "names": [checkpoint.name] if checkpoint.name else []}


def _events(found: list[tuple[str, str, Any]], entries: bool) -> list[dict[str, Any]]:
    """watch.changes as envd's FilesystemEvent messages (with the entry when asked)."""
    out = []
    for name, kind, info in found:
        event: dict[str, Any] = {"name": name, "type": kind}
        if entries and info is not None:
            event["entry"] = _entry(info)
        out.append(event)
    return out


def _path(request: dict[str, Any], field: str) -> str:
    value = request.get(field)
    if not isinstance(value, str) or not value:
        raise RpcError("invalid_argument", f"{field} is required")
    return value


async def _extend_to(box: AsyncSandbox, timeout: int) -> None:
    """Move the deadline to now + timeout when that is later (capped by the hard deadline)."""
    wanted = datetime.now(UTC) + timedelta(seconds=timeout)
    if wanted > box.deadline:
        await box.extend(wanted - box.deadline)


def _timeout(value: Any, *, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or \
            not minimum <= value <= MAX_TIMEOUT_S:
        raise Reply(400, f"timeout must be a whole number of seconds from {minimum} to "
                         f"{MAX_TIMEOUT_S}")
    return value


def _user(scope) -> str | None:
    """envd's user: `Authorization: Basic base64(USER:)`; none means the sandbox's own."""
    import base64

    kind, _, value = _header(scope, "authorization").partition(" ")
    if kind.lower() != "basic" or not value:
        return None
    try:
        user = base64.b64decode(value).decode().partition(":")[0]
    except ValueError:
        raise RpcError("invalid_argument",
                       "the Authorization header is not Basic USER:") from None
    return user or None


def _header(scope, name: str) -> str:
    wanted = name.encode()
    return next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == wanted), "")


def _route_path(scope) -> str:
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def _iso(moment: datetime, *, z: bool = False) -> str:
    text = moment.astimezone(UTC).isoformat()
    return text.replace("+00:00", "Z") if z else text
