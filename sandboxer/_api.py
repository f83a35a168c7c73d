"""The one implementation of the library: `AsyncSandboxer` and its handles. The sync API
(`sandboxer._sync`) is made from these classes, not written again."""

from __future__ import annotations

import contextlib
import os
import posixpath
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, overload

from sandboxer._records import (
    BackendStatus,
    CheckpointRecord,
    Event,
    ExecExit,
    ExecResult,
    FileTransfer,
    InventoryChange,
    MetricSample,
    OutputChunk,
    PoolInfo,
    ProfileInfo,
    ReapReport,
    SandboxRecord,
    VolumeRecord,
    building_many,
)

if TYPE_CHECKING:
    import asyncio

    from sandboxer._files import AsyncFiles
    from sandboxer._processes import AsyncProcesses
    from sandboxer._terminals import AsyncTerminal
    from sandboxer._transport import Transport
    from sandboxer.core.rules.errors import SbxError as Error
    from sandboxer.core.rules.profiles import Profile

Duration = timedelta | str | int | float


@overload
def _duration(value: Duration, what: str) -> timedelta: ...
@overload
def _duration(value: Duration | None, what: str) -> timedelta | None: ...
def _duration(value: Duration | None, what: str) -> timedelta | None:
    """A timedelta, a duration such as "30m", or seconds; BadInput naming `what` otherwise."""
    if value is None or isinstance(value, timedelta):
        if isinstance(value, timedelta) and value <= timedelta(0):
            from sandboxer.core.rules.errors import BadInput

            raise BadInput(f"bad {what} {value}: must be longer than zero")
        return value
    if isinstance(value, bool):
        value = str(value)
    if isinstance(value, int | float):
        try:
            delta = timedelta(seconds=value)
        except (OverflowError, ValueError):  # past timedelta's range, or not a number
            from sandboxer.core.rules.errors import BadInput

            raise BadInput(f"bad {what} {value}: give a duration such as 30m, or "
                           "seconds") from None
        return _duration(delta, what)
    from sandboxer.core.rules.durations import parse_duration

    return parse_duration(str(value), what)


def _argv(argv: Sequence[str] | str) -> list[str]:
    from sandboxer.core.rules.errors import BadInput

    if isinstance(argv, str):  # a string would become one argument per character
        raise BadInput("argv must be a list of strings, e.g. ['sh', '-c', 'echo hi']")
    argv = list(argv)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise BadInput("argv must be a non-empty list of strings")
    return argv


async def _exec_options(env: Mapping[str, str] | None, cwd: str | None, user: str | None,
                        stdin: bytes | str | BinaryIO | None) -> dict[str, Any]:
    """exec's options as the transport takes them (only those given): text stdin as UTF-8,
    a file object read off the loop."""
    options: dict[str, Any] = {}
    if env is not None:
        options["env"] = dict(env)
    if cwd is not None:
        options["cwd"] = cwd
    if user is not None:
        options["user"] = user
    if stdin is not None:
        if isinstance(stdin, str):
            stdin = stdin.encode()
        elif not isinstance(stdin, bytes | bytearray | memoryview):
            read = getattr(stdin, "read", None)
            if read is None:
                from sandboxer.core.rules.errors import BadInput

                raise BadInput("stdin must be bytes, text or a binary file object, not "
                               f"{type(stdin).__name__}")
            import asyncio

            data = await asyncio.to_thread(read)
            stdin = data.encode() if isinstance(data, str) else data
        options["stdin"] = bytes(stdin)
    return options


class AsyncSandboxer:
    """sbx from a program. `home` and `database_url` default as the CLI's (`SBX_HOME`,
    `SBX_DATABASE_URL`, the settings file); `actor` is who the event log says acted
    (default `SBX_ACTOR`, else user@host). With `url` (and `token`, an API key) instead, a
    client of an `sbx serve` there (docs/service.md): the same handles and errors.

        async with AsyncSandboxer() as sbx:
            async with sbx.create("default", ttl="10m") as box:
                result = await box.exec(["sh", "-c", "echo hello"])
    """

    def __init__(self, home: str | Path | None = None, database_url: str | None = None,
                 actor: str | None = None, *, url: str | None = None,
                 token: str | None = None, _transport: Transport | None = None) -> None:
        if _transport is None and url is not None:
            if home is not None or database_url is not None or actor is not None:
                from sandboxer.core.rules.errors import BadInput

                raise BadInput("a client of a service (url=) has no home, database_url or "
                               "actor of its own: the service's key owner is the actor")
            from sandboxer._remote import RemoteTransport

            _transport = RemoteTransport(url, token=token)
        if _transport is None:
            from sandboxer._local import LocalTransport

            _transport = LocalTransport(home=None if home is None else str(home),
                                        database_url=database_url, actor=actor)
        self._transport: Transport = _transport

    async def __aenter__(self) -> AsyncSandboxer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the database and the backends' connections. Sandboxes keep running."""
        await self._transport.close()

    # -- sandboxes --------------------------------------------------------------------------

    def create(self, profile: str | Profile = "default", *, ttl: Duration | None = None,
               name: str | None = None, labels: Mapping[str, str] | None = None,
               owner: str | None = None, task: str | None = None,
               volumes: Sequence[Mapping[str, Any]] | None = None) -> _Creating:
        """A new sandbox from a profile (a name on the search path, or a `Profile`).
        Await it for the sandbox; or `async with sbx.create(...) as box:` to destroy it on
        leaving, on an exception too. `volumes`: mounts ({"name", "path", "read_only"}) of
        volumes made with `create_volume`, beside the profile's own."""
        async def make() -> AsyncSandbox:
            view = await self._transport.create(
                profile, ttl=_duration(ttl, "ttl"), name=name,
                labels=dict(labels) if labels else None, owner=owner, task=task,
                **({"volumes": [dict(v) for v in volumes]} if volumes else {}))
            return AsyncSandbox(self, view)

        return _Creating(make)

    async def get(self, ref: str) -> AsyncSandbox:
        """A sandbox by id, unique id prefix or name, as the CLI takes them."""
        return AsyncSandbox(self, await self._transport.get(ref))

    async def destroy(self, *refs: str) -> dict[str, list[Any]]:
        """Destroy several sandboxes; one failure does not stop the others. Every ref is
        resolved before any is touched (NotFound before anything is destroyed). The outcome:
        `{"destroyed": [ids], "already_destroyed": [ids], "failed": [{"id", "code", "kind",
        "error"}]}`."""
        return await self._transport.destroy_many(list(refs))

    # -- the reaper -------------------------------------------------------------------------

    async def reap(self, dry_run: bool = False, *, orphans: bool = False,
                   timeout: Duration | None = None) -> ReapReport:
        """One cycle of reconcile, then destroy what is past its deadline or idle limit
        (`sbx reap`). `orphans`: also this installation's backend objects past their hard
        deadline label, with no database at all."""
        return ReapReport.from_dict(await self._transport.reap(
            dry_run=dry_run, orphans=orphans, timeout=_duration(timeout, "timeout")))

    async def run_reaper(self, every: Duration, *, stop: asyncio.Event | None = None,
                         on_report: Callable[[ReapReport | Error], None] | None = None,
                         timeout: Duration | None = None, orphans: bool = False,
                         deliver: bool = True,
                         on_delivery: Callable[[list[dict[str, Any]]], None] | None = None,
                         ) -> None:
        """Reap (and deliver events) every `every` until `stop` is set (`sbx reap --every`,
        the service's timer). A failed cycle is reported to `on_report` and the next one
        tries again; each delivery's reports (`deliver_events()`) go to `on_delivery`."""
        import asyncio

        from sandboxer.core.rules.errors import as_error

        interval = _duration(every, "every")
        stop = stop or asyncio.Event()
        while not stop.is_set():
            try:
                report: ReapReport | Error = await self.reap(orphans=orphans, timeout=timeout)
            except Exception as exc:
                report = as_error(exc)
            if on_report is not None:
                on_report(report)
            if deliver:
                try:
                    sinks = await self.deliver_events()
                except Exception as exc:  # the database, say: the next cycle tries again
                    sinks = []
                    if on_report is not None:
                        on_report(as_error(exc))
                if on_delivery is not None:
                    on_delivery(sinks)
                for sink in sinks:
                    if sink["error"] and on_report is not None:
                        from sandboxer.core.rules.errors import OperationFailed

                        on_report(OperationFailed(f"delivery to {sink['sink']}: "
                                                  f"{sink['error']}"))
            try:
                await asyncio.wait_for(stop.wait(), interval.total_seconds())
            except TimeoutError:
                pass

    async def reconcile(self, dry_run: bool = False) -> ReapReport:
        """Diff the backends with the database and repair, destroying nothing that is due
        (`sbx reconcile`)."""
        return ReapReport.from_dict(await self._transport.reap(
            dry_run=dry_run, orphans=False, reap=False))

    # -- profiles ---------------------------------------------------------------------------

    async def profiles(self) -> list[ProfileInfo]:
        """Every profile on the search path: name, backend, description, the file it came
        from, and why it cannot be used if it cannot."""
        return [ProfileInfo(**d) for d in await self._transport.profiles()]

    async def profile(self, name: str) -> Profile:
        """A profile on the search path, resolved (after `extends`)."""
        return await self._transport.profile(name)

    async def check_profile(self, profile: Profile | Mapping[str, Any]) -> Profile:
        """`profile` (or a profile document) as create would take it, or the error create
        would give, its backend's rules included; nothing is made or read."""
        return await self._transport.check_profile(profile)

    # -- events -----------------------------------------------------------------------------

    async def events(self, sandbox: str | None = None,
                     since: datetime | timedelta | None = None,
                     after: int | None = None) -> list[Event]:
        """Events, oldest first: of one sandbox, from a time (or a while ago), after an
        event id."""
        ref = sandbox.id if isinstance(sandbox, SandboxRecord) else sandbox
        return [Event.from_dict(d) for d in await self._transport.events(ref, since, after)]

    async def follow_events(self, sandbox: str | None = None, after: int | None = None,
                            every: float = 0.5) -> AsyncIterator[Event]:
        """New events as they are written (by any process), forever. From `after` (an
        event id), else from now."""
        ref = sandbox.id if isinstance(sandbox, SandboxRecord) else sandbox
        async for doc in self._transport.follow_events(ref, after, every):
            yield Event.from_dict(doc)

    async def verify_events(self) -> dict[str, Any]:
        """The hash chain's check: `{"checked", "intact", "broken_at", "problem"}`."""
        return await self._transport.verify_events()

    async def deliver_events(self) -> list[dict[str, Any]]:
        """Push pending events to the sinks now (`sbx events deliver`)."""
        return await self._transport.deliver_events()

    async def undelivered(self) -> list[dict[str, Any]]:
        return await self._transport.undelivered()

    async def redeliver(self, event_ids: Sequence[int] | None = None) -> list[dict[str, Any]]:
        return await self._transport.redeliver(event_ids)

    # -- checkpoints ------------------------------------------------------------------------

    async def checkpoint(self, ref: str) -> AsyncCheckpoint:
        """A checkpoint by id, unique id prefix or name."""
        return AsyncCheckpoint(self, await self._transport.checkpoint(ref))

    async def checkpoints(self, sandbox: str | None = None) -> list[AsyncCheckpoint]:
        """Checkpoints, oldest first (of one sandbox)."""
        ref = sandbox.id if isinstance(sandbox, SandboxRecord) else sandbox
        return [AsyncCheckpoint(self, v) for v in await self._transport.checkpoints(ref)]

    async def import_checkpoint(self, path: str | Path, *,
                                name: str | None = None) -> AsyncCheckpoint:
        """A checkpoint archive made by `export` (on this host or another)."""
        return AsyncCheckpoint(self, await self._transport.import_checkpoint(str(path), name))

    async def prune_checkpoints(self) -> list[str]:
        """Remove expired checkpoints and those past each profile's `keep`."""
        return await self._transport.prune_checkpoints()

    # -- volumes (docs/volumes.md) -----------------------------------------------------------

    async def create_volume(self, name: str, *, backend: str | None = None,
                            labels: Mapping[str, str] | None = None,
                            ttl: Duration | None = None, shared: bool = False,
                            owner: str | None = None) -> VolumeRecord:
        """An empty volume that outlives sandboxes; a profile's `volumes:` mounts it.
        `ttl`: removed once past it (never while a live sandbox mounts it); `shared`: more
        than one sandbox may mount it read-write at once."""
        return VolumeRecord(await self._transport.create_volume(
            name, backend=backend, labels=dict(labels) if labels else None,
            ttl=_duration(ttl, "ttl"), shared=shared, owner=owner))

    async def volume(self, ref: str) -> VolumeRecord:
        """A volume by id or name, its size asked of the backend now."""
        return VolumeRecord(await self._transport.volume(ref))

    async def volumes(self) -> list[VolumeRecord]:
        """Volumes, oldest first."""
        return [VolumeRecord(v) for v in await self._transport.volumes()]

    async def remove_volume(self, ref: str) -> VolumeRecord:
        """Remove a volume and what it holds (Conflict while a live sandbox mounts it)."""
        return VolumeRecord(await self._transport.remove_volume(ref))

    async def put_volume_tree(self, ref: str, path: str,
                              tar: bytes | BinaryIO | AsyncIterator[bytes]) -> FileTransfer:
        """Unpack a tar stream into the folder `path` of a volume (/ is its root), without
        a sandbox."""
        from sandboxer._files import _chunks

        doc = await self._transport.put_volume_tree(ref, path, _chunks(tar))
        return FileTransfer.from_dict(doc)

    async def upload_to_volume(self, ref: str, local: Path | str, path: str = "/"
                               ) -> FileTransfer:
        """A local file or folder into the folder `path` of a volume, under its own name."""
        from sandboxer._files import _tree_chunks
        from sandboxer.core.rules.errors import BadInput

        source = Path(os.path.abspath(local))
        if not source.exists():
            raise BadInput(f"{source} does not exist")
        doc = await self._transport.put_volume_tree(ref, path, _tree_chunks(source))
        return FileTransfer.from_dict(doc)

    async def get_volume_tree(self, ref: str, path: str) -> AsyncIterator[bytes]:
        """A file or folder of a volume as a tar stream whose one top entry is its base
        name, as it comes; untrusted (`download_from_volume` unpacks it safely)."""
        async with contextlib.aclosing(self._transport.get_volume_tree(ref, path)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def download_from_volume(self, ref: str, path: str, local: Path | str) -> Path:
        """A file or folder of a volume into the local folder `local`, under its own name,
        unpacked as `files.download` unpacks (nothing lands outside it): the path made."""
        import shutil
        import tempfile

        from sandboxer._files import _extract
        from sandboxer.core.rules.errors import BadInput

        name = posixpath.basename(posixpath.normpath(path)) if isinstance(path, str) else ""
        dest = Path(local)
        if not name or name in (".", ".."):
            raise BadInput(f"path {path!r}: name a file or folder in the volume, not its root")
        if not dest.is_dir():
            raise BadInput(f"{dest} is not a folder on this machine")
        final = dest / name
        if final.exists() or final.is_symlink():
            raise BadInput(f"{final} exists: download into another folder")
        staging = Path(tempfile.mkdtemp(prefix=".sbx-download-", dir=dest))
        try:
            await _extract(self.get_volume_tree(ref, path), staging, top=name)
            (staging / name).rename(final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return final

    # -- health and the store ---------------------------------------------------------------

    async def doctor(self) -> dict[str, Any]:
        """Backends, the database and versions, as `sbx doctor --json` prints them."""
        return await self._transport.doctor()

    async def follow_all_metrics(self, every: Duration | None = None,
                                 ) -> AsyncIterator[MetricSample]:
        """Samples of every running sandbox, as they come (each stored at a bounded rate).
        `every` (default 5s): how often the running ones are looked for."""
        async for doc in self._transport.follow_all_metrics(_duration(every, "every")):
            yield MetricSample.from_dict(doc)

    async def copy_database(self, target_url: str) -> dict[str, Any]:
        """Copy the whole inventory into another, empty database (`sbx db copy`)."""
        return await self._transport.copy_database(target_url)

    # -- watching (a long-running front end: the dashboard) ---------------------------------

    def watch(self, *, include_destroyed: bool = False,
              every: float = 1.0) -> AsyncInventoryWatch:
        """The inventory as it changes, by any process: `await watch.read()` for what
        changed since the previous read, or `async for change in watch` (every `every`
        seconds; only reads that found a change, after a first one with everything). A
        read costs nothing when nobody committed since the last one, and otherwise reads
        only the sandboxes changed since (docs/design.md, "Watching the inventory")."""
        return AsyncInventoryWatch(self, include_destroyed, every)

    async def backends(self, names: Sequence[str] | None = None, *, check: bool = True,
                       timeout: float = 5.0) -> list[BackendStatus]:
        """Each backend (`names`, default every registered one) as this client reaches it:
        loaded, a test double, its capabilities, and with `check` its health (one that does
        not answer within `timeout` seconds is unreachable). Never raises for a backend."""
        docs = await self._transport.backends(None if names is None else list(names),
                                              check=check, timeout=timeout)
        return [BackendStatus.from_dict(d) for d in docs]

    async def recent_metrics(self, since: datetime | timedelta) -> list[MetricSample]:
        """Stored samples of every sandbox since `since` (a time, or a while ago), oldest
        first, in one read."""
        return [MetricSample.from_dict(d) for d in await self._transport.recent_metrics(since)]


    # -- what a service needs (docs/service.md) ---------------------------------------------

    def acting_as(self, actor: str, *, tenant: bool | str = False) -> AsyncSandboxer:
        """A client sharing this one's database, backends and loop whose operations the
        event log records as done by `actor` (and whose creates default to that owner). With
        `tenant=True` it sees and acts on `actor`'s own sandboxes, checkpoints and events
        only; another owner's are not found (docs/security.md, "Tenants"). `tenant` may name
        the owner instead, when the actor says more than who owns (an MCP client acting for
        a key's owner: docs/mcp.md). Each call carries its own actor, so concurrent callers
        acting as different actors never mix. Closing it leaves this client open."""
        from sandboxer.core.rules.errors import BadInput

        if not isinstance(actor, str) or not actor.strip():
            raise BadInput("acting_as needs the actor's name")
        if isinstance(tenant, str) and not tenant.strip():
            raise BadInput("acting_as: tenant names an owner, or is True or False")
        owner = tenant if isinstance(tenant, str) else (actor if tenant else None)
        return AsyncSandboxer(_transport=self._transport.acting_as(actor, owner))

    async def list_page(self, *, state: str | None = None, backend: str | None = None,
                        labels: Mapping[str, str] | None = None,
                        include_destroyed: bool = False, limit: int | None = None,
                        cursor: str | None = None) -> tuple[list[AsyncSandbox], str | None]:
        """One page of `list()` (at most `limit`, default 100, up to 1000): the sandboxes and
        the cursor of the next page (None on the last). Pages stay in order while sandboxes
        are created (new ones come last)."""
        views, following = await self._transport.list_page(
            **_narrowing(state, backend, labels, include_destroyed), limit=limit, cursor=cursor)
        return [AsyncSandbox(self, v) for v in views], following

    async def create_idempotent(self, key: str, profile: str | Profile = "default", *,
                                caller: str = "local", ttl: Duration | None = None,
                                name: str | None = None,
                                labels: Mapping[str, str] | None = None,
                                owner: str | None = None,
                                task: str | None = None) -> AsyncSandbox:
        """`create()` under an idempotency key: the first call with `key` (of `caller`)
        makes the sandbox; a retry with the same key and arguments gets that sandbox, after
        a restart too. The same key with other arguments is BadInput; while the first call
        is still running, Conflict."""
        view = await self._transport.create_idempotent(
            key, caller, profile, ttl=_duration(ttl, "ttl"), name=name,
            labels=dict(labels) if labels else None, owner=owner, task=task)
        return AsyncSandbox(self, view)

    async def create_api_key(self, scope: str, *, owner: str | None = None,
                             max_sandboxes: int | None = None,
                             max_ttl: Duration | None = None,
                             max_execs: int | None = None) -> tuple[dict[str, Any], str]:
        """A key of the HTTP service with `scope` (read, write, admin) for `owner` (default:
        the actor): (its record, the key). The key is shown only here; only its hash is kept.
        `max_sandboxes` (live at once), `max_ttl` and `max_execs` (commands at once) set the
        owner's quotas, which bind every key of that owner (docs/security.md, "Tenants")."""
        longest = _duration(max_ttl, "max_ttl")
        quotas = {"max_sandboxes": max_sandboxes, "max_execs": max_execs,
                  "max_ttl_s": None if longest is None else int(longest.total_seconds())}
        quotas = {k: v for k, v in quotas.items() if v is not None}
        if quotas:
            return await self._transport.create_api_key(scope, owner, quotas)
        return await self._transport.create_api_key(scope, owner)

    async def api_keys(self) -> list[dict[str, Any]]:
        """The service's keys (revoked ones too), never the keys themselves."""
        return await self._transport.api_keys()

    async def revoke_api_key(self, key_id: str) -> dict[str, Any]:
        """Revoke a key by id; already revoked counts as done."""
        return await self._transport.revoke_api_key(key_id)

    async def authenticate(self, token: str) -> dict[str, Any] | None:
        """The record of the key `token` when it is one that is not revoked, else None."""
        return await self._transport.authenticate(token)

    async def usable_api_keys(self) -> int:
        """How many keys are not revoked."""
        return await self._transport.usable_api_keys()

    async def sandbox_counts(self) -> list[dict[str, Any]]:
        """How many sandboxes are in each state on each backend: `[{"state", "backend",
        "count"}]`, destroyed ones included."""
        return await self._transport.sandbox_counts()

    async def ready(self) -> dict[str, Any]:
        """The database answers with the current schema (Unavailable otherwise)."""
        return await self._transport.ready()

    async def current_metrics(self, timeout: Duration | None = None) -> list[dict[str, Any]]:
        """One live reading of every running sandbox whose backend reports metrics, read at
        once (`sbx metrics --all --format prometheus`): each a MetricSample's fields with the
        sandbox's `name`, `backend`, `profile`, `backend_ref` and `started_at`. A sandbox
        with no reading within `timeout` (default 10s) is left out. Sent over OTLP too when
        that is configured (docs/telemetry.md)."""
        return await self._transport.current_metrics(_duration(timeout, "timeout"))

    async def mark_traffic(self, ref: str) -> None:
        """Traffic reached the sandbox `ref` through a service's proxy: its idle clock starts
        again, with no event (a proxy calls this at most about once a second a sandbox).
        Conflict when it is neither running nor paused."""
        await self._transport.mark_traffic(ref)

    async def record_port_link(self, ref: str, port: int, expires_at: datetime) -> None:
        """Record that a signed preview link to the running sandbox's `port`, valid until
        `expires_at`, was handed out (`sandbox.port.link`; the link itself never is)."""
        await self._transport.record_port_link(ref, port, expires_at)

    async def record_mcp_call(self, tool: str, sandbox: str | None = None) -> None:
        """Record an MCP tool call that records no event of its own (a listing, a look at a
        process): `mcp.call` with the tool's name, of `sandbox` if it named one, as this
        client's actor (docs/mcp.md). A client of a service refuses: its /mcp records them."""
        await self._transport.record_mcp_call(tool, sandbox)
    # -- warm pools (docs/pools.md) ---------------------------------------------------------

    async def pools(self) -> list[PoolInfo]:
        """This installation's warm pools: every profile on the search path that declares
        `pool:`, and any pool with members left (`sbx pool ls`)."""
        return [PoolInfo(d) for d in await self._transport.pools()]

    async def set_pool_size(self, profile: str, size: int) -> PoolInfo:
        """Keep `size` warm members of `profile` (a name on the search path that declares a
        pool), whatever its file says, until set again (`sbx pool set`). The pool is filled
        or shrunk before this returns; a member that cannot be made raises, the size kept."""
        return PoolInfo(await self._transport.set_pool_size(profile, size))

    async def drain_pool(self, profile: str) -> dict[str, Any]:
        """Empty the pool of `profile` now and keep it empty (its size becomes 0 until
        `set_pool_size`): `{"profile", "destroyed": [ids], "failed": [{"id", "code", "kind",
        "error"}]}` (`sbx pool drain`)."""
        return await self._transport.drain_pool(profile)

    async def list_json(self, *, state: str | None = None, backend: str | None = None,
                        labels: Mapping[str, str] | None = None,
                        include_destroyed: bool = False) -> bytes:
        """`list()` as one JSON document, UTF-8: an array of the records' `to_dict()`s, one
        per line. What a front end prints or sends, without a record made per sandbox: over
        a listing kept between reads, each sandbox's document is encoded once, when it
        changed (`sbx ls --json`)."""
        return await self._transport.list_json(
            **_narrowing(state, backend, labels, include_destroyed))

    # `list` comes last: a method of that name hides the builtin from the annotations below it
    # (for a type checker), so none is below it.

    async def list(self, *, state: str | None = None, backend: str | None = None,
                   labels: Mapping[str, str] | None = None,
                   include_destroyed: bool = False) -> list[AsyncSandbox]:
        """Sandboxes, oldest first; destroyed ones only with `include_destroyed` (or a
        `state`). `labels`: only those carrying all of them."""
        with building_many():
            views = await self._transport.list(
                **_narrowing(state, backend, labels, include_destroyed))
            return [AsyncSandbox(self, v) for v in views]


def _narrowing(state: str | None, backend: str | None, labels: Mapping[str, str] | None,
               include_destroyed: bool) -> dict[str, Any]:
    """A listing's filters as the transport contract takes them."""
    return dict(state=None if state is None else str(state), backend=backend,
                labels=dict(labels) if labels else None, include_destroyed=include_destroyed)


class _Creating:
    """What `AsyncSandboxer.create` returns: await it, or use it as `async with`."""

    def __init__(self, make: Callable[[], Awaitable[AsyncSandbox]]) -> None:
        self._make = make
        self._box: AsyncSandbox | None = None

    def __await__(self) -> Generator[Any, None, AsyncSandbox]:
        return self._make().__await__()

    async def __aenter__(self) -> AsyncSandbox:
        self._box = await self._make()
        return self._box

    async def __aexit__(self, *exc: object) -> None:
        if self._box is not None:
            await self._box.destroy()


class AsyncSandbox(SandboxRecord):
    """A handle on one sandbox: its record (as of the last read) and what you can do."""

    __slots__ = ("_client",)

    def __init__(self, client: AsyncSandboxer, view: Mapping[str, Any]) -> None:
        super().__init__(view)
        self._client = client

    @property
    def _t(self) -> Transport:
        return self._client._transport

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.destroy()

    async def refresh(self) -> AsyncSandbox:
        """Read the record again."""
        self._replace(await self._t.get(self.id))
        return self

    async def profile_resolved(self) -> dict[str, Any]:
        """The resolved profile this sandbox was made from (secrets as references)."""
        view = await self._t.get(self.id, with_profile=True)
        resolved = view.pop("profile_resolved")
        self._replace(view)
        return resolved

    async def exec(self, argv: Sequence[str], timeout: Duration | None = None, *,
                   env: Mapping[str, str] | None = None, cwd: str | None = None,
                   user: str | None = None, stdin: bytes | str | BinaryIO | None = None,
                   ) -> ExecResult:
        """Run a command and wait for it; its output, exit code and duration (on a timeout,
        the output produced until then, `timed_out` True and exit code 124). `env`:
        variables for this command only (secrets: the event log records their names, never
        their values); `cwd`: an absolute folder to run in; `user`: whom to run as (needs a
        backend with `run-as-user`); `stdin`: bytes, text or a binary file object, read and
        written to the command's input, then closed. Recorded in the event log (argv, exit
        code, duration, output and stdin digests; never the output)."""
        doc = await self._t.exec(self.id, _argv(argv), _duration(timeout, "timeout"),
                                 **await _exec_options(env, cwd, user, stdin))
        return ExecResult.from_dict(doc)

    async def exec_stream(self, argv: Sequence[str], timeout: Duration | None = None, *,
                          env: Mapping[str, str] | None = None, cwd: str | None = None,
                          user: str | None = None, stdin: bytes | str | BinaryIO | None = None,
                          ) -> AsyncIterator[OutputChunk | ExecExit]:
        """Run a command: its stdout and stderr as they come (`OutputChunk`), then how it
        ended (`ExecExit`). The options are `exec`'s."""
        options = await _exec_options(env, cwd, user, stdin)
        async for kind, value in self._t.exec_stream(self.id, _argv(argv),
                                                     _duration(timeout, "timeout"), **options):
            if kind == "exit":
                yield ExecExit(value["exit_code"], timedelta(seconds=value["duration"]),
                               bool(value.get("timed_out")))
            else:
                yield OutputChunk("stderr" if kind == "stderr" else "stdout", value)

    @property
    def files(self) -> AsyncFiles:
        """Its files: write, read, list, upload and download trees (docs/api.md, "Files")."""
        from sandboxer._files import AsyncFiles

        return AsyncFiles(self)

    async def pty(self, argv: Sequence[str] | None = None, *, cols: int = 80, rows: int = 24,
                  env: Mapping[str, str] | None = None, cwd: str | None = None,
                  ) -> AsyncTerminal:
        """Start `argv` (a login shell: bash if the sandbox has it, else sh) on a new
        terminal of `cols` x `rows` (TERM=xterm-256color unless `env` names one), and return
        the session: write, read, resize, close (docs/terminals-and-ports.md, "Terminals").
        A backend without terminals refuses (Conflict, exit 4)."""
        from sandboxer._terminals import AsyncTerminal

        view = await self._t.open_pty(self.id, None if argv is None else _argv(argv),
                                      cols=cols, rows=rows, env=env, cwd=cwd)
        return AsyncTerminal(self, view)

    async def terminal(self, session: str, offset: int = 0) -> AsyncTerminal:
        """An open terminal session again, by its id (from any client), reading its output
        from `offset` (what is still kept of it)."""
        from sandboxer._terminals import AsyncTerminal

        return AsyncTerminal(self, await self._t.get_pty(self.id, session), offset)

    @property
    def processes(self) -> AsyncProcesses:
        """Its background processes: start, list, get (docs/api.md, "Background processes")."""
        from sandboxer._processes import AsyncProcesses

        return AsyncProcesses(self)

    async def url(self, port: int) -> str:
        """Where its TCP `port` is reached from here, e.g. "http://127.0.0.1:49153": on Docker
        a port of the profile's `ports:` published on loopback; E2B's host; Modal's tunnel
        (docs/terminals-and-ports.md, "Ports"). NotFound when the port is not published."""
        return str((await self._t.port_url(self.id, port))["url"])

    async def ports(self) -> dict[int, str]:
        """Its published ports: port inside the sandbox -> URL."""
        return {int(v["port"]): str(v["url"]) for v in await self._t.port_urls(self.id)}

    async def expose(self, port: int) -> str:
        """Make `port` reachable while it runs, where the backend can (E2B, Modal): its URL.
        Docker publishes only at create: Conflict naming the profile's `ports:`."""
        return str((await self._t.expose_port(self.id, port))["url"])

    async def logs(self, *, follow: bool = False, tail: int | None = None,
                   ) -> AsyncIterator[bytes]:
        """The main process's output; with `follow`, new output as it comes (that counts
        as activity)."""
        async for chunk in self._t.logs(self.id, follow=follow, tail=tail):
            yield chunk

    async def extend(self, by: Duration) -> bool:
        """Move the deadline `by` later, never past the hard deadline; True when that capped
        it. The record is updated."""
        view, capped = await self._t.extend(self.id, _duration(by, "by"))
        self._replace(view)
        return capped

    async def touch(self) -> None:
        """Record activity now: the idle clock starts again."""
        self._replace(await self._t.touch(self.id))

    async def pause(self) -> None:
        """Freeze it (no CPU); its deadline still holds."""
        self._replace(await self._t.pause(self.id))

    async def resume(self) -> None:
        self._replace(await self._t.resume(self.id))

    async def snapshot(self, name: str | None = None) -> AsyncCheckpoint:
        """Save its filesystem as a checkpoint."""
        return AsyncCheckpoint(self._client, await self._t.snapshot(self.id, name))

    async def destroy(self) -> bool:
        """Destroy it; already destroyed counts as done. True when this call destroyed it,
        False when it was destroyed already (by anyone, the reaper included)."""
        view, done = await self._t.destroy(self.id)
        self._replace(view)
        return done

    async def metrics(self) -> MetricSample | None:
        """A live reading from the backend (None: no sample yet)."""
        doc = await self._t.metrics(self.id)
        return None if doc is None else MetricSample.from_dict(doc)

    async def follow_metrics(self) -> AsyncIterator[MetricSample]:
        """Live readings as the backend sends them (about one a second on Docker)."""
        async for doc in self._t.follow_metrics(self.id):
            yield MetricSample.from_dict(doc)

    async def metric_history(self) -> list[MetricSample]:
        """The stored readings, oldest first."""
        return [MetricSample.from_dict(d) for d in await self._t.metric_history(self.id)]

    async def events(self) -> list[Event]:
        return await self._client.events(self.id)

    async def checkpoints(self) -> list[AsyncCheckpoint]:
        return await self._client.checkpoints(self.id)

    async def evidence(self, path: str | Path | None = None, sign: str | Path | None = None,
                       *, by_service: bool = False) -> dict[str, Any]:
        """The supervision evidence bundle; written to `path` (mode 0600) when given. With
        `sign` (an ed25519 private key file, `generate_keys`), signed here: a DSSE envelope
        of an in-toto Statement (docs/evidence.md). With `by_service`, a client of a service
        gets it signed by the service's own key (`sbx serve --evidence-key`)."""
        if sign is not None and by_service:
            from sandboxer.core.rules.errors import BadInput

            raise BadInput("sign with your key or the service's, not both")
        bundle = await (self._t.evidence(self.id, signed=True) if by_service
                        else self._t.evidence(self.id))
        if sign is not None:
            from sandboxer.core.observe.signing import sign as sign_bundle

            bundle = sign_bundle(bundle, sign)
        if path is not None:
            import json
            import os

            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump(bundle, out, indent=1, sort_keys=True)
        return bundle

    async def origin(self) -> str | None:
        """The id of the checkpoint this sandbox was restored from (None: made from a
        profile). That checkpoint may since have been removed."""
        return await self._t.origin(self.id)

    async def shell_command(self) -> list[str]:
        """The command line that opens an interactive shell in it, for a program to hand a
        terminal to (on Docker, `docker --host ENGINE exec -it REF sh`). Conflict when it is
        not running or its backend offers none here (capability `shell`)."""
        return await self._t.shell_command(self.id)


class AsyncCheckpoint(CheckpointRecord):
    """A handle on one checkpoint."""

    __slots__ = ("_client",)

    def __init__(self, client: AsyncSandboxer, view: Mapping[str, Any]) -> None:
        super().__init__(view)
        self._client = client

    @property
    def _t(self) -> Transport:
        return self._client._transport

    async def refresh(self) -> AsyncCheckpoint:
        self._replace(await self._t.checkpoint(self.id))
        return self

    async def restore(self, *, ttl: Duration | None = None, name: str | None = None,
                      labels: Mapping[str, str] | None = None, owner: str | None = None,
                      task: str | None = None,
                      profile: str | None = None) -> AsyncSandbox:
        """A new sandbox from this checkpoint, under the profile it was taken with, or the
        profile of this host named `profile`. An imported checkpoint always runs under a
        profile of this host (`profile`, else the one of the name it records): the profile
        inside an archive never supplies secrets, network, limits, TTL or command."""
        view = await self._t.restore(self.id, ttl=_duration(ttl, "ttl"), name=name,
                                     labels=dict(labels) if labels else None, owner=owner,
                                     task=task, profile=profile)
        return AsyncSandbox(self._client, view)

    async def fork(self, n: int, *, ttl: Duration | None = None,
                   labels: Mapping[str, str] | None = None, owner: str | None = None,
                   task: str | None = None) -> list[AsyncSandbox]:
        """`n` sandboxes from this checkpoint, each with its own copy of the filesystem.
        If one fails, those already made are destroyed and the error raised."""
        import asyncio

        from sandboxer.core.rules.errors import BadInput

        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise BadInput(f"fork needs a number of sandboxes of 1 or more, not {n!r}")
        results = await asyncio.gather(
            *(self.restore(ttl=ttl, labels=labels, owner=owner, task=task) for _ in range(n)),
            return_exceptions=True)
        made = [r for r in results if isinstance(r, AsyncSandbox)]
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            await asyncio.gather(*(box.destroy() for box in made), return_exceptions=True)
            raise failed[0]
        return made

    async def export(self, path: str | Path) -> Path:
        """Write it to a portable archive (.tar.gz, mode 0600)."""
        await self._t.export_checkpoint(self.id, str(path))
        return Path(path)

    async def remove(self) -> None:
        """Remove it and its backend artifact."""
        await self._t.remove_checkpoint(self.id)


class AsyncInventoryWatch:
    """What `AsyncSandboxer.watch()` returns: reads of the inventory that say what changed.
    `include_destroyed` may be changed between reads (the next read then tells the
    difference). Close it when done (or use `async with`)."""

    def __init__(self, client: AsyncSandboxer, include_destroyed: bool, every: float) -> None:
        self._client = client
        self._watch = client._transport.watch(include_destroyed)
        self.every = every
        self._boxes: dict[str, AsyncSandbox] = {}
        self._started = False
        self._closed = False

    @property
    def include_destroyed(self) -> bool:
        return self._watch.include_destroyed

    @include_destroyed.setter
    def include_destroyed(self, include: bool) -> None:
        self._watch.include_destroyed = bool(include)

    async def read(self) -> InventoryChange:
        """What changed since the previous read (the first: every sandbox, as added)."""
        from types import MappingProxyType

        delta = await self._watch.read()
        added = tuple(AsyncSandbox(self._client, v) for v in delta["added"])
        changed = tuple(AsyncSandbox(self._client, v) for v in delta["changed"])
        for box in added + changed:
            self._boxes[box.id] = box
        for sandbox_id in delta["removed"]:
            self._boxes.pop(sandbox_id, None)
        return InventoryChange(MappingProxyType(dict(self._boxes)), added, changed,
                               tuple(delta["removed"]))

    def __aiter__(self) -> AsyncInventoryWatch:
        return self

    async def __anext__(self) -> InventoryChange:
        import asyncio

        if self._closed:
            raise StopAsyncIteration
        if not self._started:
            self._started = True
            return await self.read()
        while True:
            await asyncio.sleep(self.every)
            if self._closed:
                raise StopAsyncIteration
            change = await self.read()
            if change:
                return change

    async def aclose(self) -> None:
        """Stop watching (its database connection is closed)."""
        self._closed = True
        await self._watch.close()

    async def __aenter__(self) -> AsyncInventoryWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
