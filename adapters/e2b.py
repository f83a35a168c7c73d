"""The E2B backend: cloud sandboxes on E2B, through the `e2b` SDK's async API.

Bring your own key: `E2B_API_KEY`, or a profile's `options.api_key: env:E2B_API_KEY_<NAME>`,
read at the moment of each call and never stored. A sandbox made with a non-default key
carries the variable's *name* (never its value) in its backend reference, `<id>@<NAME>`, so
the reaper, which has no profile, still reaches it with the right key.

E2B keeps its own clock: each sandbox gets E2B's timeout set to its deadline plus a grace
(`DEADLINE_GRACE`), so the cloud ends it even if sbx never runs again, and sbx never loses it
before its deadline. The SDK is imported lazily, so `sbx ls` and `sbx reap` never load it
unless an E2B sandbox or key is there to deal with.

Volumes (docs/volumes.md) are E2B volumes, through the SDK's `AsyncVolume`: named
`sbx_<install>_<volume id>` (E2B volumes carry no labels: the name holds sbx's), made and
listed with the default key, mounted by name through `volume_mounts` (read-write only: E2B
cannot mount one read-only), and reached without a sandbox through E2B's volume content API.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import math
import os
import posixpath
import random
import re
import shlex
import tarfile
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sandboxer.adapters.archives import BoundedTar, TooLarge, member_path
from sandboxer.adapters.base import (
    EXEC_MARK,
    KILL_MARKED,
    LABEL_CHECKPOINT,
    LABEL_HARD_DEADLINE,
    LABEL_INSTALL,
    LABEL_VOLUME,
    Adapter,
    AdapterError,
    Artifact,
    BackendObject,
    BackendObjectGone,
    BackendUnavailable,
    CallerStdin,
    Capability,
    CapabilityNotSupported,
    CreateRequest,
    Endpoint,
    ExecResult,
    FileInfo,
    Health,
    InvalidRequest,
    MetricSample,
    NoSuchPath,
    PtyChannel,
    Stdin,
    one_line,
    open_state_file,
    state_folder,
)

T = TypeVar("T")

DEFAULT_KEY = "E2B_API_KEY"
# Per-profile keys must be named E2B_API_KEY_<SUFFIX>: the reaper lists every such variable
# that is set, so it sees the sandboxes of every team a profile may use.
KEY_VARIABLE = re.compile(r"E2B_API_KEY(_[A-Z0-9_]+)?")
DEFAULT_TEMPLATE = "base"
DEADLINE_GRACE = timedelta(seconds=60)
MAX_TIMEOUT_S = 24 * 3600  # E2B's longest timeout (Pro plan; Hobby: 1 hour)
DEFAULT_MAX_CONCURRENT = 20
SLOTS_FOLDER = "e2b-slots"  # in the state folder: one lock file per create slot
OPTIONS = frozenset({"max_concurrent", "api_key"})
METRICS_EVERY_S = 5.0  # E2B's metrics granularity
# the profile's `ports:`, in the sandbox's metadata ("8080,3000"); E2B reaches any port
LABEL_PORTS = "sbx.ports"
TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token"  # E2B's, for a sandbox not open to all
RATE_LIMIT_RETRIES = 5
RATE_LIMIT_BACKOFF_S = 1.0
RATE_LIMIT_BACKOFF_MAX_S = 16.0
KEY_HINT = "get one at https://e2b.dev/dashboard?tab=keys"
SDK_HINT = "install it: pip install 'sandboxer[e2b]'"
STDIN_CHUNK = 1024 * 1024  # per send_stdin call
TREE_DEPTH = 10_000  # envd lists to a depth: a tree's whole depth
_DOMAIN = re.compile(r"(\*\.)?([a-z0-9]([a-z0-9-]*[a-z0-9])?\.)+[a-z]([a-z0-9-]*[a-z0-9])?")
_SNAPSHOT_NAME = re.compile(r"sbx_(?P<install>[a-z0-9-]+)_(?P<checkpoint>[a-z0-9-]+)")
_VOLUME_NAME = re.compile(r"sbx_(?P<install>[a-z0-9-]+)_(?P<volume>vol-[a-z0-9]+)")
# open_volume's helper: no object of E2B's, the volume itself reached through its content API
# at the contract's /volume (docs/volumes.md)
VOLUME_HELPER = "e2b-volume:"
VOLUME_ROOT = "/volume"
VOLUME_TREE_MAX_MEMBERS = 100_000
VOLUME_SPOOL_BYTES = 8 * 1024 * 1024  # a tree put into a volume: in memory up to this, then disk


def _sdk() -> Any:
    """The `e2b` module, imported on first use; BackendUnavailable (exit 5) when absent."""
    try:
        import e2b
    except ImportError as exc:
        raise BackendUnavailable(f"the e2b SDK is not installed ({exc}); {SDK_HINT}") from exc
    return e2b


def api_url() -> str:
    """The API base the SDK reaches, worked out as the SDK does (no import needed)."""
    return os.environ.get("E2B_API_URL") or f"https://api.{os.environ.get('E2B_DOMAIN') or 'e2b.app'}"


def split_ref(ref: str) -> tuple[str, str]:
    """`id` or `id@VARIABLE` -> (id, the variable holding the key)."""
    object_id, _, variable = ref.partition("@")
    return object_id, variable or DEFAULT_KEY


def join_ref(object_id: str, variable: str) -> str:
    return object_id if variable == DEFAULT_KEY else f"{object_id}@{variable}"


def key_variables() -> list[str]:
    """Every key variable that is set: the default first, then E2B_API_KEY_* by name."""
    found = [DEFAULT_KEY] if os.environ.get(DEFAULT_KEY) else []
    found += sorted(v for v in os.environ if v != DEFAULT_KEY and KEY_VARIABLE.fullmatch(v)
                    and os.environ[v])
    return found


def _seconds_until(moment: datetime) -> int:
    """E2B's timeout (whole seconds from now) for a sandbox that must live until `moment`."""
    return max(1, math.ceil((moment + DEADLINE_GRACE - datetime.now(UTC)).total_seconds()))


def _setting(name: str, default: float) -> float:
    """A number from the environment (a tuning knob); a bad one is refused, naming it."""
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = -1
    if value < 0:
        raise AdapterError(f"{name} must be a number of at least 0, not {raw!r}")
    return value


class _CreateSlots:
    """At most `limit` creates in flight per (API, key variable): an asyncio.Semaphore in this
    process, and `limit` lock files shared by every sbx process of this state folder, so a
    burst of `sbx create` commands is bounded as well as a burst inside one process. The
    files live in the state folder (checked as the core checks it), not in /tmp, where
    another user could make the folder first and hold the locks or plant links."""

    def __init__(self, key: str, limit: int) -> None:
        self.limit = limit
        self.semaphore = asyncio.Semaphore(limit)
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        folder = os.path.join(state_folder(), SLOTS_FOLDER)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self.paths = [os.path.join(folder, f"{digest}-{limit}-{i}.lock") for i in range(limit)]

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        async with self.semaphore:
            fd = await self._lock_file()
            try:
                yield
            finally:
                if fd is not None:
                    os.close(fd)  # closing releases the lock

    async def _lock_file(self) -> int | None:
        try:
            import fcntl
        except ImportError:  # no flock here: the in-process bound still holds
            return None
        while True:
            for path in self.paths:
                fd = open_state_file(path, os.O_CREAT | os.O_RDWR)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return fd
                except BlockingIOError:
                    os.close(fd)
            await asyncio.sleep(0.05)


class E2BAdapter(Adapter):
    name = "e2b"
    shared = True  # sandboxes live in an E2B account: any fleet host reaching it may reap them
    description = "cloud sandboxes on E2B (your own key: E2B_API_KEY)"
    # files: envd's filesystem service and /files (a tree in: tar through a command's stdin,
    # the base's default; out: packed here from downloads, see get_archive)
    # pty: envd's process service with a pty, through the SDK (see open_pty)
    capabilities = frozenset({Capability.EXEC, Capability.PAUSE, Capability.SNAPSHOT,
                              Capability.SET_DEADLINE, Capability.METRICS, Capability.FILES,
                              Capability.PTY, Capability.PORTS, Capability.VOLUMES})

    def __init__(self) -> None:
        self.metrics_every_s = METRICS_EVERY_S
        self._slots: dict[tuple[str, str, int], _CreateSlots] = {}
        self._verified: set[tuple[str, str]] = set()
        self._creating_with: str | None = None

    # -- keys and calls ---------------------------------------------------------------------

    @staticmethod
    def _key_variable(options: Mapping[str, Any]) -> str:
        ref = options.get("api_key")
        if ref is None:
            return DEFAULT_KEY
        variable = str(ref).removeprefix("env:")
        if not str(ref).startswith("env:") or not KEY_VARIABLE.fullmatch(variable):
            raise CapabilityNotSupported(
                f"options.api_key must be a reference env:E2B_API_KEY or env:E2B_API_KEY_<NAME> "
                f"(the reaper looks for keys under those names), not {ref!r}")
        return variable

    @staticmethod
    def _opts(variable: str) -> dict[str, Any]:
        """The SDK's per-call options: the key, read now; retries are ours (`_call`)."""
        key = os.environ.get(variable)
        if not key:
            raise BackendUnavailable(f"no E2B API key: set {variable} ({KEY_HINT})")
        return {"api_key": key, "retries": 0}

    async def _call(self, what: str, variable: str, call: Callable[[], Awaitable[T]]) -> T:
        """One SDK call with the key in `variable`: 429 and 503 (E2B asking us to slow down)
        are retried with exponential backoff a bounded number of times; everything else is
        translated to the adapter's errors."""
        e2b = _sdk()
        attempts = int(_setting("SBX_E2B_RATE_LIMIT_RETRIES", RATE_LIMIT_RETRIES)) + 1
        backoff = _setting("SBX_E2B_RATE_LIMIT_BACKOFF", RATE_LIMIT_BACKOFF_S)
        started = time.monotonic()
        for attempt in range(attempts):
            try:
                return await call()
            except (e2b.RateLimitException, e2b.ServiceBusyException) as exc:
                if attempt + 1 >= attempts:
                    raise AdapterError(
                        f"E2B kept refusing to {what}: {one_line(exc)} ({attempts} attempts in "
                        f"{time.monotonic() - started:.1f}s); try again later or lower the "
                        "profile's options.max_concurrent") from exc
                delay = min(backoff * 2**attempt, RATE_LIMIT_BACKOFF_MAX_S)
                await asyncio.sleep(delay * (0.5 + random.random() / 2))
            except e2b.AuthenticationException as exc:
                raise BackendUnavailable(
                    f"E2B at {api_url()} refused the API key in {variable} ({one_line(exc)}): "
                    f"set {variable} to a valid key ({KEY_HINT})") from exc
            except AdapterError:
                raise
            except Exception as exc:
                raise self._translate(exc, what) from exc
        raise AssertionError("unreachable")

    @staticmethod
    def _translate(exc: Exception, what: str) -> AdapterError:
        import httpx

        if isinstance(exc, httpx.TimeoutException):
            return AdapterError(f"E2B at {api_url()} did not answer in time to {what}")
        if isinstance(exc, httpx.TransportError | ConnectionError):
            return BackendUnavailable(f"E2B API unreachable at {api_url()} ({one_line(exc)}); "
                                      "check your network, or E2B_API_URL / E2B_DOMAIN")
        return AdapterError(f"E2B could not {what}: {one_line(exc)}")

    def _slot(self, variable: str, limit: int) -> _CreateSlots:
        key = (api_url(), variable, limit)
        if key not in self._slots:
            self._slots[key] = _CreateSlots(f"{api_url()}|{variable}", limit)
        return self._slots[key]

    @staticmethod
    def _not_found(exc: BaseException) -> bool:
        return isinstance(exc.__cause__, _sdk().NotFoundException)

    async def _info(self, sandbox_id: str, variable: str) -> Any | None:
        """The SDK's SandboxInfo, or None when E2B no longer has the sandbox."""
        e2b = _sdk()
        try:
            return await self._call(f"read sandbox {sandbox_id}", variable, lambda: (
                e2b.AsyncSandbox.get_info(sandbox_id, **self._opts(variable))))
        except AdapterError as exc:
            if self._not_found(exc):
                return None
            raise

    # -- health -----------------------------------------------------------------------------

    async def health(self) -> Health:
        variables = key_variables()
        if not variables:
            return Health(False, False, f"{DEFAULT_KEY} is not set, so E2B at {api_url()} was "
                                        f"not contacted; set it ({KEY_HINT})")
        try:
            await self._probe(variables[0])
        except BackendUnavailable as exc:
            refused = "refused the API key" in str(exc)
            return Health(refused, not refused, str(exc))
        except Exception as exc:  # health never raises
            return Health(False, True, f"E2B at {api_url()}: {one_line(exc)}")
        return Health(True, True, f"E2B at {api_url()} (key from {variables[0]})")

    async def _probe(self, variable: str) -> None:
        """One authenticated listing (one sandbox at most); remembered once it worked."""
        if (api_url(), variable) in self._verified:
            return
        e2b = _sdk()
        await self._call("list sandboxes", variable, lambda: e2b.AsyncSandbox.list(
            limit=1, **self._opts(variable)).next_items())
        self._verified.add((api_url(), variable))

    async def ensure_available(self) -> None:
        """SDK there, a key set and accepted by E2B, before the core writes an intent. When
        creating, the core calls validate(request) just before, which names the key to use."""
        _sdk()
        variable, self._creating_with = self._creating_with, None
        if variable is None:
            variables = key_variables()
            if not variables:
                raise BackendUnavailable(f"no E2B API key: set {DEFAULT_KEY} ({KEY_HINT})")
            variable = variables[0]
        await self._probe(variable)

    async def instance_id(self) -> str | None:
        """The API base: sandboxes made through one E2B are never judged through another.
        (Not the key: one account's keys all see its sandboxes, and keys are secrets.)"""
        return api_url()

    # -- validation -------------------------------------------------------------------------

    def validate(self, request: CreateRequest) -> None:
        unknown = set(request.options) - OPTIONS
        if unknown:
            raise CapabilityNotSupported(
                f"the e2b backend has no option {', '.join(sorted(unknown))} "
                f"(known: {', '.join(sorted(OPTIONS))})")
        limit = request.options.get("max_concurrent", DEFAULT_MAX_CONCURRENT)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise CapabilityNotSupported(
                f"options.max_concurrent must be a whole number of at least 1, not {limit!r}")
        limits = request.resources
        for value, field, why in (
                (limits.disk_bytes, "resources.disk", "E2B sizes the disk from the template"),
                (limits.pids, "resources.pids", "E2B cannot limit the number of processes"),
                (limits.gpu, "resources.gpu", "E2B offers no GPU")):
            if value is not None:
                raise CapabilityNotSupported(f"the e2b backend cannot enforce {field} ({why}); "
                                             f"set {field}: null")
        if request.command is not None:
            raise CapabilityNotSupported(
                "the e2b backend cannot run a profile command as the main process (the "
                "template's start command runs instead); remove command")
        if request.network == "egress":
            for entry in request.network_allow:
                if not _egress_entry_ok(entry):
                    raise CapabilityNotSupported(
                        f"the e2b backend cannot allow egress to {entry!r}: E2B filters by IPv4 "
                        "address, CIDR block or domain name (e.g. 1.1.1.1, 10.0.0.0/8, "
                        "example.com, *.example.com), not by port, URL or IPv6")
        if request.hard_deadline and _seconds_until(request.hard_deadline) > MAX_TIMEOUT_S:
            raise CapabilityNotSupported(
                "E2B keeps a sandbox alive for at most 24 hours (1 hour on the Hobby plan), so "
                "it cannot hold this sandbox until its hard deadline (plus 1m of grace): set "
                "ttl.max to 23h59m or less")
        for mount in request.mounts:
            if mount.read_only:
                raise InvalidRequest(
                    f"the e2b backend cannot mount a volume read-only (E2B's volume mounts are "
                    f"read-write): mount it at {mount.path} without :ro (read_only: false)")
        variable = self._key_variable(request.options)
        self._opts(variable)  # the key must be set: exit 5 naming it, before anything is written
        self._creating_with = variable

    # -- lifecycle --------------------------------------------------------------------------

    @staticmethod
    def _network(request: CreateRequest) -> dict[str, Any]:
        if request.network == "full":
            return {"allow_internet_access": True}
        if request.network == "egress":  # allow_out wins over deny_out on E2B
            return {"network": {"allow_out": list(request.network_allow),
                                "deny_out": ["0.0.0.0/0"]}}
        return {"allow_internet_access": False}

    async def create(self, request: CreateRequest) -> BackendObject:
        e2b = _sdk()
        variable = self._key_variable(request.options)
        template = request.image or DEFAULT_TEMPLATE
        # The sandbox's deadline when the core passes it, else its hard deadline; `extend`
        # then moves E2B's timeout with set_deadline.
        until = getattr(request, "deadline", None) or request.hard_deadline
        limit = request.options.get("max_concurrent", DEFAULT_MAX_CONCURRENT)
        mounts = await self._mounts(request, variable)
        async with self._slot(variable, limit).hold():
            sandbox = await self._call(
                f"create a sandbox from template {template!r}", variable,
                lambda: e2b.AsyncSandbox.create(
                    template=template,
                    timeout=_seconds_until(until) if until else None,
                    metadata={**request.labels, **_ports_label(request.ports)},
                    envs=dict(request.env),
                    idempotency_key=request.sandbox_id, **self._network(request),
                    **({"volume_mounts": mounts} if mounts else {}),
                    **self._opts(variable)))
        ref = join_ref(sandbox.sandbox_id, variable)
        info = await self._info(sandbox.sandbox_id, variable)
        if info is None:
            raise AdapterError(f"E2B sandbox {sandbox.sandbox_id} vanished right after create")
        oversized = _oversized(info, request, template)
        if oversized:
            await self.destroy(ref)
            raise CapabilityNotSupported(oversized)
        return BackendObject(ref=ref, labels=dict(info.metadata), status=str(info.state.value),
                             running=info.state.value == "running", created_at=info.started_at)

    async def destroy(self, ref: str, *, services: bool = True) -> None:
        e2b = _sdk()
        sandbox_id, variable = split_ref(ref)
        await self._call(f"kill sandbox {sandbox_id}", variable, lambda: e2b.AsyncSandbox.kill(
            sandbox_id, **self._opts(variable)))  # False (404, gone already) is success too

    async def get(self, ref: str) -> BackendObject | None:
        sandbox_id, variable = split_ref(ref)
        info = await self._info(sandbox_id, variable)
        return None if info is None else _object(info, variable)

    async def list(self, labels: Mapping[str, str]) -> list[BackendObject]:
        """Every sandbox carrying `labels`, all pages, under every key variable that is set."""
        variables = key_variables()  # first: with no key, `sbx reap` never imports the SDK
        if not variables:
            raise BackendUnavailable(f"no E2B API key: set {DEFAULT_KEY} ({KEY_HINT})")
        e2b = _sdk()
        found: dict[str, BackendObject] = {}
        for variable in variables:
            pages = e2b.AsyncSandbox.list(query=e2b.SandboxQuery(metadata=dict(labels)),
                                          **self._opts(variable))
            while pages.has_next:
                for info in await self._call("list sandboxes", variable, pages.next_items):
                    found.setdefault(info.sandbox_id, _object(info, variable))
        return list(found.values())

    def sees(self, ref: str) -> bool:
        """Whether list() covers this sandbox: its key variable is set here. (For the core:
        a sandbox whose key is not set should not be judged lost by this process.)"""
        return bool(os.environ.get(split_ref(ref)[1]))

    async def _connect(self, sandbox_id: str, variable: str, timeout_s: int | None) -> Any:
        e2b = _sdk()
        try:
            return await self._call(f"connect to sandbox {sandbox_id}", variable, lambda: (
                e2b.AsyncSandbox.connect(sandbox_id, timeout=timeout_s, **self._opts(variable))))
        except AdapterError as exc:
            if self._not_found(exc):
                raise BackendObjectGone(f"E2B no longer has sandbox {sandbox_id}") from exc
            raise

    async def _running(self, ref: str) -> tuple[Any, str]:
        """A connected SDK sandbox for work inside it, and its id; BackendObjectGone when E2B
        no longer has it or it is paused (connecting would resume it behind sbx's back)."""
        sandbox_id, variable = split_ref(ref)
        info = await self._info(sandbox_id, variable)
        if info is None:
            raise BackendObjectGone(f"E2B no longer has sandbox {sandbox_id}")
        if info.state.value != "running":
            raise BackendObjectGone(f"E2B sandbox {sandbox_id} is {info.state.value}")
        # connecting asks for a timeout; asking for what is left leaves E2B's clock as it is
        left = max(1, math.ceil((info.end_at - datetime.now(UTC)).total_seconds()))
        return await self._connect(sandbox_id, variable, left), sandbox_id

    async def exec(self, ref: str, argv: Sequence[str], timeout_s: float | None = None,
                   env: Mapping[str, str] | None = None, *, cwd: str | None = None,
                   user: str | None = None, stdin: Stdin = None) -> ExecResult:
        out, err = bytearray(), bytearray()
        async for item in self.exec_stream(ref, argv, timeout_s, env, cwd=cwd, user=user,
                                           stdin=stdin):
            if isinstance(item, ExecResult):
                return ExecResult(item.exit_code, bytes(out), bytes(err), item.duration_s,
                                  item.timed_out)
            (out if item[0] == "stdout" else err).extend(item[1])
        raise AssertionError("unreachable: the stream ends with its result")

    async def exec_stream(self, ref: str, argv: Sequence[str], timeout_s: float | None = None,
                          env: Mapping[str, str] | None = None, *, cwd: str | None = None,
                          user: str | None = None, stdin: Stdin = None,
                          ) -> AsyncIterator[tuple[str, bytes] | ExecResult]:
        """`commands.run(background=True)` with `envs`, `cwd` and, when there is stdin,
        `stdin=True`: it goes in with `send_stdin` (1 MiB a call), then `close_stdin`. The
        output as envd sends it (E2B's SDK decodes it as UTF-8: bytes that are not text
        arrive replaced). At `timeout_s` every process carrying the exec's mark (EXEC_MARK)
        is killed by a second command, and the output so far is kept."""
        e2b = _sdk()
        if user is not None:
            raise CapabilityNotSupported(
                f"the e2b backend cannot run a command as {user!r} yet (remove user)")
        sandbox, sandbox_id = await self._running(ref)
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        mark = uuid.uuid4().hex
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(16)

        async def on_stdout(text: str) -> None:
            await queue.put(("stdout", text.encode()))

        async def on_stderr(text: str) -> None:
            await queue.put(("stderr", text.encode()))

        try:  # no stream limit: the SDK's own command timeout does not fire on Python 3.11
            handle = await sandbox.commands.run(
                shlex.join(argv), background=True, timeout=0, cwd=cwd,
                envs={**(env or {}), EXEC_MARK: mark}, stdin=stdin is not None,
                on_stdout=on_stdout, on_stderr=on_stderr, retain_output=False)
        except e2b.InvalidArgumentException as exc:
            raise InvalidRequest(f"E2B refused the command in {sandbox_id}: "
                                 f"{one_line(exc)}") from exc
        except Exception as exc:
            raise AdapterError(f"E2B could not start the command in {sandbox_id}: "
                               f"{one_line(exc)}") from exc

        async def wait() -> None:
            try:
                result: Any = await handle.wait()
            except e2b.CommandExitException as exc:
                result = exc
            except Exception as exc:
                result = exc
            await queue.put(("done", result))

        given = CallerStdin(stdin)  # a failure of the caller's is raised once the command ends

        async def feed() -> None:
            try:
                async for chunk in given:
                    for at in range(0, len(chunk), STDIN_CHUNK):
                        await sandbox.commands.send_stdin(handle.pid, chunk[at:at + STDIN_CHUNK])
            except Exception:  # noqa: S110 (the command ended or stopped reading: its exit says)
                pass
            finally:
                with contextlib.suppress(Exception):
                    await sandbox.commands.close_stdin(handle.pid)

        tasks = [asyncio.create_task(wait())]
        if stdin is not None:
            tasks.append(asyncio.create_task(feed()))
        result: Any = None
        try:
            while result is None:
                left = None if deadline is None else deadline - loop.time()
                try:
                    if left is not None and left <= 0:
                        raise TimeoutError
                    kind, value = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                if kind == "done":
                    result = value
                else:
                    yield kind, value
            if result is None:  # the deadline
                killed = any(await asyncio.gather(self._kill_marked(sandbox, mark),
                                                  self._kill_command(sandbox, handle.pid)))
                with contextlib.suppress(Exception):
                    await handle.disconnect()
                while not queue.empty():  # what was read before the deadline is kept
                    kind, value = queue.get_nowait()
                    if kind != "done":
                        yield kind, value
                note = "" if killed else " (the process may still run inside the sandbox)"
                yield "stderr", f"sbx: timed out after {timeout_s:g}s{note}\n".encode()
                yield ExecResult(124, b"", b"", time.perf_counter() - started, timed_out=True)
                return
        finally:
            for task in tasks:
                task.cancel()
        given.raise_if_failed()
        if isinstance(result, Exception) and not isinstance(result, e2b.CommandExitException):
            raise AdapterError(f"the command in E2B sandbox {sandbox_id} failed: "
                               f"{one_line(result)}") from result
        yield ExecResult(result.exit_code, b"", b"", time.perf_counter() - started)

    async def open_pty(self, ref: str, argv: Sequence[str], *, cols: int = 80, rows: int = 24,
                       env: Mapping[str, str] | None = None, cwd: str | None = None,
                       ) -> PtyChannel:
        """A program on envd's pseudo-terminal: input with `pty.send_stdin`, size with
        `pty.resize`, ended with `pty.kill` (and every process carrying its mark), its exit
        code from the end event. The SDK's `pty.create` runs only `bash -i -l`; this sends
        the same Start request with the command sbx was asked for, as `commands.run` does
        (`bash -l -c 'exec ARGV'`), so the program is exactly `argv`."""
        e2b = _sdk()
        sandbox, sandbox_id = await self._running(ref)
        mark = uuid.uuid4().hex
        envs = {"TERM": "xterm-256color", **(env or {}), EXEC_MARK: mark}
        channel = _E2BPty(sandbox, mark)
        try:
            handle = await _start_pty(sandbox, "exec " + shlex.join(argv), cols, rows, envs,
                                      cwd, channel.on_data)
        except e2b.InvalidArgumentException as exc:
            raise InvalidRequest(f"E2B refused the terminal in {sandbox_id}: "
                                 f"{one_line(exc)}") from exc
        except Exception as exc:
            raise AdapterError(f"E2B could not open a terminal in {sandbox_id}: "
                               f"{one_line(exc)}") from exc
        channel.started(handle)
        return channel

    @staticmethod
    async def _kill_marked(sandbox: Any, mark: str) -> bool:
        """Kill every process whose environment carries the mark, by a second command."""
        try:
            await sandbox.commands.run(shlex.join(["sh", "-c", KILL_MARKED, mark, EXEC_MARK]),
                                       timeout=10)
            return True
        except Exception:
            return False

    # -- ports: E2B's host for each port (`get_host`) -----------------------------------------

    async def port_endpoints(self, ref: str) -> dict[int, Endpoint]:
        """The profile's `ports:` (kept in the sandbox's metadata), each at its E2B host."""
        sandbox_id, variable = split_ref(ref)
        info = await self._info(sandbox_id, variable)
        if info is None:
            raise BackendObjectGone(f"E2B no longer has sandbox {sandbox_id}")
        declared = [int(p) for p in (info.metadata or {}).get(LABEL_PORTS, "").split(",")
                    if p.isdigit()]
        if not declared:
            return {}
        sandbox, _ = await self._running(ref)
        return {port: _endpoint(sandbox, port) for port in declared}

    async def expose_port(self, ref: str, port: int) -> Endpoint:
        """On E2B every port the sandbox listens on is reached at its host: nothing to add."""
        sandbox, _ = await self._running(ref)
        return _endpoint(sandbox, port)

    # -- files: envd's filesystem service and /files ----------------------------------------

    async def _files(self, ref: str, what: str, path: str,
                     call: Callable[[Any], Awaitable[T]]) -> T:
        """One call on the SDK's `files` of a running sandbox; a missing path -> NoSuchPath."""
        e2b = _sdk()
        sandbox, sandbox_id = await self._running(ref)
        try:
            return await call(sandbox.files)
        except e2b.NotFoundException as exc:
            raise NoSuchPath(f"{path} does not exist in the sandbox") from exc
        except e2b.InvalidArgumentException as exc:
            raise InvalidRequest(f"{path}: {one_line(exc)}") from exc
        except AdapterError:
            raise
        except Exception as exc:
            raise AdapterError(f"E2B could not {what} {path} in {sandbox_id}: "
                               f"{one_line(exc)}") from exc

    async def stat_file(self, ref: str, path: str) -> FileInfo | None:
        try:
            entry = await self._files(ref, "read", path, lambda f: f.get_info(path))
        except NoSuchPath:
            return None
        return _file_info(entry)

    async def list_files(self, ref: str, path: str, depth: int = 1) -> list[FileInfo]:
        async def listing(files: Any) -> list[Any]:
            top = await files.get_info(path)
            if _file_info(top).type != "dir":
                return [top]
            return await files.list(path, depth=max(1, depth))

        entries = await self._files(ref, "list", path, listing)
        return sorted((_file_info(e) for e in entries), key=lambda info: info.path)

    async def remove_file(self, ref: str, path: str, *, recursive: bool = False) -> None:
        async def remove(files: Any) -> None:
            top = _file_info(await files.get_info(path))
            if not recursive and top.type == "dir" and await files.list(path, depth=1):
                raise InvalidRequest(f"{path} is a folder that is not empty "
                                     "(remove it recursively)")
            await files.remove(path)  # envd removes a folder with all in it

        await self._files(ref, "remove", path, remove)

    async def make_dir(self, ref: str, path: str, *, parents: bool = True) -> None:
        async def make(files: Any) -> None:
            if not parents:
                parent = posixpath.dirname(posixpath.normpath(path))
                if not await files.exists(parent):
                    raise NoSuchPath(f"{parent} does not exist in the sandbox")
                if await files.exists(path):
                    raise InvalidRequest(f"{path} already exists")
            if not await files.make_dir(path):  # False: it was there already
                if _file_info(await files.get_info(path)).type != "dir":
                    raise InvalidRequest(f"{path} already exists and is not a folder")

        await self._files(ref, "make the folder", path, make)

    async def rename_file(self, ref: str, src: str, dst: str) -> None:
        async def move(files: Any) -> None:
            target = dst
            with contextlib.suppress(_sdk().NotFoundException):
                if _file_info(await files.get_info(dst)).type == "dir":
                    target = posixpath.join(dst, posixpath.basename(posixpath.normpath(src)))
            await files.rename(src, target)

        await self._files(ref, "move", src, move)

    async def get_archive(self, ref: str, path: str) -> AsyncIterator[bytes]:
        """The tree packed here from envd's listing and /files downloads (streamed, a file at
        a time): E2B's command output is text, so tar cannot come out through a command.
        On open_volume's helper: from the volume content API's listing and downloads."""
        if ref.startswith(VOLUME_HELPER):
            async for chunk in self._volume_get_archive(ref, path):
                yield chunk
            return
        top = posixpath.normpath(path)
        entries = await self._files(ref, "read", path, lambda f: _tree_entries(f, top))
        sandbox, _ = await self._running(ref)

        async def read(file: str) -> Any:
            return await sandbox.files.read(file, format="stream")

        async for chunk in _pack(entries, posixpath.dirname(top), read):
            yield chunk

    async def put_archive(self, ref: str, path: str, tar: AsyncIterator[bytes]) -> None:
        """A sandbox: the base's tar through a command's stdin. open_volume's helper: each
        folder and file through the volume content API."""
        if ref.startswith(VOLUME_HELPER):
            await self._volume_put_archive(ref, path, tar)
            return
        await super().put_archive(ref, path, tar)

    # -- volumes: E2B volumes through the SDK's AsyncVolume (docs/volumes.md) ---------------

    @staticmethod
    def _volume_variable() -> str:
        """The key a volume is made with (a volume has no profile): the first one set."""
        variables = key_variables()
        if not variables:
            raise BackendUnavailable(f"no E2B API key: set {DEFAULT_KEY} ({KEY_HINT})")
        return variables[0]

    async def _volume_info(self, ref: str) -> Any | None:
        """The SDK's VolumeAndToken (name, token), or None when E2B no longer has it."""
        e2b = _sdk()
        volume_id, variable = split_ref(ref)
        try:
            return await self._call(f"read volume {volume_id}", variable, lambda: (
                e2b.AsyncVolume.get_info(volume_id, **self._opts(variable))))
        except AdapterError as exc:
            if self._not_found(exc):
                return None
            raise

    async def create_volume(self, volume_id: str, labels: Mapping[str, str]) -> str:
        """An E2B volume named after the installation and the volume (`sbx_<install>_<id>`),
        so list_volumes finds it by those labels; other labels stay in sbx's row."""
        e2b = _sdk()
        name = f"sbx_{labels.get(LABEL_INSTALL)}_{volume_id}"
        if not _VOLUME_NAME.fullmatch(name):
            raise InvalidRequest(f"the e2b backend cannot name volume {volume_id!r} of "
                                 f"installation {labels.get(LABEL_INSTALL)!r}")
        variable = self._volume_variable()
        volume = await self._call(f"create volume {name}", variable, lambda: (
            e2b.AsyncVolume.create(name, **self._opts(variable))))
        return join_ref(volume.volume_id, variable)

    async def remove_volume(self, ref: str) -> None:
        """Delete the E2B volume, only if its name says sbx made it; gone already: success."""
        e2b = _sdk()
        volume_id, variable = split_ref(ref)
        info = await self._volume_info(ref)
        if info is None:
            return
        if _VOLUME_NAME.fullmatch(info.name) is None:
            raise AdapterError(f"E2B volume {volume_id} ({info.name!r}) was not made by sbx: "
                               "left as it is")
        await self._call(f"delete volume {volume_id}", variable, lambda: (
            e2b.AsyncVolume.destroy(volume_id, **self._opts(variable))))  # False: gone

    async def list_volumes(self, labels: Mapping[str, str]) -> list[str]:
        """sbx's volumes (by name) carrying `labels`, under every key variable that is set."""
        variables = key_variables()
        if not variables:
            raise BackendUnavailable(f"no E2B API key: set {DEFAULT_KEY} ({KEY_HINT})")
        e2b = _sdk()
        found: dict[str, str] = {}
        for variable in variables:
            for info in await self._call("list volumes", variable, lambda v=variable: (
                    e2b.AsyncVolume.list(**self._opts(v)))):
                parsed = _volume_labels(info.name)
                if parsed and all(parsed.get(k) == v for k, v in labels.items()):
                    found.setdefault(info.volume_id, join_ref(info.volume_id, variable))
        return list(found.values())

    async def volume_size(self, ref: str) -> int | None:
        """The bytes of its files, from the content API's listing (None: it is gone)."""
        try:
            entries = await self._in_volume(ref, "list", "/", lambda v, o: v.list(
                "/", depth=TREE_DEPTH, **o))
        except (NoSuchPath, BackendObjectGone):
            return None
        return sum(e.size for e in entries if str(getattr(e.type, "value", e.type)) == "file")

    async def open_volume(self, ref: str, labels: Mapping[str, str]) -> str:
        """Nothing is made: the helper names the volume, whose files put_archive and
        get_archive reach through E2B's volume content API (no sandbox)."""
        if await self._volume_info(ref) is None:
            raise BackendObjectGone(f"E2B no longer has volume {split_ref(ref)[0]}")
        return VOLUME_HELPER + ref

    async def close_volume(self, helper: str) -> None:
        """Nothing to remove (open_volume made nothing)."""

    async def _mounts(self, request: CreateRequest, variable: str) -> dict[str, str]:
        """The request's mounts as the SDK's `volume_mounts` (path -> volume name): each a
        volume of the key the sandbox is made with (E2B mounts a team's own volumes)."""
        mounts: dict[str, str] = {}
        for mount in request.mounts:
            volume_id, kept_with = split_ref(mount.ref)
            if kept_with != variable:
                raise InvalidRequest(
                    f"E2B volume {volume_id} is kept with the key in {kept_with}, the sandbox "
                    f"would be made with {variable}: a sandbox mounts its own team's volumes")
            info = await self._volume_info(mount.ref)
            if info is None:
                raise InvalidRequest(f"E2B no longer has volume {volume_id} (to mount at "
                                     f"{mount.path})")
            mounts[mount.path] = info.name
        return mounts

    async def _in_volume(self, ref: str, what: str, path: str,
                         call: Callable[[Any, dict[str, Any]], Awaitable[T]]) -> T:
        """One call of the volume content API on the volume `ref` (a helper's or a volume's
        reference): `call(volume, options)`. A missing path is NoSuchPath."""
        e2b = _sdk()
        volume_id, variable = split_ref(ref.removeprefix(VOLUME_HELPER))
        try:
            volume = await self._call(f"open volume {volume_id}", variable, lambda: (
                e2b.AsyncVolume.connect(volume_id, **self._opts(variable))))
        except AdapterError as exc:
            if self._not_found(exc):
                raise BackendObjectGone(f"E2B no longer has volume {volume_id}") from exc
            raise
        try:
            return await call(volume, _content_options())
        except e2b.NotFoundException as exc:
            raise NoSuchPath(f"{path} does not exist in the volume") from exc
        except AdapterError:
            raise
        except Exception as exc:
            raise AdapterError(f"E2B could not {what} {path} in volume {volume_id}: "
                               f"{one_line(exc)}") from exc

    async def _volume_get_archive(self, helper: str, path: str) -> AsyncIterator[bytes]:
        top = _volume_path(path)

        async def tree(volume: Any, options: dict[str, Any]) -> tuple[Any, list[FileInfo]]:
            first = _volume_file_info(await volume.get_info(top, **options))
            if first.type != "dir":
                return volume, [first]
            below = [_volume_file_info(e)
                     for e in await volume.list(top, depth=TREE_DEPTH, **options)]
            return volume, [first, *sorted(below, key=lambda info: info.path)]

        volume, entries = await self._in_volume(helper, "read", top, tree)
        options = _content_options()

        async def read(file: str) -> Any:
            return await volume.read_file(file, format="stream", **options)

        async for chunk in _pack(entries, posixpath.dirname(top), read):
            yield chunk

    async def _volume_put_archive(self, helper: str, path: str, tar: AsyncIterator[bytes]) -> None:
        """The tar stream is held first (memory, then a temp file) and checked whole: only
        folders and regular files, since E2B's volume content API makes no links; a tree with
        anything else is refused (exit 2) before anything is written."""
        target = _volume_path(path)
        with tempfile.SpooledTemporaryFile(VOLUME_SPOOL_BYTES) as spool:
            async for chunk in tar:
                spool.write(chunk)
            for _ in _volume_members(spool, data=False):  # the check: raises on what cannot go
                pass

            async def write(volume: Any, options: dict[str, Any]) -> None:
                await _volume_dir(volume, target, None, options)
                for member, data in _volume_members(spool):
                    dest = posixpath.join(target, member_path(member))
                    if member.isdir():
                        await _volume_dir(volume, dest, member.mode & 0o7777, options)
                    else:
                        await volume.write_file(dest, data, mode=member.mode & 0o7777,
                                                force=True, **options)

            await self._in_volume(helper, "write", target, write)

    @staticmethod
    async def _kill_command(sandbox: Any, pid: int) -> bool:
        try:
            return bool(await sandbox.commands.kill(pid))
        except Exception:
            return False

    async def pause(self, ref: str) -> None:
        """E2B's pause keeps memory and filesystem; paused, it is off E2B's clock."""
        e2b = _sdk()
        sandbox_id, variable = split_ref(ref)
        try:
            await self._call(f"pause sandbox {sandbox_id}", variable, lambda: (
                e2b.AsyncSandbox.pause(sandbox_id, **self._opts(variable))))  # False: paused already
        except AdapterError as exc:
            if self._not_found(exc):
                raise BackendObjectGone(f"E2B no longer has sandbox {sandbox_id}") from exc
            raise

    async def resume(self, ref: str) -> None:
        """Resume is a connect. E2B's timeout restarts then: set it to the hard deadline the
        sandbox carries (the soft one is not known here); `extend` narrows it again."""
        sandbox_id, variable = split_ref(ref)
        info = await self._info(sandbox_id, variable)
        if info is None:
            raise BackendObjectGone(f"E2B no longer has sandbox {sandbox_id}")
        hard = _parse_time(info.metadata.get(LABEL_HARD_DEADLINE))
        await self._connect(sandbox_id, variable, _seconds_until(hard) if hard else None)

    async def set_deadline(self, ref: str, deadline: datetime) -> None:
        e2b = _sdk()
        sandbox_id, variable = split_ref(ref)
        try:
            await self._call(f"set the timeout of sandbox {sandbox_id}", variable, lambda: (
                e2b.AsyncSandbox.set_timeout(sandbox_id, _seconds_until(deadline),
                                             **self._opts(variable))))
        except AdapterError as exc:
            if not self._not_found(exc):
                raise
            info = await self._info(sandbox_id, variable)
            if info is None:
                raise BackendObjectGone(f"E2B no longer has sandbox {sandbox_id}") from exc
            # paused: E2B has no clock running for it; resume sets one

    # -- checkpoints ------------------------------------------------------------------------

    async def snapshot(self, ref: str, labels: Mapping[str, str]) -> Artifact:
        """An E2B snapshot (filesystem and memory), named after the installation and the
        checkpoint so reconcile can find it: E2B snapshots carry no labels."""
        e2b = _sdk()
        sandbox_id, variable = split_ref(ref)
        name = _snapshot_name(labels)
        try:
            info = await self._call(f"snapshot sandbox {sandbox_id}", variable, lambda: (
                e2b.AsyncSandbox.create_snapshot(sandbox_id, name=name, **self._opts(variable))))
        except AdapterError as exc:
            if self._not_found(exc):
                raise BackendObjectGone(f"E2B no longer has sandbox {sandbox_id}") from exc
            raise
        return Artifact(join_ref(info.snapshot_id, variable), dict(labels))

    async def restore(self, artifact: str, request: CreateRequest) -> BackendObject:
        return await self.create(replace(request, image=split_ref(artifact)[0]))

    async def delete_artifact(self, artifact: str) -> None:
        e2b = _sdk()
        snapshot_id, variable = split_ref(artifact)
        await self._call(f"delete snapshot {snapshot_id}", variable, lambda: (
            e2b.AsyncSandbox.delete_snapshot(snapshot_id, **self._opts(variable))))  # False: gone

    async def list_artifacts(self, labels: Mapping[str, str]) -> list[Artifact]:
        variables = key_variables()
        if not variables:
            raise BackendUnavailable(f"no E2B API key: set {DEFAULT_KEY} ({KEY_HINT})")
        e2b = _sdk()
        found: dict[str, Artifact] = {}
        for variable in variables:
            pages = e2b.AsyncSandbox.list_snapshots(**self._opts(variable))
            while pages.has_next:
                for info in await self._call("list snapshots", variable, pages.next_items):
                    parsed = _snapshot_labels(info.snapshot_id)
                    if parsed and all(parsed.get(k) == v for k, v in labels.items()):
                        found.setdefault(info.snapshot_id,
                                         Artifact(join_ref(info.snapshot_id, variable), parsed))
        return list(found.values())

    # -- metrics ----------------------------------------------------------------------------

    async def metrics(self, ref: str) -> AsyncIterator[MetricSample]:
        """E2B's metrics endpoint, polled at its granularity: the newest sample first, then
        each new one. Ends when the sandbox is gone."""
        e2b = _sdk()
        sandbox_id, variable = split_ref(ref)
        since: datetime | None = None
        while True:
            try:
                readings = await self._call(
                    f"read metrics of {sandbox_id}", variable,
                    lambda start=since: e2b.AsyncSandbox.get_metrics(
                        sandbox_id, start=start, **self._opts(variable)))
            except AdapterError as exc:
                if not self._not_found(exc):
                    raise
                if since is None:
                    raise BackendObjectGone(f"E2B no longer has sandbox {sandbox_id}") from exc
                return
            readings = sorted(readings, key=lambda m: m.timestamp)
            fresh = [m for m in readings if since is None or m.timestamp > since]
            if since is None:
                fresh = fresh[-1:]
            for reading in fresh:
                since = reading.timestamp
                yield MetricSample(
                    time=reading.timestamp,
                    # E2B reports the share of the whole VM; sbx counts one core as 100 %
                    cpu_pct=round(reading.cpu_used_pct * reading.cpu_count, 2),
                    memory_bytes=reading.mem_used, memory_limit=reading.mem_total)
            if since is None:
                since = datetime.now(UTC) - timedelta(seconds=1)
            await asyncio.sleep(self.metrics_every_s)


def _ports_label(ports: Sequence[int]) -> dict[str, str]:
    """The profile's ports, kept in the sandbox's metadata (E2B has no list of its own)."""
    return {LABEL_PORTS: ",".join(map(str, ports))} if ports else {}


def _endpoint(sandbox: Any, port: int) -> Endpoint:
    """The SDK's `get_host(port)` as an Endpoint: https on E2B's domain (`E2B_DEBUG`: http on
    localhost); with the sandbox's traffic token as the header E2B asks for, when it has one
    (a sandbox made with allow_public_traffic false)."""
    host = sandbox.get_host(port)
    token = getattr(sandbox, "traffic_access_token", None)
    headers = {TRAFFIC_TOKEN_HEADER: token} if isinstance(token, str) and token else {}
    name, _, number = host.rpartition(":")
    if name and number.isdigit():  # debug: localhost:PORT, plain http
        return Endpoint(port, name, int(number), "http", headers)
    return Endpoint(port, host, 443, "https", headers)


async def _tree_entries(files: Any, top: str) -> list[FileInfo]:
    """`top` and, for a folder, everything under it, parents first."""
    first = _file_info(await files.get_info(top))
    if first.type != "dir":
        return [first]
    below = [_file_info(e) for e in await files.list(top, depth=TREE_DEPTH)]
    return [first, *sorted(below, key=lambda info: info.path)]


async def _pack(entries: Sequence[FileInfo], parent: str,
                read: Callable[[str], Awaitable[Any]]) -> AsyncIterator[bytes]:
    """`entries` (parents first) as a tar stream, names relative to `parent`; each file's
    bytes from `read(path)` (an async stream), held to the size it was listed with."""
    for info in entries:
        header = tarfile.TarInfo(posixpath.relpath(info.path, parent))
        header.mode, header.mtime = info.mode, int(info.mtime.timestamp())
        if info.type == "dir":
            header.type = tarfile.DIRTYPE
        elif info.type == "symlink":
            header.type, header.linkname = tarfile.SYMTYPE, info.target or ""
        elif info.type == "file":
            header.size = info.size
        else:
            continue
        yield header.tobuf(format=tarfile.PAX_FORMAT)
        if info.type != "file":
            continue
        sent = 0
        if info.size:
            try:
                stream = await read(info.path)
            except Exception as exc:
                raise AdapterError(f"E2B could not read {info.path}: {one_line(exc)}") from exc
            async with contextlib.AsyncExitStack() as stack:
                if hasattr(stream, "__aenter__"):
                    await stack.enter_async_context(stream)
                elif hasattr(stream, "aclose"):
                    stack.push_async_callback(stream.aclose)
                async for chunk in stream:
                    chunk = chunk[:info.size - sent]  # it grew since it was listed
                    sent += len(chunk)
                    if chunk:
                        yield chunk
        if sent < info.size:  # it shrank since it was listed: the header holds
            yield b"\0" * (info.size - sent)
        if info.size % tarfile.BLOCKSIZE:
            yield b"\0" * (tarfile.BLOCKSIZE - info.size % tarfile.BLOCKSIZE)
    yield b"\0" * (2 * tarfile.BLOCKSIZE)


def _content_options() -> dict[str, Any]:
    """Where the volume content API is: `E2B_VOLUME_API_URL` if set (the SDK reads it),
    else beside the API when `E2B_API_URL` moves that, else the SDK's own choice."""
    if os.environ.get("E2B_VOLUME_API_URL") or not os.environ.get("E2B_API_URL"):
        return {}
    return {"api_url": os.environ["E2B_API_URL"]}


def _volume_path(path: str) -> str:
    """The contract's helper path (under /volume) as the volume's own (/ its root)."""
    path = posixpath.normpath(path)
    if path != VOLUME_ROOT and not path.startswith(VOLUME_ROOT + "/"):
        raise InvalidRequest(f"{path}: a volume's files are under {VOLUME_ROOT}")
    return path[len(VOLUME_ROOT):] or "/"


def _volume_labels(name: str) -> dict[str, str] | None:
    """The labels an sbx volume's name carries (`sbx_<install>_<volume id>`)."""
    match = _VOLUME_NAME.fullmatch(name)
    if not match:
        return None
    return {LABEL_INSTALL: match["install"], LABEL_VOLUME: match["volume"]}


def _volume_file_info(entry: Any) -> FileInfo:
    """The SDK's VolumeEntryStat as the contract's FileInfo."""
    kind = {"file": "file", "directory": "dir", "symlink": "symlink"}.get(
        str(getattr(entry.type, "value", entry.type)), "other")
    path = entry.path
    return FileInfo(path=path, name=posixpath.basename(path) or "/", type=kind,
                    size=entry.size, mode=entry.mode & 0o7777,
                    mtime=entry.mtime.astimezone(UTC),
                    target=entry.target if kind == "symlink" else None)


def _volume_members(spool: Any, *, data: bool = True) -> Iterator[tuple[tarfile.TarInfo, Any]]:
    """The held tar's members, each with its data (a file object, valid until the next
    member; None for a folder), after rewinding it; anything but folders and regular files
    is refused (InvalidRequest)."""
    spool.seek(0)
    reader = BoundedTar(spool, max_members=VOLUME_TREE_MAX_MEMBERS)
    try:
        for member in reader:
            if not (member.isdir() or member.isreg()):
                kind = "link" if member.issym() or member.islnk() else "special file"
                raise InvalidRequest(
                    f"{member.name}: a {kind} cannot be put into an E2B volume (its volume "
                    "API makes only folders and files); nothing was written. Put it through "
                    "a sandbox that mounts the volume")
            if not (member.isreg() and data):
                reader.accept(member)
                if member_path(member):  # not the folder itself (".")
                    yield member, None
                continue
            with tempfile.SpooledTemporaryFile(VOLUME_SPOOL_BYTES) as held:
                reader.copy(member, held)
                held.seek(0)
                yield member, held
    except TooLarge as exc:
        raise InvalidRequest(f"the tree is too large for a volume: {exc}") from None
    except tarfile.TarError as exc:
        raise InvalidRequest(f"not a tar stream: {one_line(exc)}") from None
    finally:
        reader.close()


async def _volume_dir(volume: Any, path: str, mode: int | None,
                      options: dict[str, Any]) -> None:
    """The folder `path` in the volume, with parents; one already there is kept (its mode
    set when one is given)."""
    if path == "/":
        return
    try:
        await volume.make_dir(path, mode=mode, force=True, **options)
    except Exception:
        info = _volume_file_info(await volume.get_info(path, **options))
        if info.type != "dir":
            raise InvalidRequest(f"{path} exists in the volume and is not a folder") from None
        if mode is not None and info.mode != mode:
            await volume.update_metadata(path, mode=mode, **options)


def _file_info(entry: Any) -> FileInfo:
    """The SDK's EntryInfo as the contract's FileInfo (envd's mode is Go's: the low bits are
    the permissions)."""
    kind = {"file": "file", "dir": "dir", "symlink": "symlink"}.get(
        str(getattr(entry.type, "value", entry.type)), "other")
    mtime = entry.modified_time
    if mtime.tzinfo is None:
        mtime = mtime.replace(tzinfo=UTC)
    path = entry.path
    return FileInfo(path=path, name=posixpath.basename(path) or "/", type=kind,
                    size=entry.size, mode=entry.mode & 0o7777, mtime=mtime.astimezone(UTC),
                    target=entry.symlink_target if kind == "symlink" else None)


def _egress_entry_ok(entry: str) -> bool:
    try:
        return ipaddress.ip_network(entry, strict=False).version == 4
    except ValueError:
        return bool(_DOMAIN.fullmatch(entry))


def _oversized(info: Any, request: CreateRequest, template: str) -> str | None:
    """E2B sizes a sandbox by its template; a profile limit below that size cannot hold."""
    limits = request.resources
    if limits.cpu is not None and info.cpu_count > limits.cpu:
        return (f"template {template!r} gives each sandbox {info.cpu_count} vCPU, more than "
                f"resources.cpu {limits.cpu:g} allows (E2B sizes sandboxes by template): raise "
                f"resources.cpu to {info.cpu_count} or use a smaller template")
    if limits.memory_bytes is not None and info.memory_mb * 1024**2 > limits.memory_bytes:
        return (f"template {template!r} gives each sandbox {info.memory_mb} MiB of memory, "
                f"more than resources.memory {limits.memory_bytes // 1024**2} MiB allows (E2B "
                f"sizes sandboxes by template): raise resources.memory to {info.memory_mb}MiB "
                "or use a smaller template")
    return None


def _object(info: Any, variable: str) -> BackendObject:
    state = str(info.state.value)
    return BackendObject(ref=join_ref(info.sandbox_id, variable), labels=dict(info.metadata),
                         status=state, running=state == "running", created_at=info.started_at)


def _parse_time(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


def _snapshot_name(labels: Mapping[str, str]) -> str | None:
    install, checkpoint = labels.get(LABEL_INSTALL), labels.get(LABEL_CHECKPOINT)
    if not (install and checkpoint):
        return None
    name = f"sbx_{install}_{checkpoint}"
    return name if _SNAPSHOT_NAME.fullmatch(name) else None


def _snapshot_labels(snapshot_id: str) -> dict[str, str] | None:
    """The labels a snapshot's name carries (`team/sbx_<install>_<checkpoint>:tag`)."""
    name = snapshot_id.split(":", 1)[0].rpartition("/")[2]
    match = _SNAPSHOT_NAME.fullmatch(name)
    if not match:
        return None
    return {LABEL_INSTALL: match["install"], LABEL_CHECKPOINT: match["checkpoint"]}


async def _start_pty(sandbox: Any, command: str, cols: int, rows: int, envs: dict[str, str],
                     cwd: str | None, on_data: Callable[[bytes], Awaitable[None]]) -> Any:
    """`sandbox.pty.create`'s own request (the SDK's process client, its headers and start
    handling) with `command` run by `bash -l -c`, as `sandbox.commands.run` runs commands;
    no time limit on the stream (the terminal lasts as long as it is used)."""
    from e2b.connection_config import KEEPALIVE_PING_HEADER, KEEPALIVE_PING_INTERVAL_SEC
    from e2b.envd.client_async import as_stream, first_event
    from e2b.envd.process import process_pb
    from e2b.envd.utils import authentication_header, extract_start_pid
    from e2b.sandbox_async.commands.command_handle import AsyncCommandHandle

    pty = sandbox.pty
    events = as_stream(pty._rpc.start(
        process_pb.StartRequest(
            process=process_pb.ProcessConfig(cmd="/bin/bash", args=["-l", "-c", command],
                                             envs=envs, cwd=cwd),
            pty=process_pb.PTY(size=process_pb.PTY.Size(rows=rows, cols=cols))),
        headers={**authentication_header(pty._envd_version, None),
                 KEEPALIVE_PING_HEADER: str(KEEPALIVE_PING_INTERVAL_SEC)},
        timeout_ms=None))
    try:
        start = await first_event(events, pty._connection_config.get_request_timeout(None))
        pid = extract_start_pid(start, "start process")
    except BaseException:
        with contextlib.suppress(Exception):
            await events.aclose()
        raise
    return AsyncCommandHandle(pid=pid, handle_kill=lambda: pty.kill(pid), events=events,
                              on_pty=on_data, check_health=pty._check_health)


class _E2BPty(PtyChannel):
    """envd's pty process as a PtyChannel: output as the SDK hands it over (raw bytes), then
    b"" once the end event came (exit_code from it; None when the stream broke)."""

    def __init__(self, sandbox: Any, mark: str) -> None:
        self._sandbox = sandbox
        self._mark = mark
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue(64)
        self._handle: Any = None
        self._waiter: asyncio.Task | None = None
        self._ended = False
        self._closed = False

    async def on_data(self, data: bytes) -> None:
        if data and not self._closed:  # closed: no one reads it any more
            await self._queue.put(bytes(data))

    def started(self, handle: Any) -> None:
        self._handle = handle
        self._waiter = asyncio.create_task(self._wait())

    async def _wait(self) -> None:
        e2b = _sdk()
        try:
            result = await self._handle.wait()
            self.exit_code = result.exit_code
        except e2b.CommandExitException as exc:
            self.exit_code = exc.exit_code
        except Exception:
            self.exit_code = None  # the stream broke: the backend cannot tell
        if not self._closed:
            await self._queue.put(None)

    async def read(self) -> bytes:
        if self._ended:
            return b""
        chunk = await self._queue.get()
        if chunk is None:
            self._ended = True
            return b""
        return chunk

    async def write(self, data: bytes) -> None:
        if self._ended or self._closed or not data:
            return
        try:
            for at in range(0, len(data), STDIN_CHUNK):
                await self._sandbox.pty.send_stdin(self._handle.pid, data[at:at + STDIN_CHUNK])
        except Exception as exc:
            if self._waiter is not None and self._waiter.done():
                return  # the program ended: its exit code says the rest
            raise AdapterError(f"E2B did not take the terminal's input: {one_line(exc)}") from exc

    async def resize(self, cols: int, rows: int) -> None:
        if self._ended or self._closed:
            return
        e2b = _sdk()
        try:
            await self._sandbox.pty.resize(self._handle.pid, e2b.PtySize(rows=rows, cols=cols))
        except Exception as exc:
            if self._waiter is not None and self._waiter.done():
                return
            raise AdapterError(f"E2B did not resize the terminal: {one_line(exc)}") from exc

    async def close(self) -> None:
        """Kill the program and what it started (its mark), then stop listening."""
        if self._closed:
            return
        self._closed = True
        if self._waiter is not None and not self._waiter.done():
            with contextlib.suppress(Exception):
                await self._sandbox.pty.kill(self._handle.pid)
            await E2BAdapter._kill_marked(self._sandbox, self._mark)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._waiter), 10)
        if self._handle is not None:
            with contextlib.suppress(Exception):
                await self._handle.disconnect()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.cancel()
        while not self._queue.empty():  # a read waiting now ends with b""
            self._queue.get_nowait()
        self._queue.put_nowait(None)
