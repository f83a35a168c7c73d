"""The transport contract: every operation the library's handles (`sandboxer._api`) ask of
the sbx they talk to, written once.

Two transports implement it: `LocalTransport` (`sandboxer._local`: the core of this machine,
on a loop of its own) and `RemoteTransport` (`sandboxer._remote`: a client of `sbx serve`
over HTTP). A handle never knows which one it holds: both take the same arguments and
return the same JSON-shaped dicts (docs/cli.md, "JSON"), and both raise the one error tree
(`sandboxer.core.rules.errors`). `tests/api/test_transport_contract.py` fails when either
lacks an operation, differs from it in signature, or offers a public method that is not
here: a new operation is added here first, then to both.

What only one side can do is still here, and the other side refuses it with an error of the
tree, so a caller sees one line instead of an AttributeError:
- `RemoteTransport` refuses `acting_as` and `authenticate` (the service checks its own keys
  and acts as their owners), `shell_command` (a terminal is on the service's host),
  `copy_database` and `current_metrics` (they run where the database and the engines are),
  `mark_traffic` and `record_port_link` (a proxy's records, kept by the service that proxies).
- `LocalTransport` refuses `evidence(signed=True)` (a service's key signs only there).

The operations under "for the service" are what `sbx serve` needs beyond the public API
(acting as a key's owner, pages, idempotent creates, keys, counts, readiness). They are
here, not in a front end, because the library's service client calls them on whichever
transport it holds (a service may itself be a client of another one).

Not part of the contract: how a transport runs (LocalTransport's core loop and its `_call`
and `_stream`; RemoteTransport's httpx clients), and its constructor.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from sandboxer.core.rules.profiles import Profile

T = TypeVar("T")


class Watch(Protocol):
    """What `Transport.watch` returns: reads of the inventory that say what changed."""

    include_destroyed: bool

    async def read(self) -> dict[str, Any]:
        """`{"added": [views], "changed": [views], "removed": [ids]}` since the last read."""
        ...

    async def close(self) -> None:
        """Stop watching; what the watch holds open is closed."""
        ...


class Transport(Protocol):
    """The operations of the library, each taking and returning JSON-shaped values.
    Durations are timedeltas by the time they get here (`sandboxer._api` parses them)."""

    # -- running ----------------------------------------------------------------------------

    def call_blocking(self, awaitable: Awaitable[T]) -> T:
        """Run `awaitable` on the transport's own loop and wait for it (the sync API)."""
        ...

    async def close(self) -> None:
        """Close what the transport holds (database, backends, HTTP clients)."""
        ...

    def close_blocking(self) -> None:
        """`close()` for the sync API, from any thread but the transport's own loop."""
        ...

    # -- sandboxes --------------------------------------------------------------------------

    async def create(self, profile: str | Profile, *, ttl: timedelta | None, name: str | None,
                     labels: Mapping[str, str] | None, owner: str | None,
                     task: str | None,
                     volumes: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
        """Make a sandbox from a profile (a name on the search path, or a `Profile`);
        `volumes` ({name, path, read_only}) are mounted beside the profile's own."""
        ...

    async def get(self, ref: str, *, with_profile: bool = False) -> dict[str, Any]:
        """A sandbox's view by id, id prefix or name (with its resolved profile, if asked)."""
        ...

    async def destroy(self, ref: str) -> tuple[dict[str, Any], bool]:
        """Destroy one sandbox: (its view, True when this call destroyed it)."""
        ...

    async def destroy_many(self, refs: Sequence[str]) -> dict[str, list[Any]]:
        """Destroy several, all resolved first: `{"destroyed", "already_destroyed", "failed"}`."""
        ...

    async def exec(self, ref: str, argv: Sequence[str], timeout: timedelta | None, *,
                   env: Mapping[str, str] | None = None, cwd: str | None = None,
                   user: str | None = None, stdin: bytes | None = None) -> dict[str, Any]:
        """Run a command and wait: `{"exit_code", "stdout", "stderr", "duration", "timed_out"}`
        (on a timeout, the output produced until then). `env` values are secrets (events
        record names only); `cwd` an absolute folder; `user` needs RUN_AS_USER; `stdin`
        written to the command, then closed."""
        ...

    def exec_stream(self, ref: str, argv: Sequence[str], timeout: timedelta | None, *,
                    env: Mapping[str, str] | None = None, cwd: str | None = None,
                    user: str | None = None, stdin: bytes | None = None,
                    ) -> AsyncIterator[tuple[str, Any]]:
        """Run a command: `("stdout"|"stderr", bytes)` as they come, then `("exit", {...})`."""
        ...

    def logs(self, ref: str, *, follow: bool, tail: int | None) -> AsyncIterator[bytes]:
        """The main process's output (with `follow`, new output as it comes)."""
        ...

    async def extend(self, ref: str, by: timedelta) -> tuple[dict[str, Any], bool]:
        """Move the deadline later: (the view, True when the hard deadline capped it)."""
        ...

    async def touch(self, ref: str) -> dict[str, Any]:
        """Record activity now (the idle clock starts again): the view."""
        ...

    async def pause(self, ref: str) -> dict[str, Any]:
        """Freeze a sandbox: the view."""
        ...

    async def resume(self, ref: str) -> dict[str, Any]:
        """Unfreeze a paused sandbox: the view."""
        ...

    async def metrics(self, ref: str) -> dict[str, Any] | None:
        """One live reading of a sandbox's resources (None: no sample yet)."""
        ...

    def follow_metrics(self, ref: str) -> AsyncIterator[dict[str, Any]]:
        """Live readings of one sandbox as the backend sends them."""
        ...

    def follow_all_metrics(self, every: timedelta | None = None,
                           ) -> AsyncIterator[dict[str, Any]]:
        """Live readings of every running sandbox (new ones looked for every `every`)."""
        ...

    async def metric_history(self, ref: str) -> list[dict[str, Any]]:
        """A sandbox's stored readings, oldest first."""
        ...

    async def recent_metrics(self, since: datetime | timedelta) -> list[dict[str, Any]]:
        """Every sandbox's stored readings since a time (or a while ago), oldest first."""
        ...

    async def evidence(self, ref: str, signed: bool = False) -> dict[str, Any]:
        """A sandbox's evidence bundle (`signed`: by the service's own key)."""
        ...

    async def origin(self, ref: str) -> str | None:
        """The id of the checkpoint a sandbox was restored from (None: from a profile)."""
        ...

    async def shell_command(self, ref: str) -> list[str]:
        """The command line that opens an interactive shell in a running sandbox."""
        ...

    # -- files in a sandbox (absolute paths; a backend without FILES refuses, exit 4) --------
    # `data` and `tar` are read chunk by chunk as they are sent on, never gathered whole.

    async def write_file(self, ref: str, path: str, data: AsyncIterator[bytes], *,
                         mode: int | None = None) -> dict[str, Any]:
        """Write a file (its folder made if missing): `{"path", "bytes", "sha256"}`."""
        ...

    def read_file(self, ref: str, path: str) -> AsyncIterator[bytes]:
        """A file's bytes as they come (NotFound when missing)."""
        ...

    async def put_tree(self, ref: str, path: str, tar: AsyncIterator[bytes]) -> dict[str, Any]:
        """Unpack a tar stream into the folder `path`: `{"path", "bytes", "sha256",
        "entries"}` (bytes and sha256 of the tar stream)."""
        ...

    def get_tree(self, ref: str, path: str) -> AsyncIterator[bytes]:
        """A file or folder as a tar stream whose one top entry is its base name."""
        ...

    async def list_files(self, ref: str, path: str, depth: int) -> list[dict[str, Any]]:
        """What is under a folder, `depth` levels down: FileInfo dicts (mtime ISO-8601)."""
        ...

    async def stat_file(self, ref: str, path: str) -> dict[str, Any]:
        """One path's FileInfo dict (NotFound when missing)."""
        ...

    async def remove_file(self, ref: str, path: str, *, recursive: bool) -> None:
        """Remove a file, a link or an empty folder (`recursive`: any folder)."""
        ...

    async def make_dir(self, ref: str, path: str, *, parents: bool) -> None:
        """Make a folder (`parents`: its missing parents too)."""
        ...

    async def rename_file(self, ref: str, src: str, dst: str) -> None:
        """Move a path to another."""
        ...

    # -- terminals (a backend without PTY refuses, exit 4; docs/terminals-and-ports.md) ----
    # a terminal's view: {"id", "sandbox_id", "argv", "cols", "rows", "offset": bytes of
    # output so far, "kept_from": the oldest kept, "running": bool, "exit_code": int | None}

    async def open_pty(self, ref: str, argv: Sequence[str] | None, *, cols: int = 80,
                       rows: int = 24, env: Mapping[str, str] | None = None,
                       cwd: str | None = None) -> dict[str, Any]:
        """Start a program (a login shell when `argv` is None) on a new terminal: its view."""
        ...

    async def get_pty(self, ref: str, session: str) -> dict[str, Any]:
        """A terminal's view."""
        ...

    def pty_output(self, ref: str, session: str, offset: int = 0,
                   ) -> AsyncIterator[dict[str, Any]]:
        """`{"offset", "data"}` items from `offset` on as they come (an offset past the one
        asked for: what lay between is no longer kept), then `{"exit": code}`."""
        ...

    async def write_pty(self, ref: str, session: str, data: bytes) -> None:
        """Keystrokes to a terminal."""
        ...

    async def resize_pty(self, ref: str, session: str, cols: int, rows: int) -> None:
        """A terminal's new size."""
        ...

    async def close_pty(self, ref: str, session: str) -> None:
        """End a terminal's program (idempotent)."""
        ...

    # -- background processes (a backend without PROCESSES refuses, exit 4) -----------------
    # a process's view: {"pid", "argv", "cwd", "user", "env_names", "stdin": bool,
    # "started_at", "running": bool, "exit_code": int | None, "ended_at": ISO | None}

    async def start_process(self, ref: str, argv: Sequence[str], *,
                            env: Mapping[str, str] | None = None, cwd: str | None = None,
                            user: str | None = None, stdin: bool = False) -> dict[str, Any]:
        """Start a command in the background (`stdin`: keep its input open): its view."""
        ...

    async def list_processes(self, ref: str) -> list[dict[str, Any]]:
        """The views of a sandbox's background processes."""
        ...

    async def get_process(self, ref: str, pid: int) -> dict[str, Any]:
        """One background process's view."""
        ...

    async def wait_process(self, ref: str, pid: int,
                           timeout: timedelta | None) -> dict[str, Any]:
        """Wait for a process to end (at most `timeout`): its view."""
        ...

    async def signal_process(self, ref: str, pid: int, signal: int) -> dict[str, Any]:
        """Send a signal to a process: its view."""
        ...

    async def write_process_stdin(self, ref: str, pid: int, data: bytes) -> None:
        """Write to a process's standard input."""
        ...

    async def close_process_stdin(self, ref: str, pid: int) -> None:
        """Close a process's standard input."""
        ...

    def process_output(self, ref: str, pid: int, *, stdout_offset: int = 0,
                       stderr_offset: int = 0, follow: bool = False,
                       ) -> AsyncIterator[dict[str, Any]]:
        """`{"stream", "offset", "data"}` items from the offsets on (kept output is bounded:
        an offset older than the oldest kept byte starts there), then, once the process has
        ended and all was sent, `{"exit": view}`. Without `follow` it ends when caught up."""
        ...

    # -- ports (a backend without PORTS refuses, exit 4; docs/terminals-and-ports.md) -------
    # a port's view: {"port": 8080, "url": "http://127.0.0.1:49153"}

    async def port_urls(self, ref: str) -> list[dict[str, Any]]:
        """The views of a sandbox's published ports, by port."""
        ...

    async def port_url(self, ref: str, port: int) -> dict[str, Any]:
        """One port's view (NotFound, exit 3, when it is not published)."""
        ...

    async def expose_port(self, ref: str, port: int) -> dict[str, Any]:
        """Make a port reachable while the sandbox runs, where the backend can: its view."""
        ...

    # -- events -----------------------------------------------------------------------------

    async def events(self, sandbox: str | None, since: datetime | timedelta | None,
                     after: int | None) -> list[dict[str, Any]]:
        """Events, oldest first: of one sandbox, from a time, after an event id."""
        ...

    def follow_events(self, sandbox: str | None, after: int | None,
                      every: float) -> AsyncIterator[dict[str, Any]]:
        """New events as they are written, forever (from `after`, else from now)."""
        ...

    async def verify_events(self) -> dict[str, Any]:
        """Check the hash chain: `{"checked", "intact", "broken_at", "problem"}`."""
        ...

    async def deliver_events(self) -> list[dict[str, Any]]:
        """Push pending events to the sinks now: one report per sink."""
        ...

    async def undelivered(self) -> list[dict[str, Any]]:
        """Events some sink has not taken yet."""
        ...

    async def redeliver(self, event_ids: Sequence[int] | None) -> list[dict[str, Any]]:
        """Send events (these, or every failed one) to the sinks again."""
        ...

    # -- the reaper -------------------------------------------------------------------------

    async def reap(self, *, dry_run: bool, orphans: bool, reap: bool = True,
                   timeout: timedelta | None = None) -> dict[str, Any]:
        """One cycle of reconcile, then (with `reap`) destroy what is due: the report."""
        ...

    # -- checkpoints ------------------------------------------------------------------------

    async def snapshot(self, ref: str, name: str | None) -> dict[str, Any]:
        """Save a sandbox's filesystem as a checkpoint: its view."""
        ...

    async def checkpoint(self, ref: str) -> dict[str, Any]:
        """A checkpoint's view by id, id prefix or name."""
        ...

    async def checkpoints(self, sandbox: str | None) -> list[dict[str, Any]]:
        """Checkpoints' views, oldest first (of one sandbox)."""
        ...

    async def restore(self, ref: str, *, ttl: timedelta | None, name: str | None,
                      labels: Mapping[str, str] | None, owner: str | None, task: str | None,
                      profile: str | None) -> dict[str, Any]:
        """A new sandbox from a checkpoint: its view."""
        ...

    async def remove_checkpoint(self, ref: str) -> dict[str, Any]:
        """Remove a checkpoint and its backend artifact: its last view."""
        ...

    async def prune_checkpoints(self) -> list[str]:
        """Remove expired checkpoints and those past each profile's `keep`: their ids."""
        ...

    async def export_checkpoint(self, ref: str, path: str) -> dict[str, Any]:
        """Write a checkpoint to an archive at `path` on this machine: its view."""
        ...

    async def import_checkpoint(self, path: str, name: str | None) -> dict[str, Any]:
        """A checkpoint from an archive at `path` on this machine: its view."""
        ...

    # -- volumes (docs/volumes.md): a volume's view is core/lifecycle/volumes.py view() ---

    async def create_volume(self, name: str, *, backend: str | None,
                            labels: Mapping[str, str] | None, ttl: timedelta | None,
                            shared: bool, owner: str | None) -> dict[str, Any]:
        """Make an empty volume: its view."""
        ...

    async def volumes(self) -> list[dict[str, Any]]:
        """Volumes' views, oldest first."""
        ...

    async def volume(self, ref: str) -> dict[str, Any]:
        """A volume's view by id or name, its size asked of the backend now."""
        ...

    async def remove_volume(self, ref: str) -> dict[str, Any]:
        """Remove a volume no live sandbox mounts: its last view."""
        ...

    async def put_volume_tree(self, ref: str, path: str,
                              tar: AsyncIterator[bytes]) -> dict[str, Any]:
        """Unpack a tar stream into the folder `path` of a volume (no sandbox needed)."""
        ...

    def get_volume_tree(self, ref: str, path: str) -> AsyncIterator[bytes]:
        """A file or folder of a volume as a tar stream (one top entry, its base name)."""
        ...

    # -- profiles, health, the store --------------------------------------------------------

    async def profiles(self) -> list[dict[str, Any]]:
        """Every profile on the search path, with why it cannot be used if it cannot."""
        ...

    async def profile(self, name: str) -> Profile:
        """A profile on the search path, resolved."""
        ...

    async def check_profile(self, profile: Profile | Mapping[str, Any]) -> Profile:
        """A profile as create would take it, or the error create would give."""
        ...

    async def doctor(self) -> dict[str, Any]:
        """Backends, the database and versions, as `sbx doctor --json` prints them."""
        ...

    async def copy_database(self, target_url: str) -> dict[str, Any]:
        """Copy the whole inventory into another, empty database."""
        ...

    def watch(self, include_destroyed: bool) -> Watch:
        """A watch of the inventory (reads that say what changed)."""
        ...

    async def backends(self, names: Sequence[str] | None, *, check: bool,
                       timeout: float) -> list[dict[str, Any]]:
        """Each backend as this transport reaches it (with `check`, its health)."""
        ...

    # -- warm pools -------------------------------------------------------------------------

    async def pools(self) -> list[dict[str, Any]]:
        """Every warm pool of the installation."""
        ...

    async def set_pool_size(self, profile: str, size: int) -> dict[str, Any]:
        """Keep `size` warm members of a profile, filled or shrunk now: the pool."""
        ...

    async def drain_pool(self, profile: str) -> dict[str, Any]:
        """Empty a pool now and keep it empty: what was destroyed and what failed."""
        ...

    # -- for the service --------------------------------------------------------------------

    def acting_as(self, actor: str, tenant: str | None = None) -> Transport:
        """This transport, recording each operation as done by `actor` (`tenant`: theirs only)."""
        ...

    async def list_page(self, *, state: str | None, backend: str | None,
                        labels: Mapping[str, str] | None, include_destroyed: bool,
                        limit: int | None, cursor: str | None,
                        ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of `list` and the cursor of the next (None on the last)."""
        ...

    async def create_idempotent(self, key: str, caller: str, profile: str | Profile, *,
                                ttl: timedelta | None, name: str | None,
                                labels: Mapping[str, str] | None, owner: str | None,
                                task: str | None) -> dict[str, Any]:
        """`create` once per (`caller`, `key`): a retry gets the first call's sandbox."""
        ...

    async def create_api_key(self, scope: str, owner: str | None,
                             quotas: Mapping[str, Any] | None = None,
                             ) -> tuple[dict[str, Any], str]:
        """A new key of the service: (its record, the key itself, shown only here)."""
        ...

    async def api_keys(self) -> list[dict[str, Any]]:
        """The service's keys' records (revoked ones too), never the keys."""
        ...

    async def revoke_api_key(self, key_id: str) -> dict[str, Any]:
        """Revoke a key by id (already revoked counts as done): its record."""
        ...

    async def authenticate(self, token: str) -> dict[str, Any] | None:
        """The record of the key `token` if it is one not revoked, else None."""
        ...

    async def usable_api_keys(self) -> int:
        """How many keys are not revoked."""
        ...

    async def sandbox_counts(self) -> list[dict[str, Any]]:
        """How many sandboxes are in each state on each backend."""
        ...

    async def ready(self) -> dict[str, Any]:
        """The database answers with the current schema (Unavailable otherwise)."""
        ...

    async def current_metrics(self, timeout: timedelta | None = None) -> list[dict[str, Any]]:
        """One live reading of every running sandbox whose backend reports metrics."""
        ...

    async def mark_traffic(self, ref: str) -> None:
        """Traffic reached the sandbox through the service's proxy: activity now, no event."""
        ...

    async def record_port_link(self, ref: str, port: int, expires_at: datetime) -> None:
        """A signed preview link to `port` was handed out: its event (never the link)."""
        ...

    async def record_mcp_call(self, tool: str, ref: str | None) -> None:
        """An MCP tool call without an event of its own: `mcp.call`."""
        ...

    async def list_json(self, *, state: str | None, backend: str | None,
                        labels: Mapping[str, str] | None, include_destroyed: bool) -> bytes:
        """`list()`'s views as one JSON document (core/rules/views.py encode_list)."""
        ...

    # `list` comes last: a method of that name hides the builtin from the annotations below it
    # (for a type checker), so none is below it.

    async def list(self, *, state: str | None, backend: str | None,
                   labels: Mapping[str, str] | None,
                   include_destroyed: bool) -> list[dict[str, Any]]:
        """Every sandbox's view that passes the filters, oldest first."""
        ...


def operations(protocol: type = Transport) -> list[str]:
    """The names of the contract's operations (for the contract's test and ActingTransport)."""
    return sorted(name for name, member in vars(protocol).items()
                  if not name.startswith("_") and callable(member))
