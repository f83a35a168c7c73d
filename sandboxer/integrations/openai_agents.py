"""sandboxer as a sandbox provider of the OpenAI Agents SDK (docs/integrations.md, "OpenAI
Agents SDK"): `SandboxerSandboxClient` makes sessions (`SandboxerSandboxSession`) over
sandboxer sandboxes, as the SDK's own providers under `agents.extensions.sandbox` do over
E2B, Modal or Daytona.

A session runs commands with the library's exec, moves files with its file API (no shell in
between), runs interactive commands on its terminals (`box.pty`, for `tty=True`) or as
background processes (`box.processes`, for `tty=False`), and resolves an exposed port to
the URL the library gives (`box.url(port)`: on Docker a port of the profile's `ports:`,
published on 127.0.0.1). Failures come back as the SDK's own errors (ExecTimeoutError,
WorkspaceReadNotFoundError, ExposedPortUnavailableError, ...) carrying sandboxer's one-line
message, never a traceback of ours."""

from __future__ import annotations

import asyncio
import io
import shlex
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

try:
    import agents  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != "agents":
        raise
    # an extra, not a dependency of sbx: say which extra brings it, not just its name
    raise ModuleNotFoundError(
        "sandboxer.integrations.openai_agents needs openai-agents: "
        "pip install 'sandboxer[openai-agents]'", name="agents") from None

from agents.sandbox.errors import (
    ExecTimeoutError,
    ExecTransportError,
    ExposedPortUnavailableError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
    WorkspaceStartError,
    WorkspaceWriteTypeError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session import SandboxSession, SandboxSessionState
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.dependencies import Dependencies
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.pty_output import collect_pty_output
from agents.sandbox.session.pty_types import (
    PTY_PROCESSES_MAX,
    PtyExecUpdate,
    allocate_pty_process_id,
    clamp_pty_yield_time_ms,
    process_id_to_prune_from_meta,
    resolve_pty_write_yield_time_ms,
)
from agents.sandbox.session.runtime_helpers import (
    RESOLVE_WORKSPACE_PATH_HELPER,
    RuntimeHelperScript,
)
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.tar_workspace import shell_tar_exclude_args
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, ExposedPortEndpoint, User
from agents.sandbox.workspace_paths import sandbox_path_str

import sandboxer
from sandboxer.core.rules.errors import one_line

__all__ = [
    "SandboxerSandboxClient",
    "SandboxerSandboxClientOptions",
    "SandboxerSandboxSession",
    "SandboxerSandboxSessionState",
]

BACKEND_ID = "sandboxer"


class SandboxerSandboxClientOptions(BaseSandboxClientOptions):
    """What to make: a sandbox from `profile` (a profile's name, or a profile document as
    `check_profile` takes it; with `ttl`, `name`, `task`, `labels` as `sbx create` takes
    them), or, with `sandbox`, an existing one by id or name (which the
    session then never destroys). `exposed_ports`: the ports `resolve_exposed_port` may
    give; on Docker they must be in the profile's `ports:`."""

    type: Literal["sandboxer"] = "sandboxer"
    profile: str | dict[str, Any] = "default"
    ttl: str | None = None
    name: str | None = None
    task: str | None = None
    labels: dict[str, str] | None = None
    sandbox: str | None = None
    exposed_ports: tuple[int, ...] = ()


class SandboxerSandboxSessionState(SandboxSessionState):
    """The session as the SDK persists it (`serialize_session_state`): enough to attach to
    the same sandbox again (`resume`), or to make another like it when it is gone."""

    type: Literal["sandboxer"] = "sandboxer"
    sandbox_id: str
    profile: str | dict[str, Any] = "default"
    ttl: str | None = None
    task: str | None = None
    labels: dict[str, str] | None = None
    owned: bool = True  # made by this client: destroyed when the session shuts down


@dataclass
class _PtyEntry:
    """One interactive command: a terminal (`tty`) or a background process."""

    tty: bool
    terminal: Any = None  # sandboxer.AsyncTerminal
    process: Any = None  # sandboxer.AsyncProcess
    output_chunks: deque[bytes] = field(default_factory=deque)
    output_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    output_notify: asyncio.Event = field(default_factory=asyncio.Event)
    output_closed: asyncio.Event = field(default_factory=asyncio.Event)
    last_used: float = field(default_factory=time.monotonic)
    exit_code: int | None = None
    reader: asyncio.Task[None] | None = None
    deadline: asyncio.Task[None] | None = None


class SandboxerSandboxSession(BaseSandboxSession):
    """A session over one sandboxer sandbox (`AsyncSandbox`)."""

    state: SandboxerSandboxSessionState

    def __init__(self, *, state: SandboxerSandboxSessionState,
                 box: sandboxer.AsyncSandbox) -> None:
        self.state = state
        self._box = box
        self._workspace_root_ready = state.workspace_root_ready
        self._pty_lock = asyncio.Lock()
        self._pty_processes: dict[int, _PtyEntry] = {}
        self._reserved_pty_process_ids: set[int] = set()

    @property
    def sandbox(self) -> sandboxer.AsyncSandbox:
        return self._box

    @property
    def sandbox_id(self) -> str:
        return self.state.sandbox_id

    # -- the workspace ----------------------------------------------------------------------

    async def _prepare_backend_workspace(self) -> None:
        root = sandbox_path_str(self._workspace_root_path())
        try:
            await self._box.files.mkdir(root, parents=True)
        except sandboxer.Error as e:
            raise WorkspaceStartError(path=self._workspace_root_path(),
                                      context={"reason": one_line(e)}) from None
        self._workspace_root_ready = True

    async def _validate_path_access(self, path: Path | str, *, for_write: bool = False) -> Path:
        """As the SDK's Docker and E2B sessions do: the path resolved in the sandbox (its
        symbolic links followed) must stay inside the workspace or a granted folder."""
        return await self._validate_remote_path_access(path, for_write=for_write)

    def _runtime_helpers(self) -> tuple[RuntimeHelperScript, ...]:
        return (RESOLVE_WORKSPACE_PATH_HELPER,)

    def _current_runtime_helper_cache_key(self) -> object | None:
        return self.state.sandbox_id

    def _mark_workspace_root_ready_from_probe(self) -> None:
        super()._mark_workspace_root_ready_from_probe()
        self._workspace_root_ready = True

    async def running(self) -> bool:
        try:
            await self._box.refresh()
        except sandboxer.Error:
            return False
        return self._box.state == sandboxer.State.RUNNING

    async def _shutdown_backend(self) -> None:
        if self.state.owned:
            try:
                await self._box.destroy()
            except sandboxer.Error:
                pass  # the reaper ends it at its deadline all the same

    # -- commands ---------------------------------------------------------------------------

    def _cwd(self) -> str | None:
        return self.state.manifest.root if self._workspace_root_ready else None

    @staticmethod
    def _split_user(argv: list[str]) -> tuple[list[str], str | None]:
        """The SDK runs a command as a user by prefixing `sudo -u USER --`; the library runs
        it as that user itself (`user=`), where the backend can."""
        if len(argv) >= 4 and argv[0] == "sudo" and argv[1] == "-u" and argv[3] == "--":
            return argv[4:], argv[2]
        return argv, None

    async def _exec_internal(self, *command: str | Path,
                             timeout: float | None = None) -> ExecResult:
        argv, user = self._split_user([str(c) for c in command])
        try:
            done = await self._box.exec(argv, timeout=timeout, cwd=self._cwd(), user=user)
        except sandboxer.Error as e:
            raise ExecTransportError(command=command, context={"reason": one_line(e)},
                                     message=f"sandboxer exec failed: {one_line(e)}"
                                     ) from None
        if done.timed_out:
            raise ExecTimeoutError(command=command, timeout_s=timeout)
        return ExecResult(stdout=done.stdout, stderr=done.stderr, exit_code=done.exit_code)

    # -- files ------------------------------------------------------------------------------

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        if user is not None:
            await self._check_read_with_exec(path, user=user)
        workspace_path = await self._validate_path_access(path)
        try:
            data = await self._box.files.read(sandbox_path_str(workspace_path))
        except sandboxer.NotFound:
            raise WorkspaceReadNotFoundError(path=path) from None
        except sandboxer.Error as e:
            raise WorkspaceArchiveReadError(path=path, context={"reason": one_line(e)}
                                            ) from None
        return io.BytesIO(data)

    async def write(self, path: Path, data: io.IOBase, *,
                    user: str | User | None = None) -> None:
        if user is not None:
            await self._check_write_with_exec(path, user=user)
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        if not isinstance(payload, bytes | bytearray):
            raise WorkspaceWriteTypeError(path=path, actual_type=type(payload).__name__)
        workspace_path = await self._validate_path_access(path, for_write=True)
        target = sandbox_path_str(workspace_path)
        # the file API replaces whatever is at the path, a folder and all it holds included
        if (await self._exec_internal("test", "-d", target)).exit_code == 0:
            raise WorkspaceArchiveWriteError(path=workspace_path,
                                             context={"reason": f"{target} is a folder"})
        try:
            await self._box.files.write(target, bytes(payload))
        except sandboxer.Error as e:
            raise WorkspaceArchiveWriteError(path=workspace_path,
                                             context={"reason": one_line(e)}) from None

    async def persist_workspace(self) -> io.IOBase:
        """The workspace as a tar stream with workspace-relative members."""
        root = sandbox_path_str(self._workspace_root_path())
        excludes = " ".join(shell_tar_exclude_args(self._persist_workspace_skip_relpaths()))
        command = f"tar {excludes} -C {shlex.quote(root)} -cf - ."
        try:
            done = await self._box.exec(["sh", "-c", command])
        except sandboxer.Error as e:
            raise WorkspaceArchiveReadError(path=self._workspace_root_path(),
                                            context={"reason": one_line(e)}) from None
        if not done.ok:
            raise WorkspaceArchiveReadError(
                path=self._workspace_root_path(),
                context={"reason": done.stderr.decode("utf-8", errors="replace").strip()})
        return io.BytesIO(done.stdout)

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        raw = data.read()
        if isinstance(raw, str):
            raw = raw.encode("utf-8")
        try:
            await self._box.files.put_tree(sandbox_path_str(self._workspace_root_path()),
                                           bytes(raw))
        except sandboxer.Error as e:
            raise WorkspaceArchiveWriteError(path=self._workspace_root_path(),
                                             context={"reason": one_line(e)}) from None

    # -- exposed ports ----------------------------------------------------------------------

    async def _resolve_exposed_port(self, port: int) -> ExposedPortEndpoint:
        try:
            url = urlsplit(await self._box.url(port))
        except sandboxer.Error as e:
            raise ExposedPortUnavailableError(
                port=port, exposed_ports=self.state.exposed_ports, reason="backend_unavailable",
                context={"backend": BACKEND_ID, "detail": one_line(e)}) from None
        tls = url.scheme == "https"
        return ExposedPortEndpoint(host=url.hostname or "", port=url.port or (443 if tls else 80),
                                   tls=tls, query=url.query)

    # -- interactive commands (the SDK's "PTY" tools) ---------------------------------------

    def supports_pty(self) -> bool:
        return True

    async def pty_exec_start(self, *command: str | Path, timeout: float | None = None,
                             shell: bool | list[str] = True, user: str | User | None = None,
                             tty: bool = False, yield_time_s: float | None = None,
                             max_output_tokens: int | None = None) -> PtyExecUpdate:
        """Start `command` on a terminal (`tty`) or as a background process, and return
        what it wrote in the first `yield_time_s` (10 s at most by default, less when it
        ends sooner); `process_id` is None once it ended, else the id for
        `pty_write_stdin`."""
        argv, as_user = self._split_user(
            self._prepare_exec_command(*command, shell=shell, user=user))
        entry = _PtyEntry(tty=tty)
        if tty and as_user is not None:
            # a terminal runs as the sandbox's own user (su needs capabilities a sandbox lacks)
            raise ExecTransportError(
                command=command, context={"reason": "terminal_as_user"},
                message=f"a terminal cannot run as {as_user}: run it without tty")
        try:
            if tty:
                entry.terminal = await self._box.pty(argv, cwd=self._cwd())
            else:
                entry.process = await self._box.processes.start(
                    argv, cwd=self._cwd(), user=as_user, stdin=False)
        except sandboxer.Error as e:
            raise ExecTransportError(command=command, context={"reason": one_line(e)},
                                     message=f"sandboxer could not start it: {one_line(e)}"
                                     ) from None
        entry.reader = asyncio.create_task(self._pump(entry))
        if timeout is not None:
            entry.deadline = asyncio.create_task(self._end_after(entry, timeout))
        async with self._pty_lock:
            process_id = allocate_pty_process_id(self._reserved_pty_process_ids)
            self._reserved_pty_process_ids.add(process_id)
            pruned = self._prune()
            self._pty_processes[process_id] = entry
        if pruned is not None:
            await self._end(pruned)
        wait_ms = 10_000 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._update(process_id, entry, clamp_pty_yield_time_ms(wait_ms),
                                  max_output_tokens)

    async def pty_write_stdin(self, *, session_id: int, chars: str,
                              yield_time_s: float | None = None,
                              max_output_tokens: int | None = None) -> PtyExecUpdate:
        """Type `chars` on its terminal (Enter is "\\n" or "\\r"), then return what it wrote
        since the last update; with no `chars`, only wait for output."""
        async with self._pty_lock:
            entry = self._resolve_pty_session_entry(pty_processes=self._pty_processes,
                                                    session_id=session_id)
        if chars:
            if not entry.tty:
                raise RuntimeError("stdin is not available for this process (start it with "
                                   "tty=True to type into it)")
            try:
                await entry.terminal.write(chars)
            except sandboxer.Error as e:
                raise ExecTransportError(command=("pty_write_stdin", str(session_id)),
                                         context={"reason": one_line(e)}) from None
        wait_ms = 250 if yield_time_s is None else int(yield_time_s * 1000)
        entry.last_used = time.monotonic()
        return await self._update(
            session_id, entry,
            resolve_pty_write_yield_time_ms(yield_time_ms=wait_ms, input_empty=chars == ""),
            max_output_tokens)

    async def pty_terminate_all(self) -> None:
        async with self._pty_lock:
            entries = list(self._pty_processes.values())
            self._pty_processes.clear()
            self._reserved_pty_process_ids.clear()
        for entry in entries:
            await self._end(entry)

    async def _pump(self, entry: _PtyEntry) -> None:
        """Copy the command's output into the entry until it ends, then its exit code."""

        async def keep(data: bytes) -> None:
            async with entry.output_lock:
                entry.output_chunks.append(data)
            entry.output_notify.set()

        try:
            if entry.tty:
                async for data in entry.terminal:
                    await keep(data)
                entry.exit_code = entry.terminal.exit_code
            else:
                async for piece in entry.process.output():
                    await keep(piece.data)
                entry.exit_code = entry.process.exit_code
        except sandboxer.Error as e:
            await keep(f"\n[sandboxer: {one_line(e)}]\n".encode())
        finally:
            entry.output_closed.set()
            entry.output_notify.set()

    async def _end_after(self, entry: _PtyEntry, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self._end(entry, cancel_deadline=False)

    async def _end(self, entry: _PtyEntry, *, cancel_deadline: bool = True) -> None:
        """End the command if it still runs, and stop reading it."""
        if not entry.output_closed.is_set():
            try:
                if entry.tty:
                    await entry.terminal.close()
                else:
                    await entry.process.kill()
            except sandboxer.Error:
                pass  # it ended meanwhile, or the sandbox did
        if cancel_deadline and entry.deadline is not None:
            entry.deadline.cancel()
        if entry.reader is not None and not entry.reader.done():
            try:  # its output ends with the program; a reader still stuck then is dropped
                await asyncio.wait_for(asyncio.shield(entry.reader), timeout=5)
            except TimeoutError:
                entry.reader.cancel()

    def _prune(self) -> _PtyEntry | None:
        if len(self._pty_processes) < PTY_PROCESSES_MAX:
            return None
        meta = [(pid, e.last_used, e.output_closed.is_set())
                for pid, e in self._pty_processes.items()]
        victim = process_id_to_prune_from_meta(meta)
        if victim is None:
            return None
        self._reserved_pty_process_ids.discard(victim)
        return self._pty_processes.pop(victim, None)

    async def _update(self, process_id: int, entry: _PtyEntry, wait_ms: int,
                      max_output_tokens: int | None) -> PtyExecUpdate:
        output, original_tokens, closed = await collect_pty_output(
            output_chunks=entry.output_chunks, output_lock=entry.output_lock,
            output_notify=entry.output_notify, is_done=entry.output_closed.is_set,
            yield_time_ms=wait_ms, max_output_tokens=max_output_tokens)
        live: int | None = process_id
        exit_code = None
        if closed:
            if entry.reader is not None:
                await entry.reader
            exit_code = entry.exit_code
            async with self._pty_lock:
                self._pty_processes.pop(process_id, None)
                self._reserved_pty_process_ids.discard(process_id)
            if entry.deadline is not None:
                entry.deadline.cancel()
            live = None
        return PtyExecUpdate(process_id=live, output=output, exit_code=exit_code,
                             original_token_count=original_tokens)


class SandboxerSandboxClient(BaseSandboxClient[SandboxerSandboxClientOptions]):
    """Makes sessions over sandboxer sandboxes, through `client` (an `AsyncSandboxer`:
    in process, or a client of `sbx serve` with `url=` and `token=`; by default one on
    SBX_HOME or SBX_URL, closed by `aclose`)."""

    backend_id = BACKEND_ID

    def __init__(self, client: sandboxer.AsyncSandboxer | None = None, *,
                 instrumentation: Instrumentation | None = None,
                 dependencies: Dependencies | None = None) -> None:
        self._own_client = client is None
        self._client = client if client is not None else sandboxer.AsyncSandboxer()
        self._instrumentation = instrumentation or Instrumentation()
        self._dependencies = dependencies

    async def aclose(self) -> None:
        """Close the AsyncSandboxer this client made (one passed in is the caller's)."""
        if self._own_client:
            await self._client.close()

    async def create(self, *, snapshot: SnapshotSpec | SnapshotBase | None = None,
                     manifest: Manifest | None = None,
                     options: SandboxerSandboxClientOptions | None = None) -> SandboxSession:
        options = options or SandboxerSandboxClientOptions()
        manifest = manifest if manifest is not None else Manifest()
        self._validate_manifest_for_create(manifest)
        if options.sandbox is not None:
            box = await self._client.get(options.sandbox)
            owned = False
        else:
            box = await self._client.create(await self._profile(options.profile),
                                            ttl=options.ttl, name=options.name,
                                            labels=options.labels, task=options.task)
            owned = True
        state = SandboxerSandboxSessionState(
            manifest=manifest, snapshot=resolve_snapshot(snapshot, box.id), sandbox_id=box.id,
            profile=options.profile, ttl=options.ttl, task=options.task,
            labels=options.labels, owned=owned, exposed_ports=options.exposed_ports)
        inner = SandboxerSandboxSession(state=state, box=box)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """Destroy the sandbox the session made (already destroyed counts as done)."""
        inner = session._inner
        if not isinstance(inner, SandboxerSandboxSession):
            raise TypeError("SandboxerSandboxClient.delete expects a SandboxerSandboxSession")
        if inner.state.owned:
            try:
                await inner.sandbox.destroy()
            except sandboxer.NotFound:
                pass
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """Attach to the state's sandbox if it still runs; else make another from the same
        profile (the SDK then restores the workspace from the state's snapshot)."""
        if not isinstance(state, SandboxerSandboxSessionState):
            raise TypeError("SandboxerSandboxClient.resume expects a "
                            "SandboxerSandboxSessionState")
        state.assert_path_grants_rebound()
        box: sandboxer.AsyncSandbox | None
        try:
            box = await self._client.get(state.sandbox_id)
        except sandboxer.NotFound:
            box = None
        reconnected = box is not None and box.state == sandboxer.State.RUNNING
        if not reconnected:
            box = await self._client.create(await self._profile(state.profile), ttl=state.ttl,
                                            labels=state.labels, task=state.task)
            state.sandbox_id = box.id
            state.owned = True
            state.workspace_root_ready = False
        assert box is not None
        inner = SandboxerSandboxSession(state=state, box=box)
        inner._set_start_state_preserved(reconnected, system=reconnected)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def _profile(self, profile: str | dict[str, Any]) -> Any:
        return profile if isinstance(profile, str) else await self._client.check_profile(profile)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, SandboxerSandboxSessionState)
