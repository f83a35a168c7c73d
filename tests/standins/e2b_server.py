"""A stand-in for E2B on 127.0.0.1: its REST API and envd's Connect-RPC process and filesystem
services and its /files HTTP endpoint, in one ASGI app served by uvicorn in a thread of the
test process.

Kept honest:
- every request body is parsed with the SDK's own generated models (`e2b.api.client.models`)
  and every answer is built with them, so a field the SDK renames or adds shows up here;
- an endpoint, a query parameter or a body field it does not know is answered 501/400 *and*
  recorded in `problems`, which the test fixture asserts empty: an SDK upgrade that calls
  something new fails the tests loudly instead of passing against a guess;
- commands really run, as local `sh -c` subprocesses in a folder per sandbox (their working
  folder and HOME), with their real exit codes, stdout, stderr and stdin (send_input,
  close_stdin); one started with `pty` runs on a real pseudo-terminal of this host (its
  controlling terminal, of the size asked), its output sent as envd's `pty` data, its input
  taken as `pty` input, resized by Update; a snapshot copies that folder. A path given to envd (a command's cwd, the
  filesystem service, /files) is a path of this host, as the commands see it; a relative one is
  under the sandbox's folder;
- sandboxes expire on their own, as on E2B: a background task removes a running sandbox
  past its end time. Time is the wall clock plus `clock_offset` (`advance()` moves it).

Volumes (E2B's `/volumes` REST API and the volume content API `/volumecontent/{id}/path|dir|file`,
bearer-token authenticated with the token `/volumes` hands out): a volume's files are a folder
of the stand-in's temp folder. A sandbox created with `volumeMounts` has each volume's folder
**bind-mounted on this host** at the mount's path (`mount --bind`; the test process is root),
the mount point made if missing; so its commands and envd's filesystem service see the
volume's files at that path, as a sandbox on E2B does. The mounts are undone (and the mount
points this stand-in made removed) when the sandbox ends or the stand-in stops. Two sandboxes
mounting one path at once are refused (400, a problem): they would share this host's one
mount. E2B mounts cannot be read-only, and neither are these.

Tests steer it directly (same process): `rate_limit()` makes the next requests answer 429,
`create_delay` holds creates open so concurrency can be measured (`max_creates_in_flight`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import stat as stat_module
import string
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote

import uvicorn
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.api.client.models import (
    ConnectSandboxV2,
    Error,
    ListedSandbox,
    NewSandboxV2,
    NewVolume,
    Sandbox,
    SandboxDetail,
    SandboxMetric,
    SandboxPauseRequest,
    SandboxSnapshotRequest,
    SandboxState,
    SandboxTimeoutRequest,
    SnapshotInfo,
    VolumeAndToken,
)
from e2b.api.client.models import Volume as VolumeModel
from e2b.api.client.types import UNSET, Unset
from e2b.envd.filesystem import filesystem_pb as fs_pb
from e2b.envd.filesystem.filesystem_connect import FilesystemASGIApplication
from e2b.envd.process import process_pb as pb
from e2b.envd.process.process_connect import ProcessASGIApplication
from e2b.volume.client.models import PatchVolumecontentVolumeIDPathBody as PatchPathBody
from e2b.volume.client.models import VolumeEntryStat
from e2b.volume.client.models.volume_entry_stat_type import VolumeEntryStatType
from protobuf import Oneof
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp

ENVD_VERSION = "0.6.4"
MiB = 1024**2
# Built-in templates: cpu count, memory MiB, disk MiB
TEMPLATES = {"base": (2, 512, 10240)}
DEFAULT_TIMEOUT_S = 300
MAX_TIMEOUT_S = 24 * 3600


class Reply(Exception):
    """An HTTP answer other than success: status and an E2B `Error` body."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


@dataclass
class Request:
    method: str
    path: str
    query: list[tuple[str, str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body or b"null")
        except json.JSONDecodeError as exc:
            raise Reply(400, f"body is not JSON: {exc}") from None


@dataclass
class StandInSandbox:
    sandbox_id: str
    team: str
    template_id: str
    alias: str | None
    client_id: str
    metadata: dict[str, str]
    env_vars: dict[str, str]
    started_at: datetime
    end_at: datetime
    envd_token: str
    root: Path
    cpu_count: int
    memory_mb: int
    disk_size_mb: int
    allow_internet_access: bool | None = None
    network: dict[str, Any] | None = None
    state: str = "running"
    timeouts: list[int] = field(default_factory=list)  # every timeout asked for, in seconds
    processes: dict[int, asyncio.subprocess.Process] = field(default_factory=dict)
    ptys: dict[int, int] = field(default_factory=dict)  # a pty process's pid -> master fd
    metrics: list[SandboxMetric] = field(default_factory=list)
    # volume mounts on this host: (mount path, made by the stand-in); undone at removal
    mounts: list[tuple[Path, bool]] = field(default_factory=list)

    def path(self, raw: str) -> Path:
        """A path given to envd: a path of this host; a relative one under the sandbox."""
        path = Path(raw)
        return path if path.is_absolute() else self.root / path


@dataclass
class Snapshot:
    team: str
    template_id: str
    name: str | None
    files: Path
    source: str
    cpu_count: int
    memory_mb: int
    disk_size_mb: int

    def snapshot_id(self, slug: str) -> str:
        return f"{slug}/{self.name}:default" if self.name else f"{self.template_id}:default"


@dataclass
class StandInVolume:
    volume_id: str
    team: str
    name: str
    token: str
    files: Path


VOLUME_NAME = re.compile(r"[a-zA-Z0-9_-]{1,128}")  # the stand-in's rule (E2B states none)
VOLUME_CONTENT = re.compile(r"/volumecontent/(?P<vid>[^/]+)/(?P<what>path|dir|file)")
VOLUME_CONTENT_PARAMS = {("GET", "path"): {"path"}, ("DELETE", "path"): {"path"},
                         ("PATCH", "path"): {"path"},
                         ("GET", "dir"): {"path", "depth"},
                         ("POST", "dir"): {"path", "uid", "gid", "mode", "force"},
                         ("GET", "file"): {"path"},
                         ("PUT", "file"): {"path", "uid", "gid", "mode", "force"}}

ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (method, re.compile(pattern), name) for method, pattern, name in [
        ("POST", r"/v2/sandboxes", "create"),
        ("GET", r"/v2/sandboxes", "list"),
        ("GET", r"/sandboxes/(?P<sid>[^/]+)", "get"),
        ("DELETE", r"/sandboxes/(?P<sid>[^/]+)", "kill"),
        ("POST", r"/sandboxes/(?P<sid>[^/]+)/timeout", "timeout"),
        ("POST", r"/sandboxes/(?P<sid>[^/]+)/pause", "pause"),
        ("POST", r"/v2/sandboxes/(?P<sid>[^/]+)/connect", "connect"),
        ("GET", r"/sandboxes/(?P<sid>[^/]+)/metrics", "metrics"),
        ("POST", r"/sandboxes/(?P<sid>[^/]+)/snapshots", "snapshot"),
        ("GET", r"/snapshots", "list_snapshots"),
        ("DELETE", r"/templates/(?P<tid>[^/]+)", "delete_template"),
        ("POST", r"/volumes", "create_volume"),
        ("GET", r"/volumes", "list_volumes"),
        ("GET", r"/volumes/(?P<vid>[^/]+)", "get_volume"),
        ("DELETE", r"/volumes/(?P<vid>[^/]+)", "delete_volume"),
    ]
]
QUERY_PARAMS = {
    "list": {"metadata", "state", "order", "startedAfter", "template", "nextToken", "limit"},
    "metrics": {"start", "end"},
    "list_snapshots": {"sandboxID", "name", "limit", "nextToken"},
}


def _random_id(prefix: str, length: int = 18) -> str:
    alphabet = string.ascii_lowercase + string.digits
    return prefix + "".join(secrets.choice(alphabet) for _ in range(length))


class E2BStandIn:
    """E2B's control plane and envd for any number of teams, each reached by its API key."""

    def __init__(self, keys: dict[str, str], *, page_size: int = 100,
                 metrics_every: float = 5.0) -> None:
        self.keys = dict(keys)  # API key -> team
        self.page_size = page_size
        self.metrics_every = metrics_every
        self.clock_offset = 0.0
        self.create_delay = 0.0
        self.creates_in_flight = 0
        self.max_creates_in_flight = 0
        self.sandboxes: dict[str, StandInSandbox] = {}
        self.snapshots: dict[str, Snapshot] = {}
        self.volumes: dict[str, StandInVolume] = {}
        self.idempotent: dict[tuple[str, str], str] = {}
        self.problems: list[str] = []  # what it did not know: the fixture fails the test
        self.calls: list[tuple[str, str, int]] = []  # (method, route or path, status)
        self.expired: list[str] = []
        self.killed: list[str] = []
        self._rate_limits: list[tuple[str | None, int]] = []
        self.watchers: set[asyncio.Task] = set()  # one per process: forgets it when it exits
        self.started_pids: list[int] = []
        self._lock = threading.Lock()
        self._workdir = Path(tempfile.mkdtemp(prefix="e2b-standin-"))
        self._envd = ProcessASGIApplication(_EnvdProcess(self))
        self._envd_fs = FilesystemASGIApplication(_EnvdFilesystem(self))
        self.uploads: list[tuple[str, str]] = []  # (path, content type) of each /files POST
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # -- control from the tests ----------------------------------------------------------

    def now(self) -> datetime:
        return datetime.fromtimestamp(time.time() + self.clock_offset, UTC)

    def advance(self, seconds: float) -> None:
        """Move the stand-in's clock; the background task then expires what is due."""
        self.clock_offset += seconds

    def rate_limit(self, count: int, route: str | None = None) -> None:
        """Answer the next `count` requests (of `route`, or any) with 429."""
        with self._lock:
            self._rate_limits.append((route, count))

    def count(self, route: str, status: int | None = None) -> int:
        return sum(1 for _, r, s in self.calls if r == route and (status is None or s == status))

    def team_of(self, key: str) -> str:
        return self.keys[key]

    def start(self) -> E2BStandIn:
        config = uvicorn.Config(self, host="127.0.0.1", port=0, log_level="warning",
                                lifespan="on", http="h11", ws="none")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="e2b-standin", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the E2B stand-in did not start")
            time.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(10)
        for sandbox in list(self.sandboxes.values()):
            _kill_processes(sandbox)
            _unmount(sandbox)
        shutil.rmtree(self._workdir, ignore_errors=True)

    # -- ASGI ----------------------------------------------------------------------------

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if scope["path"].startswith("/process.Process/"):
            await self._envd_call(scope, receive, send, headers, self._envd)
            return
        if scope["path"].startswith("/filesystem.Filesystem/"):
            await self._envd_call(scope, receive, send, headers, self._envd_fs)
            return
        if scope["path"] == "/files":
            await self._envd_call(scope, receive, send, headers, self._files)
            return
        if scope["path"].startswith("/volumecontent/"):
            await self._volume_content(scope, receive, send, headers)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        raw_path = scope.get("raw_path") or scope["path"].encode()
        request = Request(scope["method"], raw_path.decode(),
                          parse_qsl(scope.get("query_string", b"").decode(),
                                    keep_blank_values=True),
                          headers, body)
        status, payload, extra = await self._dispatch(request)
        data = b"" if payload is None else json.dumps(payload).encode()
        out_headers = [(b"content-type", b"application/json")] if payload is not None else []
        out_headers += [(k.encode(), v.encode()) for k, v in extra.items()]
        await send({"type": "http.response.start", "status": status, "headers": out_headers})
        await send({"type": "http.response.body", "body": data})

    async def _lifespan(self, receive, send) -> None:
        task = None
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                task = asyncio.create_task(self._background())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if task:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _background(self) -> None:
        """Expire running sandboxes past their end time; sample metrics, as E2B does."""
        last_sample = 0.0
        while True:
            now = self.now()
            for sandbox in list(self.sandboxes.values()):
                if sandbox.state == "running" and sandbox.end_at <= now:
                    self._remove(sandbox)
                    self.expired.append(sandbox.sandbox_id)
            if time.monotonic() - last_sample >= self.metrics_every:
                last_sample = time.monotonic()
                for sandbox in list(self.sandboxes.values()):
                    if sandbox.state == "running":
                        sandbox.metrics.append(self._sample(sandbox, now))
            await asyncio.sleep(0.05)

    def _sample(self, sandbox: StandInSandbox, now: datetime) -> SandboxMetric:
        busy = len(sandbox.processes)  # a stand-in load figure: 25 % of the VM per process
        return SandboxMetric(
            timestamp=now.replace(microsecond=0), timestamp_unix=int(now.timestamp()),
            cpu_count=sandbox.cpu_count, cpu_used_pct=min(100.0, 5.0 + 25.0 * busy),
            mem_used=(64 + 16 * busy) * MiB, mem_total=sandbox.memory_mb * MiB,
            mem_cache=8 * MiB, disk_used=20 * MiB, disk_total=sandbox.disk_size_mb * MiB)

    def _problem(self, text: str) -> None:
        self.problems.append(text)

    async def _dispatch(self, request: Request) -> tuple[int, Any, dict[str, str]]:
        path = request.path.split("?", 1)[0]
        route = next(((name, match) for method, pattern, name in ROUTES
                      if method == request.method and (match := pattern.fullmatch(path))), None)
        if route is None:
            self._problem(f"unknown endpoint {request.method} {path}")
            self.calls.append((request.method, path, 501))
            return 501, Error(code=501, message=f"stand-in: unknown endpoint {request.method} "
                                                f"{path}").to_dict(), {}
        name, match = route
        try:
            team = self.keys.get(request.headers.get("x-api-key", ""))
            if team is None:
                raise Reply(401, "Invalid API key")
            unknown = {k for k, _ in request.query} - QUERY_PARAMS.get(name, set())
            if unknown:
                self._problem(f"{name}: unknown query parameters {sorted(unknown)}")
                raise Reply(400, f"unknown query parameters {sorted(unknown)}")
            if self._take_rate_limit(name):
                raise Reply(429, "Rate limit exceeded (stand-in)")
            args = {k: unquote(v) for k, v in match.groupdict().items()}
            status, payload, extra = await getattr(self, f"_{name}")(team, request, **args)
        except Reply as reply:
            status, payload, extra = (reply.status, Error(code=reply.status,
                                                          message=reply.message).to_dict(),
                                      reply.headers)
        self.calls.append((request.method, name, status))
        return status, payload, extra

    def _take_rate_limit(self, route: str) -> bool:
        with self._lock:
            for index, (wanted, left) in enumerate(self._rate_limits):
                if wanted in (None, route) and left > 0:
                    self._rate_limits[index] = (wanted, left - 1)
                    return True
        return False

    def _parse(self, model: type, data: Any):
        """The body as the SDK's own model; anything it does not define is a problem."""
        if not isinstance(data, dict):
            self._problem(f"{model.__name__}: body is not an object: {data!r}")
            raise Reply(400, f"{model.__name__} must be an object")
        try:
            parsed = model.from_dict(data)
        except (KeyError, TypeError, ValueError) as exc:
            self._problem(f"{model.__name__}: cannot parse {data!r}: {exc!r}")
            raise Reply(400, f"invalid {model.__name__}: {exc}") from None
        extra = dict(parsed.additional_properties)
        nested = getattr(parsed, "network", UNSET)
        if not isinstance(nested, Unset | None) and getattr(nested, "additional_properties", None):
            extra.update({f"network.{k}": v for k, v in nested.additional_properties.items()})
        if extra:
            self._problem(f"{model.__name__}: unknown fields {sorted(extra)}")
            raise Reply(400, f"unknown fields {sorted(extra)}")
        return parsed

    def _sandbox(self, team: str, sid: str) -> StandInSandbox:
        sandbox = self.sandboxes.get(sid)
        if sandbox is None or sandbox.team != team:
            raise Reply(404, f"sandbox \"{sid}\" doesn't exist or you don't have access to it")
        return sandbox

    def _remove(self, sandbox: StandInSandbox) -> None:
        _kill_processes(sandbox)
        _unmount(sandbox)
        self.sandboxes.pop(sandbox.sandbox_id, None)
        shutil.rmtree(sandbox.root, ignore_errors=True)

    @staticmethod
    def _slug(team: str) -> str:
        return team

    def _template(self, team: str, ref: str) -> tuple[str, str | None, tuple[int, int, int],
                                                       Path | None]:
        """(template id, alias, sizes, files) of a template name, id or snapshot id."""
        name = ref.split(":", 1)[0]
        namespace, _, name = name.rpartition("/")
        if name in TEMPLATES and not namespace:
            return name, name, TEMPLATES[name], None
        for snap in self.snapshots.values():
            if snap.team == team and name in (snap.template_id, snap.name) and \
                    namespace in ("", self._slug(team)):
                return snap.template_id, snap.name, (snap.cpu_count, snap.memory_mb,
                                                     snap.disk_size_mb), snap.files
        raise Reply(404, f"template '{ref}' not found")

    def _created(self, sandbox: StandInSandbox) -> dict[str, Any]:
        return Sandbox(template_id=sandbox.template_id, sandbox_id=sandbox.sandbox_id,
                       client_id=sandbox.client_id, envd_version=ENVD_VERSION,
                       alias=sandbox.alias or UNSET, envd_access_token=sandbox.envd_token,
                       traffic_access_token=None, domain=None).to_dict()

    # -- the REST API --------------------------------------------------------------------

    async def _create(self, team: str, request: Request):
        body = self._parse(NewSandboxV2, request.json())
        key = request.headers.get("idempotency-key")
        if key and (team, key) in self.idempotent:
            existing = self.sandboxes.get(self.idempotent[(team, key)])
            if existing is not None:
                return 201, self._created(existing), {}
        self.creates_in_flight += 1
        self.max_creates_in_flight = max(self.max_creates_in_flight, self.creates_in_flight)
        try:
            await asyncio.sleep(self.create_delay)
        finally:
            self.creates_in_flight -= 1
        template_id, alias, (cpu, memory, disk), files = self._template(team, body.template_id)
        timeout = DEFAULT_TIMEOUT_S if isinstance(body.timeout, Unset) else body.timeout
        if not 0 < timeout <= MAX_TIMEOUT_S:
            raise Reply(400, f"timeout must be between 1 and {MAX_TIMEOUT_S} seconds")
        metadata = {} if isinstance(body.metadata, Unset) else dict(body.metadata or {})
        if not all(isinstance(v, str) for v in metadata.values()):
            raise Reply(400, "metadata values must be strings")
        mounts = self._volume_mounts(team, body)
        sid = _random_id("i")
        root = self._workdir / sid
        if files is not None:
            shutil.copytree(files, root)
        else:
            root.mkdir()
        network = body.network.to_dict() if not isinstance(body.network, Unset) else None
        now = self.now()
        sandbox = StandInSandbox(
            sandbox_id=sid, team=team, template_id=template_id, alias=alias,
            client_id="stand-in", metadata=metadata,
            env_vars={} if isinstance(body.env_vars, Unset) else dict(body.env_vars or {}),
            started_at=now, end_at=now + timedelta(seconds=timeout),
            envd_token=secrets.token_urlsafe(16), root=root, cpu_count=cpu, memory_mb=memory,
            disk_size_mb=disk,
            allow_internet_access=None if isinstance(body.allow_internet_access, Unset)
            else body.allow_internet_access,
            network=network, timeouts=[timeout])
        sandbox.metrics.append(self._sample(sandbox, now))
        try:
            for path, volume in mounts:
                sandbox.mounts.append((path, _mount(volume.files, path)))
        except OSError as exc:
            _unmount(sandbox)
            shutil.rmtree(root, ignore_errors=True)
            raise Reply(500, f"stand-in could not mount a volume: {exc}") from None
        self.sandboxes[sid] = sandbox
        if key:
            self.idempotent[(team, key)] = sid
        return 201, self._created(sandbox), {}

    async def _list(self, team: str, request: Request):
        params = dict(request.query)
        wanted: dict[str, str] = {}
        if params.get("metadata"):  # quoted by the SDK, urlencoded, then encoded as a value
            wanted = {unquote(k): unquote(v)
                      for k, v in parse_qsl(params["metadata"], keep_blank_values=True)}
        states = set(params["state"].split(",")) if params.get("state") else {"running", "paused"}
        if not states <= {"running", "paused"}:
            raise Reply(400, f"bad state filter {params['state']!r}")
        found = sorted((s for s in self.sandboxes.values()
                        if s.team == team and s.state in states
                        and all(s.metadata.get(k) == v for k, v in wanted.items())),
                       key=lambda s: (s.started_at, s.sandbox_id))
        size = min(int(params.get("limit") or self.page_size), self.page_size)
        offset = int(params.get("nextToken") or 0)
        page = found[offset:offset + size]
        headers = {"x-next-token": str(offset + size)} if offset + size < len(found) else {}
        return 200, [ListedSandbox(
            template_id=s.template_id, sandbox_id=s.sandbox_id, client_id=s.client_id,
            started_at=s.started_at, end_at=s.end_at, cpu_count=s.cpu_count,
            memory_mb=s.memory_mb, disk_size_mb=s.disk_size_mb, state=SandboxState(s.state),
            envd_version=ENVD_VERSION, alias=s.alias or UNSET, metadata=s.metadata,
        ).to_dict() for s in page], headers

    async def _get(self, team: str, request: Request, sid: str):
        s = self._sandbox(team, sid)
        return 200, SandboxDetail(
            template_id=s.template_id, sandbox_id=s.sandbox_id, client_id=s.client_id,
            started_at=s.started_at, end_at=s.end_at, envd_version=ENVD_VERSION,
            cpu_count=s.cpu_count, memory_mb=s.memory_mb, disk_size_mb=s.disk_size_mb,
            state=SandboxState(s.state), alias=s.alias or UNSET, envd_access_token=s.envd_token,
            metadata=s.metadata, domain=None,
        ).to_dict(), {}

    async def _kill(self, team: str, request: Request, sid: str):
        sandbox = self._sandbox(team, sid)
        self._remove(sandbox)
        self.killed.append(sid)
        return 204, None, {}

    async def _timeout(self, team: str, request: Request, sid: str):
        body = self._parse(SandboxTimeoutRequest, request.json())
        sandbox = self._sandbox(team, sid)
        if sandbox.state != "running":  # E2B keeps only running sandboxes on the clock
            raise Reply(404, f"sandbox \"{sid}\" is not running")
        if not 0 <= body.timeout <= MAX_TIMEOUT_S:
            raise Reply(400, f"timeout must be between 0 and {MAX_TIMEOUT_S} seconds")
        sandbox.end_at = self.now() + timedelta(seconds=body.timeout)
        sandbox.timeouts.append(body.timeout)
        return 204, None, {}

    async def _pause(self, team: str, request: Request, sid: str):
        self._parse(SandboxPauseRequest, request.json() or {})
        sandbox = self._sandbox(team, sid)
        if sandbox.state == "paused":
            raise Reply(409, f"sandbox \"{sid}\" is already paused")
        sandbox.state = "paused"
        _signal_processes(sandbox, signal.SIGSTOP)  # memory is kept: processes freeze
        return 204, None, {}

    async def _connect(self, team: str, request: Request, sid: str):
        body = self._parse(ConnectSandboxV2, request.json() or {})
        sandbox = self._sandbox(team, sid)
        timeout = DEFAULT_TIMEOUT_S if isinstance(body.timeout, Unset) else body.timeout
        if not 0 <= timeout <= MAX_TIMEOUT_S:
            raise Reply(400, f"timeout must be between 0 and {MAX_TIMEOUT_S} seconds")
        until = self.now() + timedelta(seconds=timeout)
        if sandbox.state == "paused":
            sandbox.state = "running"
            sandbox.end_at = until
            sandbox.timeouts.append(timeout)
            _signal_processes(sandbox, signal.SIGCONT)
            return 201, self._created(sandbox), {}
        if until > sandbox.end_at:  # a running sandbox's timeout only grows
            sandbox.end_at = until
            sandbox.timeouts.append(timeout)
        return 200, self._created(sandbox), {}

    async def _metrics(self, team: str, request: Request, sid: str):
        sandbox = self._sandbox(team, sid)
        params = dict(request.query)
        start = int(params["start"]) if params.get("start") else 0
        end = int(params["end"]) if params.get("end") else 2**62
        return 200, [m.to_dict() for m in sandbox.metrics
                     if start <= m.timestamp_unix <= end], {}

    async def _snapshot(self, team: str, request: Request, sid: str):
        body = self._parse(SandboxSnapshotRequest, request.json() or {})
        sandbox = self._sandbox(team, sid)
        name = None if isinstance(body.name, Unset) else body.name
        if name is not None and not re.fullmatch(r"[a-z0-9_-]+", name):
            raise Reply(400, f"invalid snapshot name {name!r}")
        existing = next((s for s in self.snapshots.values()
                         if name and s.team == team and s.name == name), None)
        template_id = existing.template_id if existing else _random_id("s", 20)
        files = self._workdir / f"snapshot-{template_id}"
        shutil.rmtree(files, ignore_errors=True)
        shutil.copytree(sandbox.root, files)
        snap = Snapshot(team=team, template_id=template_id, name=name, files=files,
                        source=sid, cpu_count=sandbox.cpu_count, memory_mb=sandbox.memory_mb,
                        disk_size_mb=sandbox.disk_size_mb)
        self.snapshots[template_id] = snap
        names = [snap.snapshot_id(self._slug(team))] if name else []
        return 201, SnapshotInfo(snapshot_id=snap.snapshot_id(self._slug(team)),
                                 names=names).to_dict(), {}

    async def _list_snapshots(self, team: str, request: Request):
        params = dict(request.query)
        slug = self._slug(team)
        found = [s for s in self.snapshots.values() if s.team == team
                 and (not params.get("sandboxID") or s.source == params["sandboxID"])
                 and (not params.get("name") or params["name"] in (
                     s.name, s.template_id, s.snapshot_id(slug)))]
        found.sort(key=lambda s: s.template_id)
        size = min(int(params.get("limit") or self.page_size), self.page_size)
        offset = int(params.get("nextToken") or 0)
        headers = {"x-next-token": str(offset + size)} if offset + size < len(found) else {}
        return 200, [SnapshotInfo(snapshot_id=s.snapshot_id(slug),
                                  names=[s.snapshot_id(slug)] if s.name else []).to_dict()
                     for s in found[offset:offset + size]], headers

    async def _delete_template(self, team: str, request: Request, tid: str):
        name = tid.split(":", 1)[0].rpartition("/")[2]
        snap = next((s for s in self.snapshots.values()
                     if s.team == team and name in (s.template_id, s.name)), None)
        if snap is None:
            raise Reply(404, f"template '{tid}' not found")
        del self.snapshots[snap.template_id]
        shutil.rmtree(snap.files, ignore_errors=True)
        return 204, None, {}

    # -- volumes: the REST API, and mounts at create ---------------------------------------

    def _volume(self, team: str, vid: str) -> StandInVolume:
        volume = self.volumes.get(vid)
        if volume is None or volume.team != team:
            raise Reply(404, f"volume \"{vid}\" doesn't exist or you don't have access to it")
        return volume

    def _volume_mounts(self, team: str, body: NewSandboxV2) -> list[tuple[Path, StandInVolume]]:
        """A create's `volumeMounts`: each a team's volume by name, at an absolute path no
        other live sandbox mounts (this host has one mount per path)."""
        if isinstance(body.volume_mounts, Unset) or not body.volume_mounts:
            return []
        found = []
        for mount in body.volume_mounts:
            if mount.additional_properties:
                self._problem(f"SandboxVolumeMount: unknown fields {mount.additional_keys}")
                raise Reply(400, f"unknown fields {mount.additional_keys}")
            volume = next((v for v in self.volumes.values()
                           if v.team == team and v.name == mount.name), None)
            if volume is None:
                raise Reply(400, f"volume '{mount.name}' not found")
            path = Path(mount.path)
            if not path.is_absolute() or ".." in path.parts or path == Path("/"):
                raise Reply(400, f"invalid mount path '{mount.path}'")
            if any(p == path for s in self.sandboxes.values() for p, _ in s.mounts):
                self._problem(f"two sandboxes mount {path} at once (one host mount per path)")
                raise Reply(400, f"stand-in: {path} is mounted by another sandbox")
            found.append((path, volume))
        return found

    def _volume_and_token(self, volume: StandInVolume) -> dict[str, Any]:
        return VolumeAndToken(volume_id=volume.volume_id, name=volume.name,
                              token=volume.token).to_dict()

    async def _create_volume(self, team: str, request: Request):
        body = self._parse(NewVolume, request.json())
        if not VOLUME_NAME.fullmatch(body.name):
            raise Reply(400, f"invalid volume name '{body.name}'")
        if any(v.team == team and v.name == body.name for v in self.volumes.values()):
            raise Reply(409, f"volume with name '{body.name}' already exists")
        vid = _random_id("v", 20)
        files = self._workdir / f"volume-{vid}"
        files.mkdir()
        volume = StandInVolume(vid, team, body.name, secrets.token_urlsafe(16), files)
        self.volumes[vid] = volume
        return 201, self._volume_and_token(volume), {}

    async def _list_volumes(self, team: str, request: Request):
        found = sorted((v for v in self.volumes.values() if v.team == team),
                       key=lambda v: v.volume_id)
        return 200, [VolumeModel(volume_id=v.volume_id, name=v.name).to_dict()
                     for v in found], {}

    async def _get_volume(self, team: str, request: Request, vid: str):
        return 200, self._volume_and_token(self._volume(team, vid)), {}

    async def _delete_volume(self, team: str, request: Request, vid: str):
        volume = self._volume(team, vid)
        del self.volumes[vid]
        shutil.rmtree(volume.files, ignore_errors=True)
        return 204, None, {}

    # -- the volume content API ----------------------------------------------------------

    async def _volume_content(self, scope, receive, send, headers: dict[str, str]) -> None:
        """`/volumecontent/{id}/path|dir|file`, authenticated by the volume's bearer token.
        Paths are the volume's own (/ its root); a body is read whole (tests move little)."""
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        method = scope["method"]
        query = parse_qsl(scope.get("query_string", b"").decode(), keep_blank_values=True)
        match = VOLUME_CONTENT.fullmatch(scope["path"])
        status, payload, kind = 200, b"", b"application/json"
        try:
            if match is None or (method, match["what"]) not in VOLUME_CONTENT_PARAMS:
                self._problem(f"unknown endpoint {method} {scope['path']}")
                raise Reply(501, f"stand-in: unknown endpoint {method} {scope['path']}")
            route = f"volumecontent_{method.lower()}_{match['what']}"
            unknown = {k for k, _ in query} - VOLUME_CONTENT_PARAMS[(method, match["what"])]
            if unknown:
                self._problem(f"{route}: unknown query parameters {sorted(unknown)}")
                raise Reply(400, f"unknown query parameters {sorted(unknown)}")
            volume = self.volumes.get(match["vid"])
            if volume is None:
                raise Reply(404, f"volume \"{match['vid']}\" not found")
            if headers.get("authorization") != f"Bearer {volume.token}":
                raise Reply(401, "invalid volume token")
            params = dict(query)
            if "path" not in params:
                raise Reply(400, "path is required")
            status, payload, kind = self._content(volume, method, match["what"], params, body)
        except Reply as reply:
            status, kind = reply.status, b"application/json"
            payload = json.dumps(Error(code=reply.status, message=reply.message).to_dict()
                                 ).encode()
        self.calls.append((method, scope["path"], status))
        out = [(b"content-type", kind)] if payload or status != 204 else []
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": payload})

    def _content(self, volume: StandInVolume, method: str, what: str, params: dict[str, str],
                 body: bytes) -> tuple[int, bytes, bytes]:
        rel = os.path.normpath("/" + params["path"]).lstrip("/")
        if ".." in Path(rel).parts:
            raise Reply(400, f"invalid path '{params['path']}'")
        host = volume.files / rel if rel else volume.files
        shown = "/" + rel

        def entry(path: Path) -> bytes:
            return json.dumps(_volume_entry(volume, path)).encode()

        if method in ("GET", "DELETE", "PATCH") and not os.path.lexists(host):
            raise Reply(404, f"path '{shown}' does not exist")
        if (method, what) == ("GET", "path"):
            return 200, entry(host), b"application/json"
        if (method, what) == ("PATCH", "path"):  # uid and gid kept: tests run as root
            try:
                patch = self._parse(PatchPathBody, json.loads(body or b"null"))
            except json.JSONDecodeError:
                raise Reply(400, "body is not JSON") from None
            if not isinstance(patch.mode, Unset):
                host.chmod(patch.mode & 0o7777)
            return 200, entry(host), b"application/json"
        if (method, what) == ("DELETE", "path"):
            if not rel:
                raise Reply(400, "cannot remove the volume's root")
            if host.is_dir() and not host.is_symlink():
                shutil.rmtree(host)
            else:
                host.unlink()
            return 204, b"", b""
        if (method, what) == ("GET", "dir"):
            if not host.is_dir():
                raise Reply(400, f"path '{shown}' is not a directory")
            depth = int(params.get("depth") or 1)
            entries = []
            for folder, dirs, files in os.walk(host):
                level = len(Path(folder).relative_to(host).parts) + 1
                for name in sorted(dirs + files):
                    entries.append(_volume_entry(volume, Path(folder) / name))
                if level >= depth:
                    dirs.clear()
            return 200, json.dumps(entries).encode(), b"application/json"
        force = params.get("force") in ("true", "True", "1")
        mode = int(params["mode"]) if params.get("mode") else None
        if not host.parent.is_dir():
            if not force:
                raise Reply(404, f"parent of '{shown}' does not exist")
            host.parent.mkdir(parents=True)
        if (method, what) == ("POST", "dir"):
            if os.path.lexists(host) and not host.is_dir():
                raise Reply(400, f"path '{shown}' exists and is not a directory")
            host.mkdir(exist_ok=True)
            if mode is not None:
                host.chmod(mode & 0o7777)
            return 201, entry(host), b"application/json"
        if (method, what) == ("GET", "file"):
            if not host.is_file():
                raise Reply(400, f"path '{shown}' is not a file")
            return 200, host.read_bytes(), b"application/octet-stream"
        # PUT file
        if host.is_dir() or (os.path.lexists(host) and not force):
            raise Reply(400, f"path '{shown}' exists (force overwrites a file)")
        if host.is_symlink():
            host.unlink()
        host.write_bytes(body)
        if mode is not None:
            host.chmod(mode & 0o7777)
        return 201, entry(host), b"application/json"

    # -- envd ----------------------------------------------------------------------------

    async def _envd_call(self, scope, receive, send, headers: dict[str, str], app) -> None:
        """envd sits behind E2B's proxy: the sandbox must exist and run, the token match."""
        sandbox = self.sandboxes.get(headers.get("e2b-sandbox-id", ""))
        status = None
        if sandbox is None or sandbox.state != "running" or \
                headers.get("e2b-sandbox-port") != "49983":
            status, text = 502, b"The sandbox was not found or is not running"
        elif headers.get("x-access-token") != sandbox.envd_token:
            status, text = 401, b"bad envd access token"
        self.calls.append(("POST", scope["path"], status or 200))
        if status is not None:
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": text})
            return
        await app(scope, receive, send)

    async def _files(self, scope, receive, send) -> None:
        """envd's /files: GET streams a file out; POST with an application/octet-stream body
        streams one in (parents made), answering its EntryInfo list as envd does. What else
        arrives (multipart, another method) is a problem."""
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        sandbox = self.sandboxes[headers["e2b-sandbox-id"]]
        query = dict(parse_qsl(scope.get("query_string", b"").decode(), keep_blank_values=True))
        unknown = set(query) - {"path", "username"}

        async def answer(status: int, body: bytes, kind: bytes = b"application/json") -> None:
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", kind)]})
            await send({"type": "http.response.body", "body": body})

        def error(status: int, message: str) -> bytes:
            return json.dumps({"code": status, "message": message}).encode()

        if unknown or "path" not in query:
            self._problem(f"/files: unknown or missing query parameters {sorted(query)}")
            await answer(400, error(400, "path is required"))
            return
        path = sandbox.path(query["path"])
        if scope["method"] == "GET":
            if not path.is_file():
                status = 404 if not path.exists() else 400
                await answer(status, error(status, f"path '{query['path']}' does not exist"
                                           if status == 404 else "path is a directory"))
                return
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"application/octet-stream"),
                (b"content-length", str(path.stat().st_size).encode())]})
            with path.open("rb") as file:
                while chunk := await asyncio.to_thread(file.read, 256 * 1024):
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        kind = headers.get("content-type", "")
        if scope["method"] != "POST" or kind != "application/octet-stream" or \
                headers.get("content-encoding"):
            self._problem(f"/files: {scope['method']} with {kind!r} is not served")
            await answer(400, error(400, "stand-in: only octet-stream uploads"))
            return
        self.uploads.append((query["path"], kind))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("wb") as file:
                while True:
                    message = await receive()
                    if message.get("body"):
                        await asyncio.to_thread(file.write, message["body"])
                    if not message.get("more_body"):
                        break
        except OSError as exc:
            await answer(400, error(400, f"cannot write {query['path']}: {exc.strerror}"))
            return
        await answer(200, json.dumps([{"name": path.name, "type": "file",
                                       "path": str(path)}]).encode())

    def envd_sandbox(self, ctx) -> StandInSandbox:
        sandbox = self.sandboxes.get(ctx.request_headers.get("e2b-sandbox-id", ""))
        if sandbox is None:
            raise ConnectError(Code.NOT_FOUND, "sandbox not found")
        return sandbox


class _EnvdProcess:
    """envd's process service: Start runs the command for real; SendSignal kills it."""

    def __init__(self, standin: E2BStandIn) -> None:
        self.standin = standin

    async def start(self, request: pb.StartRequest, ctx) -> AsyncIterator[pb.StartResponse]:
        sandbox = self.standin.envd_sandbox(ctx)
        config = request.process
        args = list(config.args) if config else []
        if config is None or config.cmd != "/bin/bash" or args[:2] != ["-l", "-c"] or \
                len(args) != 3 or (request.pty is not None and (
                    request.pty.size is None or request.has_field("stdin"))):
            self.standin._problem(f"envd Start with an unexpected shape: {request!r}")
            raise ConnectError(Code.INVALID_ARGUMENT, "stand-in runs only bash -l -c CMD")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(sandbox.root),
               **sandbox.env_vars, **dict(config.envs)}
        cwd = sandbox.path(config.cwd) if config.has_field("cwd") else sandbox.root
        if not cwd.is_dir():  # as envd: the process is not started
            raise ConnectError(Code.INVALID_ARGUMENT, f"cwd '{config.cwd}' does not exist")
        if request.pty is not None:
            async for event in self._start_pty(sandbox, args[2], cwd, env, request.pty.size):
                yield event
            return
        with_stdin = request.has_field("stdin") and request.stdin
        proc = await asyncio.create_subprocess_exec(
            "sh", "-c", args[2], cwd=cwd, env=env,
            stdin=asyncio.subprocess.PIPE if with_stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
        sandbox.processes[proc.pid] = proc

        async def forget_when_done() -> None:  # whether or not a client still listens
            await proc.wait()
            sandbox.processes.pop(proc.pid, None)

        watcher = asyncio.create_task(forget_when_done())
        self.standin.watchers.add(watcher)
        watcher.add_done_callback(self.standin.watchers.discard)
        self.standin.started_pids.append(proc.pid)
        yield _event("start", pb.ProcessEvent.StartEvent(pid=proc.pid))
        queue: asyncio.Queue[tuple[str, bytes | None]] = asyncio.Queue()

        async def pump(stream: asyncio.StreamReader, name: str) -> None:
            while chunk := await stream.read(65536):
                await queue.put((name, chunk))
            await queue.put((name, None))

        pumps = [asyncio.create_task(pump(proc.stdout, "stdout")),
                 asyncio.create_task(pump(proc.stderr, "stderr"))]
        try:
            open_streams = 2
            while open_streams:
                name, chunk = await queue.get()
                if chunk is None:
                    open_streams -= 1
                    continue
                yield _event("data", pb.ProcessEvent.DataEvent(output=Oneof(name, chunk)))
            code = await proc.wait()
        finally:  # a client that goes away leaves the process running, as envd does
            for task in pumps:
                task.cancel()
        if code >= 0:
            end = pb.ProcessEvent.EndEvent(exit_code=code, exited=True,
                                           status=f"exit status {code}")
        else:
            end = pb.ProcessEvent.EndEvent(exit_code=-1, exited=False,
                                           status=f"signal: {signal.Signals(-code).name}")
        yield _event("end", end)

    async def _start_pty(self, sandbox: StandInSandbox, command: str, cwd: Path,
                         env: dict[str, str], size: pb.PTY.Size,
                         ) -> AsyncIterator[pb.StartResponse]:
        """The command on a pseudo-terminal, as envd runs one: its controlling terminal (a
        session of its own), stdin, stdout and stderr, sized as asked; output as `pty` data
        until every holder of the terminal is gone, then the end event."""
        master, slave = os.openpty()
        _pty_size(master, size)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _ON_TERMINAL, "sh", "-c", command, cwd=cwd, env=env,
                stdin=slave, stdout=slave, stderr=slave)
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        sandbox.processes[proc.pid] = proc
        sandbox.ptys[proc.pid] = master
        self.standin.started_pids.append(proc.pid)
        # the terminal is closed once the program has ended and no client reads it (a
        # client that goes away leaves the program running, as envd does)
        held = {"reader": True}

        def release() -> None:
            if proc.returncode is not None and not held["reader"] and \
                    sandbox.ptys.get(proc.pid) == master:
                del sandbox.ptys[proc.pid]
                os.close(master)

        async def forget_when_done() -> None:
            await proc.wait()
            sandbox.processes.pop(proc.pid, None)
            release()

        watcher = asyncio.create_task(forget_when_done())
        self.standin.watchers.add(watcher)
        watcher.add_done_callback(self.standin.watchers.discard)
        try:
            yield _event("start", pb.ProcessEvent.StartEvent(pid=proc.pid))
            while True:
                try:
                    chunk = await asyncio.to_thread(os.read, master, 65536)
                except OSError:  # EIO: the terminal's other end is closed by all
                    chunk = b""
                if not chunk:
                    break
                yield _event("data", pb.ProcessEvent.DataEvent(output=Oneof("pty", chunk)))
            code = await proc.wait()
        finally:
            held["reader"] = False
            release()
        yield _event("end", _end_event(code))

    async def update(self, request: pb.UpdateRequest, ctx) -> pb.UpdateResponse:
        """A pty's new size (the kernel tells its foreground process, SIGWINCH)."""
        proc = self._process(request, ctx, "Update")
        master = self.standin.envd_sandbox(ctx).ptys.get(proc.pid)
        if master is None or request.pty is None or request.pty.size is None:
            self.standin._problem(f"envd Update of what is not a pty, or not a size: {request!r}")
            raise ConnectError(Code.INVALID_ARGUMENT, "stand-in updates a pty's size only")
        _pty_size(master, request.pty.size)
        return pb.UpdateResponse()

    def _process(self, request, ctx, what: str) -> asyncio.subprocess.Process:
        sandbox = self.standin.envd_sandbox(ctx)
        selector = request.process.selector if request.process else None
        if not (isinstance(selector, Oneof) and selector.field == "pid"):
            self.standin._problem(f"envd {what} with an unexpected selector: {request!r}")
            raise ConnectError(Code.INVALID_ARGUMENT, "stand-in selects processes by pid")
        proc = sandbox.processes.get(selector.value)
        if proc is None:
            raise ConnectError(Code.NOT_FOUND, f"process with pid {selector.value} not found")
        return proc

    async def send_input(self, request: pb.SendInputRequest, ctx) -> pb.SendInputResponse:
        proc = self._process(request, ctx, "SendInput")
        given = request.input.input if request.input else None
        master = self.standin.envd_sandbox(ctx).ptys.get(proc.pid)
        if master is not None and isinstance(given, Oneof) and given.field == "pty":
            with contextlib.suppress(OSError):  # the program ended: its end event says so
                await asyncio.to_thread(_write_all, master, given.value)
            return pb.SendInputResponse()
        if not (isinstance(given, Oneof) and given.field == "stdin"):
            self.standin._problem(f"envd SendInput with an unexpected input: {request!r}")
            raise ConnectError(Code.INVALID_ARGUMENT, "stand-in takes stdin input only")
        if proc.stdin is None or proc.stdin.is_closing():
            raise ConnectError(Code.FAILED_PRECONDITION, "stdin is not open")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(given.value)
            await proc.stdin.drain()
        return pb.SendInputResponse()

    async def close_stdin(self, request: pb.CloseStdinRequest, ctx) -> pb.CloseStdinResponse:
        proc = self._process(request, ctx, "CloseStdin")
        if proc.stdin is not None:
            proc.stdin.close()
        return pb.CloseStdinResponse()

    async def send_signal(self, request: pb.SendSignalRequest, ctx) -> pb.SendSignalResponse:
        proc = self._process(request, ctx, "SendSignal")
        number = {pb.Signal.SIGKILL: signal.SIGKILL, pb.Signal.SIGTERM: signal.SIGTERM}.get(
            request.signal)
        if number is None:
            raise ConnectError(Code.INVALID_ARGUMENT, f"unknown signal {request.signal!r}")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, number)
        return pb.SendSignalResponse()

    def _unknown(self, name: str) -> Callable:
        def refuse() -> ConnectError:
            self.standin._problem(f"envd {name} is not implemented by the stand-in")
            return ConnectError(Code.UNIMPLEMENTED, f"stand-in: {name} not implemented")

        async def unary(request, ctx):
            raise refuse()

        async def stream(request, ctx):
            raise refuse()
            yield  # an async generator, for the streaming methods

        return stream if name == "connect" else unary

    def __getattr__(self, name: str):  # list, connect, update, send_input, ...: refused loudly
        if name.startswith("__"):
            raise AttributeError(name)
        return self._unknown(name)


class _EnvdFilesystem:
    """envd's filesystem service over this host's paths (as the commands see them): stat,
    list_dir (to a depth), make_dir (with parents; ALREADY_EXISTS when there), move (parents
    of the destination made) and remove (recursive, as envd's). Missing paths: NOT_FOUND.
    Watchers are refused loudly."""

    def __init__(self, standin: E2BStandIn) -> None:
        self.standin = standin

    def _path(self, ctx, raw: str, *, exists: bool = True) -> Path:
        path = self.standin.envd_sandbox(ctx).path(raw)
        if exists and not os.path.lexists(path):
            raise ConnectError(Code.NOT_FOUND, f"path '{raw}' does not exist")
        return path

    async def stat(self, request: fs_pb.StatRequest, ctx) -> fs_pb.StatResponse:
        return fs_pb.StatResponse(entry=_entry(self._path(ctx, request.path)))

    async def list_dir(self, request: fs_pb.ListDirRequest, ctx) -> fs_pb.ListDirResponse:
        top = self._path(ctx, request.path)
        if not top.is_dir():
            raise ConnectError(Code.INVALID_ARGUMENT, f"path '{request.path}' is not a directory")
        depth = request.depth or 1
        entries = []
        for folder, dirs, files in os.walk(top):
            level = len(Path(folder).relative_to(top).parts) + 1
            for name in sorted(dirs + files):
                entries.append(_entry(Path(folder) / name))
            if level >= depth:
                dirs.clear()
        return fs_pb.ListDirResponse(entries=entries)

    async def make_dir(self, request: fs_pb.MakeDirRequest, ctx) -> fs_pb.MakeDirResponse:
        path = self._path(ctx, request.path, exists=False)
        if os.path.lexists(path):
            raise ConnectError(Code.ALREADY_EXISTS, f"path '{request.path}' already exists")
        try:
            path.mkdir(parents=True)
        except OSError as exc:
            raise ConnectError(Code.INVALID_ARGUMENT, f"cannot make {request.path}: "
                                                      f"{exc.strerror}") from None
        return fs_pb.MakeDirResponse(entry=_entry(path))

    async def move(self, request: fs_pb.MoveRequest, ctx) -> fs_pb.MoveResponse:
        source = self._path(ctx, request.source)
        destination = self._path(ctx, request.destination, exists=False)
        try:
            destination.parent.mkdir(parents=True, exist_ok=True)
            os.rename(source, destination)
        except OSError as exc:
            raise ConnectError(Code.INVALID_ARGUMENT, f"cannot move {request.source}: "
                                                      f"{exc.strerror}") from None
        return fs_pb.MoveResponse(entry=_entry(destination))

    async def remove(self, request: fs_pb.RemoveRequest, ctx) -> fs_pb.RemoveResponse:
        path = self._path(ctx, request.path)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        return fs_pb.RemoveResponse()

    def __getattr__(self, name: str):  # watchers: refused loudly
        if name.startswith("__"):
            raise AttributeError(name)

        async def refuse(request, ctx):
            self.standin._problem(f"envd filesystem {name} is not implemented by the stand-in")
            raise ConnectError(Code.UNIMPLEMENTED, f"stand-in: {name} not implemented")
            yield  # pragma: no cover (an async generator for the streaming watch_dir)

        async def unary(request, ctx):
            self.standin._problem(f"envd filesystem {name} is not implemented by the stand-in")
            raise ConnectError(Code.UNIMPLEMENTED, f"stand-in: {name} not implemented")

        return refuse if name == "watch_dir" else unary


def _entry(path: Path) -> fs_pb.EntryInfo:
    """As newer envd reports it: a link's `type` is its target's, `is_symlink` marks it."""
    st = os.lstat(path)
    link = stat_module.S_ISLNK(st.st_mode)
    target = os.stat(path) if link and path.exists() else st
    kind = fs_pb.FileType.DIRECTORY if stat_module.S_ISDIR(target.st_mode) else \
        fs_pb.FileType.FILE
    fields: dict[str, Any] = {}
    if link:
        fields["symlink_target"] = os.readlink(path)
    return fs_pb.EntryInfo(
        name=path.name, type=kind, path=str(path), size=st.st_size,
        mode=stat_module.S_IMODE(st.st_mode), permissions=stat_module.filemode(st.st_mode),
        owner=str(st.st_uid), group=str(st.st_gid),
        modified_time=Timestamp.from_seconds(int(st.st_mtime)), is_symlink=link, **fields)


# run as `python -c _ON_TERMINAL PROGRAM ARGS...` with the terminal as stdin: no signal
# blocked (the server's thread that starts it blocks them all, and a child inherits that)
# nor ignored by Python's doing,
# a session of its own whose controlling terminal it is, then the program
_ON_TERMINAL = ("import fcntl, os, signal, sys, termios; "
                "signal.pthread_sigmask(signal.SIG_SETMASK, []); "
                "[signal.signal(n, signal.SIG_DFL) for n in (signal.SIGPIPE, signal.SIGXFSZ)]; "
                "os.setsid(); "
                "fcntl.ioctl(0, termios.TIOCSCTTY, 0); os.execvp(sys.argv[1], sys.argv[1:])")


def _pty_size(fd: int, size: pb.PTY.Size) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size.rows, size.cols, 0, 0))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _end_event(code: int) -> pb.ProcessEvent.EndEvent:
    if code >= 0:
        return pb.ProcessEvent.EndEvent(exit_code=code, exited=True, status=f"exit status {code}")
    return pb.ProcessEvent.EndEvent(exit_code=-1, exited=False,
                                    status=f"signal: {signal.Signals(-code).name}")


def _event(kind: str, value: Any) -> pb.StartResponse:
    return pb.StartResponse(event=pb.ProcessEvent(event=Oneof(kind, value)))


def _signal_processes(sandbox: StandInSandbox, number: int) -> None:
    for pid in list(sandbox.processes):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, number)


def _kill_processes(sandbox: StandInSandbox) -> None:
    _signal_processes(sandbox, signal.SIGKILL)
    _signal_processes(sandbox, signal.SIGCONT)


def _volume_entry(volume: StandInVolume, path: Path) -> dict[str, Any]:
    """A volume's file as the content API's VolumeEntryStat (its path the volume's own)."""
    st = os.lstat(path)
    kind = (VolumeEntryStatType.SYMLINK if stat_module.S_ISLNK(st.st_mode) else
            VolumeEntryStatType.DIRECTORY if stat_module.S_ISDIR(st.st_mode) else
            VolumeEntryStatType.FILE if stat_module.S_ISREG(st.st_mode) else
            VolumeEntryStatType.UNKNOWN)
    rel = path.relative_to(volume.files)
    fields: dict[str, Any] = {}
    if kind == VolumeEntryStatType.SYMLINK:
        fields["target"] = os.readlink(path)

    def when(seconds: float) -> datetime:
        return datetime.fromtimestamp(seconds, UTC)

    return VolumeEntryStat(
        name=path.name if rel.parts else "/", type_=kind, path="/" + rel.as_posix() if rel.parts else "/",
        size=st.st_size, mode=stat_module.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid,
        atime=when(st.st_atime), mtime=when(st.st_mtime), ctime=when(st.st_ctime),
        **fields).to_dict()


def _mount(files: Path, path: Path) -> bool:
    """A volume's folder bind-mounted at `path` on this host; whether the mount point was made."""
    made = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "--bind", str(files), str(path)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        if made:
            path.rmdir()
        raise OSError(done.stderr.strip() or "mount --bind failed")
    return made


def _unmount(sandbox: StandInSandbox) -> None:
    """Undo a sandbox's mounts (lazily, should a process of it still hold one)."""
    for path, made in reversed(sandbox.mounts):
        if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
        if made:
            with contextlib.suppress(OSError):
                path.rmdir()
    sandbox.mounts.clear()
