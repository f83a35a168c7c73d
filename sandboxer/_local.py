"""The in-process transport: the core (its database and adapters) on an event loop of its
own, on a thread of its own.

The core's store is SQLite (or PostgreSQL) through a blocking driver. Running the core on
its own loop keeps the caller's loop free of that I/O whatever the caller does, and gives
the sync API the loop it runs on, so both APIs share one implementation. A call from the
caller's loop hops to the core loop and back: two thread wake-ups, about a millisecond on a
2-vCPU machine (docs/design.md, "The library"), which is why `sbx serve` adopts its own loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sandboxer.adapters.base import HOME_OVERRIDE
from sandboxer.core import api
from sandboxer.core.rules.errors import as_error
from sandboxer.core.rules.threads import BLOCKING_THREADS, ensure_thread_pool

if TYPE_CHECKING:
    from sandboxer._transport import Transport, Watch
    from sandboxer.core.follow.watch import InventoryMirror
    from sandboxer.core.lifecycle.manager import Manager
    from sandboxer.core.rules.profiles import Profile

T = TypeVar("T")


class CoreLoop:
    """An event loop running on a daemon thread until `stop()`; or, with `loop`, the
    caller's own running loop, adopted (no thread of its own, and `stop()` leaves it)."""

    def __init__(self, name: str = "sbx-core",
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.adopted = loop is not None
        self.loop = loop or asyncio.new_event_loop()
        ensure_thread_pool(self.loop, BLOCKING_THREADS)
        if loop is not None:
            self._thread = threading.current_thread()
            return
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def here(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, coro: Awaitable[T]) -> concurrent.futures.Future[T]:
        """`coro` on this loop; cancelling the future cancels it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        if self.adopted or self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if not self.here():
            self._thread.join()
            executor = self.loop._default_executor  # noqa: SLF001 (ours, made above)
            self.loop.close()
            if executor is not None:
                executor.shutdown(wait=False, cancel_futures=True)


class LocalTransport:
    """The core of this machine: its database (SQLite in `home`, or `database_url`) and the
    backends installed here. It implements the transport contract
    (`sandboxer._transport.Transport`); `_call` and `_stream` are how its operations reach
    the core loop."""

    def __init__(self, *, home: str | None = None, database_url: str | None = None,
                 actor: str | None = None, manager: Manager | None = None,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop  # the core on this running loop, not a thread: see docs/design.md
        self.home = None if home is None else str(home)
        self.database_url = database_url
        self.actor = actor
        self._mgr = manager
        self._core: CoreLoop | None = None
        self._lock = threading.Lock()
        self._closed = False
        # list()'s mirrors, by (owner, destroyed ones shown); None: listed once, none yet
        self._mirrors: dict[tuple[str | None, bool], InventoryMirror | None] = {}

    # -- running on the core loop -----------------------------------------------------------

    @property
    def core(self) -> CoreLoop:
        if self._closed:
            from sandboxer.core.rules.errors import Conflict

            raise Conflict("this Sandboxer is closed")
        if self._core is None:
            with self._lock:
                if self._core is None:
                    self._core = CoreLoop(loop=self._loop)
        return self._core

    def _manager(self) -> Manager:
        if self._mgr is None:
            from sandboxer.core.lifecycle.manager import Manager

            db = None
            if self.database_url is not None or self.home is not None:
                from sandboxer.core.rules import settings
                from sandboxer.core.store.db import Database

                db = Database(self.database_url or settings.database_url())
            from sandboxer.core.pools import WarmPools

            self._mgr = Manager(db=db, actor=self.actor, warm=WarmPools())
        return self._mgr

    async def _in_core(self, fn: Callable[..., Awaitable[T]] | Callable[..., T], *args: Any,
                       needs_manager: bool = True) -> T:
        token = HOME_OVERRIDE.set(self.home) if self.home else None
        try:
            result = fn(self._manager(), *args) if needs_manager else fn(*args)
            if inspect.isawaitable(result):
                result = await result
            return result
        except StopAsyncIteration:
            raise
        except Exception as exc:
            error = as_error(exc)
            if error is exc:
                raise
            raise error from exc
        finally:
            if token is not None:
                HOME_OVERRIDE.reset(token)

    async def _call(self, fn: Callable[..., Any], *args: Any, needs_manager: bool = True) -> Any:
        """`fn(manager, *args)` (awaited if a coroutine) on the core loop."""
        coro = self._in_core(fn, *args, needs_manager=needs_manager)
        core = self.core
        if core.here():  # the caller's own loop, adopted (sbx serve), or a call inside one
            return await coro
        return await asyncio.wrap_future(core.submit(coro))

    def call_blocking(self, awaitable: Awaitable[T]) -> T:
        """Run `awaitable` on the core loop and wait for it (the sync API)."""
        try:
            core = self.core
        except BaseException:
            if hasattr(awaitable, "close"):  # never to run: say so to no one
                awaitable.close()
            raise
        if core.here():
            raise RuntimeError("the sync sandboxer API was called from its own core loop; "
                               "use the AsyncSandboxer there")

        async def run() -> T:
            return await awaitable

        return core.submit(run()).result()

    async def _stream(self, make: Callable[[Manager], AsyncIterator[T]]) -> AsyncIterator[T]:
        """Items of the async iterator `make(manager)` runs on the core loop, one hop each."""
        agen = None

        async def start() -> None:
            nonlocal agen
            agen = await self._in_core(lambda mgr: make(mgr))

        async def step() -> T:
            return await self._in_core(lambda: agen.__anext__(), needs_manager=False)

        async def hop(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
            if self.core.here():
                return await coro_fn()
            return await asyncio.wrap_future(self.core.submit(coro_fn()))

        await hop(start)
        try:
            while True:
                try:
                    item = await hop(step)
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if agen is not None and hasattr(agen, "aclose"):
                with contextlib.suppress(Exception):
                    await hop(agen.aclose)

    def _pull(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """`chunks`, an async iterator of the caller's loop, readable on the core loop: each
        step runs on the caller's loop and its chunk is handed across (the reverse of
        `_stream`), so nothing is gathered whole. Call it on the caller's loop."""
        if not hasattr(chunks, "__aiter__"):
            return chunks  # not a stream: the core says what is wrong with it
        caller = asyncio.get_running_loop()
        source = chunks.__aiter__()
        if self.core.loop is caller:
            return source  # the core runs on the caller's loop (adopted, or the sync API)

        async def across() -> AsyncIterator[bytes]:
            try:
                while True:
                    try:
                        chunk = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
                            _next(source), caller))
                    except StopAsyncIteration:
                        return
                    yield chunk
            finally:
                if hasattr(source, "aclose") and not caller.is_closed():
                    with contextlib.suppress(Exception):
                        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
                            source.aclose(), caller))

        return across()

    async def close(self) -> None:
        _flush_telemetry()
        if not self._begin_closing():
            return
        self._close_mirrors()
        if self._core is not None and self._mgr is not None:
            mgr = self._mgr
            with contextlib.suppress(Exception):
                if self._core.here():
                    await mgr.close()
                else:
                    await asyncio.wrap_future(self._core.submit(mgr.close()))
        if self._core is not None:
            self._core.stop()

    def close_blocking(self) -> None:
        _flush_telemetry()
        if not self._begin_closing():
            return
        self._close_mirrors()
        if self._core is not None and self._mgr is not None:
            with contextlib.suppress(Exception):
                self._core.submit(self._mgr.close()).result()
        if self._core is not None:
            self._core.stop()

    def _begin_closing(self) -> bool:
        """Closed from here on (False when it was already): a reap that ends now hands its
        Manager to no one (_keep_manager), so the one closed below is the client's last."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            return True

    def _close_mirrors(self) -> None:
        for mirror in self._mirrors.values():
            if mirror is not None:
                mirror.close()
        self._mirrors.clear()

    # -- sandboxes --------------------------------------------------------------------------

    async def create(self, profile: str | Profile, *, ttl: timedelta | None, name: str | None,
                     labels: Mapping[str, str] | None, owner: str | None,
                     task: str | None,
                     volumes: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
        return await self._call(lambda mgr: api.create(mgr, profile, ttl=ttl, name=name,
                                                       labels=labels, owner=owner, task=task,
                                                       volumes=volumes))

    async def get(self, ref: str, *, with_profile: bool = False) -> dict[str, Any]:
        return await self._call(lambda mgr: api.get(mgr, ref, with_profile=with_profile))

    async def destroy(self, ref: str) -> tuple[dict[str, Any], bool]:
        return await self._call(lambda mgr: api.destroy(mgr, ref))

    async def destroy_many(self, refs: Sequence[str]) -> dict[str, list[Any]]:
        return await self._call(lambda mgr: api.destroy_many(mgr, refs))

    async def exec(self, ref: str, argv: Sequence[str], timeout: timedelta | None, *,
                   env: Mapping[str, str] | None = None, cwd: str | None = None,
                   user: str | None = None, stdin: bytes | None = None) -> dict[str, Any]:
        return await self._call(lambda mgr: api.exec(mgr, ref, argv, timeout, env=env, cwd=cwd,
                                                     user=user, stdin=stdin))

    def exec_stream(self, ref: str, argv: Sequence[str], timeout: timedelta | None, *,
                    env: Mapping[str, str] | None = None, cwd: str | None = None,
                    user: str | None = None, stdin: bytes | None = None,
                    ) -> AsyncIterator[tuple[str, Any]]:
        return self._stream(lambda mgr: api.exec_stream(mgr, ref, argv, timeout, env=env,
                                                        cwd=cwd, user=user, stdin=stdin))

    # -- files in a sandbox (core/lifecycle/files.py; incoming chunks pulled across, _pull) --

    async def write_file(self, ref: str, path: str, data: AsyncIterator[bytes], *,
                         mode: int | None = None) -> dict[str, Any]:
        incoming = self._pull(data)  # here, on the caller's loop
        return await self._call(lambda mgr: api.write_file(mgr, ref, path, incoming, mode=mode))

    def read_file(self, ref: str, path: str) -> AsyncIterator[bytes]:
        return self._stream(lambda mgr: api.read_file(mgr, ref, path))

    async def put_tree(self, ref: str, path: str, tar: AsyncIterator[bytes]) -> dict[str, Any]:
        incoming = self._pull(tar)  # here, on the caller's loop
        return await self._call(lambda mgr: api.put_tree(mgr, ref, path, incoming))

    def get_tree(self, ref: str, path: str) -> AsyncIterator[bytes]:
        return self._stream(lambda mgr: api.get_tree(mgr, ref, path))

    async def list_files(self, ref: str, path: str, depth: int) -> list[dict[str, Any]]:
        return await self._call(lambda mgr: api.list_files(mgr, ref, path, depth))

    async def stat_file(self, ref: str, path: str) -> dict[str, Any]:
        return await self._call(lambda mgr: api.stat_file(mgr, ref, path))

    async def remove_file(self, ref: str, path: str, *, recursive: bool) -> None:
        return await self._call(lambda mgr: api.remove_file(mgr, ref, path, recursive=recursive))

    async def make_dir(self, ref: str, path: str, *, parents: bool) -> None:
        return await self._call(lambda mgr: api.make_dir(mgr, ref, path, parents=parents))

    async def rename_file(self, ref: str, src: str, dst: str) -> None:
        return await self._call(lambda mgr: api.rename_file(mgr, ref, src, dst))

    # -- terminals (core/lifecycle/terminals.py) --------------------------------------------

    async def open_pty(self, ref: str, argv: Sequence[str] | None, *, cols: int = 80,
                       rows: int = 24, env: Mapping[str, str] | None = None,
                       cwd: str | None = None) -> dict[str, Any]:
        return await self._call(lambda mgr: api.open_pty(mgr, ref, argv, cols=cols, rows=rows,
                                                         env=env, cwd=cwd))

    async def get_pty(self, ref: str, session: str) -> dict[str, Any]:
        return await self._call(lambda mgr: api.get_pty(mgr, ref, session))

    def pty_output(self, ref: str, session: str, offset: int = 0,
                   ) -> AsyncIterator[dict[str, Any]]:
        return self._stream(lambda mgr: api.pty_output(mgr, ref, session, offset))

    async def write_pty(self, ref: str, session: str, data: bytes) -> None:
        return await self._call(lambda mgr: api.write_pty(mgr, ref, session, data))

    async def resize_pty(self, ref: str, session: str, cols: int, rows: int) -> None:
        return await self._call(lambda mgr: api.resize_pty(mgr, ref, session, cols, rows))

    async def close_pty(self, ref: str, session: str) -> None:
        await self._call(lambda mgr: api.close_pty(mgr, ref, session))

    # -- background processes (core/lifecycle/processes.py) ---------------------------------

    async def start_process(self, ref: str, argv: Sequence[str], *,
                            env: Mapping[str, str] | None = None, cwd: str | None = None,
                            user: str | None = None, stdin: bool = False) -> dict[str, Any]:
        return await self._call(lambda mgr: api.start_process(mgr, ref, argv, env=env, cwd=cwd,
                                                              user=user, stdin=stdin))

    async def list_processes(self, ref: str) -> list[dict[str, Any]]:
        return await self._call(lambda mgr: api.list_processes(mgr, ref))

    async def get_process(self, ref: str, pid: int) -> dict[str, Any]:
        return await self._call(lambda mgr: api.get_process(mgr, ref, pid))

    async def wait_process(self, ref: str, pid: int,
                           timeout: timedelta | None) -> dict[str, Any]:
        return await self._call(lambda mgr: api.wait_process(mgr, ref, pid, timeout))

    async def signal_process(self, ref: str, pid: int, signal: int) -> dict[str, Any]:
        return await self._call(lambda mgr: api.signal_process(mgr, ref, pid, signal))

    async def write_process_stdin(self, ref: str, pid: int, data: bytes) -> None:
        return await self._call(lambda mgr: api.write_process_stdin(mgr, ref, pid, data))

    async def close_process_stdin(self, ref: str, pid: int) -> None:
        return await self._call(lambda mgr: api.close_process_stdin(mgr, ref, pid))

    def process_output(self, ref: str, pid: int, *, stdout_offset: int = 0,
                       stderr_offset: int = 0, follow: bool = False,
                       ) -> AsyncIterator[dict[str, Any]]:
        return self._stream(lambda mgr: api.process_output(
            mgr, ref, pid, stdout_offset=stdout_offset, stderr_offset=stderr_offset,
            follow=follow))

    # -- ports (core/lifecycle/ports.py) ----------------------------------------------------

    async def port_urls(self, ref: str) -> list[dict[str, Any]]:
        return await self._call(lambda mgr: api.port_urls(mgr, ref))

    async def port_url(self, ref: str, port: int) -> dict[str, Any]:
        return await self._call(lambda mgr: api.port_url(mgr, ref, port))

    async def expose_port(self, ref: str, port: int) -> dict[str, Any]:
        return await self._call(lambda mgr: api.expose_port(mgr, ref, port))

    def logs(self, ref: str, *, follow: bool, tail: int | None) -> AsyncIterator[bytes]:
        return self._stream(lambda mgr: mgr.logs(ref, follow=follow, tail=tail))

    async def extend(self, ref: str, by: timedelta) -> tuple[dict[str, Any], bool]:
        return await self._call(lambda mgr: api.extend(mgr, ref, by))

    async def touch(self, ref: str) -> dict[str, Any]:
        return await self._call(lambda mgr: api.touch(mgr, ref))

    async def pause(self, ref: str) -> dict[str, Any]:
        return await self._call(lambda mgr: api.pause(mgr, ref))

    async def resume(self, ref: str) -> dict[str, Any]:
        return await self._call(lambda mgr: api.resume(mgr, ref))

    async def metrics(self, ref: str) -> dict[str, Any] | None:
        return await self._call(lambda mgr: api.metrics(mgr, ref))

    def follow_metrics(self, ref: str) -> AsyncIterator[dict[str, Any]]:
        return self._stream(lambda mgr: mgr.metrics(ref, follow=True))

    def follow_all_metrics(self, every: timedelta | None = None,
                           ) -> AsyncIterator[dict[str, Any]]:
        from sandboxer.core.follow.sampler import samples_of_all

        return self._stream(lambda mgr: samples_of_all(mgr, every or timedelta(seconds=5)))

    async def metric_history(self, ref: str) -> list[dict[str, Any]]:
        return await self._call(lambda mgr: mgr.metric_history(ref))

    async def evidence(self, ref: str, signed: bool = False) -> dict[str, Any]:
        if signed:
            from sandboxer.core.rules.errors import BadInput

            raise BadInput("by_service signs with a service's key: it is for a client of "
                           "`sbx serve` (url=); here, sign with your own key (sign=PATH)")
        return await self._call(lambda mgr: mgr.evidence(ref))

    # -- events -----------------------------------------------------------------------------

    async def events(self, sandbox: str | None, since: datetime | timedelta | None,
                     after: int | None) -> list[dict[str, Any]]:
        return await self._call(lambda mgr: api.events(mgr, sandbox, since, after))

    def follow_events(self, sandbox: str | None, after: int | None,
                      every: float) -> AsyncIterator[dict[str, Any]]:
        async def follow(mgr: Manager) -> AsyncIterator[dict[str, Any]]:
            from sandboxer.core.rules.views import event_view

            sandbox_id = mgr.resolve(sandbox)["id"] if sandbox else None
            after_id = mgr.last_event_id() if after is None else after
            while True:
                for row in mgr.events(sandbox_id, after_id=after_id):
                    after_id = row["id"]
                    yield event_view(row)
                await asyncio.sleep(every)

        return self._stream(follow)

    async def verify_events(self) -> dict[str, Any]:
        return await self._call(api.verify_events)

    async def deliver_events(self) -> list[dict[str, Any]]:
        return await self._call(api.deliver_events)

    async def undelivered(self) -> list[dict[str, Any]]:
        return await self._call(api.undelivered)

    async def redeliver(self, event_ids: Sequence[int] | None) -> list[dict[str, Any]]:
        return await self._call(lambda mgr: api.redeliver(mgr, event_ids))

    # -- the reaper -------------------------------------------------------------------------

    async def reap(self, *, dry_run: bool, orphans: bool, reap: bool = True,
                   timeout: timedelta | None = None) -> dict[str, Any]:
        return await self._call(lambda: api.reap(
            database_url=self.database_url, manager=self._mgr, actor=self.actor,
            dry_run=dry_run, orphans=orphans, reap=reap, timeout=timeout,
            hand_over=self._keep_manager), needs_manager=False)

    def _keep_manager(self, mgr: Manager) -> bool:
        """The Manager a reap made (it opened the store) becomes this client's, on the core
        loop: its next cycles, as `run_reaper`'s, act through the same store and adapters
        rather than opening them again. False when the client has one already or is
        closing (the reaper then closes it)."""
        with self._lock:
            if self._mgr is not None or self._closed:
                return False
            self._mgr = mgr
            return True

    # -- checkpoints ------------------------------------------------------------------------

    async def snapshot(self, ref: str, name: str | None) -> dict[str, Any]:
        return await self._call(lambda mgr: api.snapshot(mgr, ref, name))

    async def checkpoint(self, ref: str) -> dict[str, Any]:
        return await self._call(lambda mgr: api.checkpoint(mgr, ref))

    async def checkpoints(self, sandbox: str | None) -> list[dict[str, Any]]:
        return await self._call(lambda mgr: api.checkpoints(mgr, sandbox))

    async def restore(self, ref: str, *, ttl: timedelta | None, name: str | None,
                      labels: Mapping[str, str] | None, owner: str | None, task: str | None,
                      profile: str | None) -> dict[str, Any]:
        return await self._call(lambda mgr: api.restore(mgr, ref, ttl=ttl, name=name, labels=labels,
                                                        owner=owner, task=task, profile=profile))

    async def remove_checkpoint(self, ref: str) -> dict[str, Any]:
        return await self._call(lambda mgr: api.remove_checkpoint(mgr, ref))

    async def prune_checkpoints(self) -> list[str]:
        return await self._call(api.prune_checkpoints)

    async def export_checkpoint(self, ref: str, path: str) -> dict[str, Any]:
        return await self._call(lambda mgr: api.export_checkpoint(mgr, ref, path))

    async def import_checkpoint(self, path: str, name: str | None) -> dict[str, Any]:
        return await self._call(lambda mgr: api.import_checkpoint(mgr, path, name))

    # -- volumes (core/lifecycle/volumes.py) -------------------------------------------------

    async def create_volume(self, name: str, *, backend: str | None,
                            labels: Mapping[str, str] | None, ttl: timedelta | None,
                            shared: bool, owner: str | None) -> dict[str, Any]:
        return await self._call(lambda mgr: api.create_volume(
            mgr, name, backend=backend, labels=labels, ttl=ttl, shared=shared, owner=owner))

    async def volumes(self) -> list[dict[str, Any]]:
        return await self._call(api.volumes)

    async def volume(self, ref: str) -> dict[str, Any]:
        return await self._call(lambda mgr: api.volume(mgr, ref))

    async def remove_volume(self, ref: str) -> dict[str, Any]:
        return await self._call(lambda mgr: api.remove_volume(mgr, ref))

    async def put_volume_tree(self, ref: str, path: str,
                              tar: AsyncIterator[bytes]) -> dict[str, Any]:
        incoming = self._pull(tar)  # here, on the caller's loop
        return await self._call(lambda mgr: api.put_volume_tree(mgr, ref, path, incoming))

    def get_volume_tree(self, ref: str, path: str) -> AsyncIterator[bytes]:
        return self._stream(lambda mgr: api.get_volume_tree(mgr, ref, path))

    # -- profiles, health, the store --------------------------------------------------------

    async def profiles(self) -> list[dict[str, Any]]:
        return await self._call(api.profiles, needs_manager=False)

    async def profile(self, name: str) -> Profile:
        return await self._call(lambda: api.load_profile(name), needs_manager=False)

    async def check_profile(self, profile: Profile | Mapping[str, Any]) -> Profile:
        return await self._call(lambda mgr: api.check_profile(mgr, profile))

    async def doctor(self) -> dict[str, Any]:
        return await self._call(lambda: api.doctor(self.database_url), needs_manager=False)

    async def copy_database(self, target_url: str) -> dict[str, Any]:
        return await self._call(lambda mgr: api.copy_database(mgr, target_url))

    # -- watching, backends, recent samples, origin, shell ----------------------------------

    def watch(self, include_destroyed: bool) -> Watch:
        return LocalWatch(self, include_destroyed)

    async def backends(self, names: Sequence[str] | None, *, check: bool,
                       timeout: float) -> list[dict[str, Any]]:
        return await self._call(lambda mgr: api.backends(mgr, names, check=check, timeout=timeout))

    async def recent_metrics(self, since: datetime | timedelta) -> list[dict[str, Any]]:
        return await self._call(lambda mgr: api.recent_metrics(mgr, since))

    async def origin(self, ref: str) -> str | None:
        return await self._call(lambda mgr: mgr.resolve(ref)["restored_from"])

    async def shell_command(self, ref: str) -> list[str]:
        return await self._call(lambda mgr: api.shell_command(mgr, ref))

    def _database_url(self) -> str:
        """The database this transport reads (call on the core loop: `home` applies)."""
        if self._mgr is not None:
            return self._mgr.db.url
        from sandboxer.core.rules import settings

        return self.database_url or settings.database_url()


    # -- for the service: acting as a caller, pages, idempotent creates, keys -------------

    def acting_as(self, actor: str, tenant: str | None = None) -> Transport:
        return cast("Transport", ActingTransport(self, actor, tenant))

    async def list_page(self, *, state: str | None, backend: str | None,
                        labels: Mapping[str, str] | None, include_destroyed: bool,
                        limit: int | None, cursor: str | None,
                        ) -> tuple[list[dict[str, Any]], str | None]:
        return await self._call(lambda mgr: api.list_page(mgr, state=state, backend=backend,
                                                          labels=labels,
                                                          include_destroyed=include_destroyed,
                                                          limit=limit, cursor=cursor))

    async def create_idempotent(self, key: str, caller: str, profile: str | Profile, *,
                                ttl: timedelta | None, name: str | None,
                                labels: Mapping[str, str] | None, owner: str | None,
                                task: str | None) -> dict[str, Any]:
        return await self._call(lambda mgr: api.create_idempotent(mgr, key, caller, profile,
                                                                  ttl=ttl, name=name, labels=labels,
                                                                  owner=owner, task=task))

    async def create_api_key(self, scope: str, owner: str | None,
                             quotas: Mapping[str, Any] | None = None,
                             ) -> tuple[dict[str, Any], str]:
        return await self._call(lambda mgr: api.create_api_key(mgr, scope, owner, quotas))

    async def api_keys(self) -> list[dict[str, Any]]:
        return await self._call(api.api_keys)

    async def revoke_api_key(self, key_id: str) -> dict[str, Any]:
        return await self._call(lambda mgr: api.revoke_api_key(mgr, key_id))

    async def authenticate(self, token: str) -> dict[str, Any] | None:
        return await self._call(lambda mgr: api.authenticate(mgr, token))

    async def usable_api_keys(self) -> int:
        return await self._call(api.usable_api_keys)

    async def sandbox_counts(self) -> list[dict[str, Any]]:
        return await self._call(api.sandbox_counts)

    async def ready(self) -> dict[str, Any]:
        return await self._call(api.ready)

    async def current_metrics(self, timeout: timedelta | None = None) -> list[dict[str, Any]]:
        return await self._call(lambda mgr: api.current_metrics(mgr, timeout))

    async def mark_traffic(self, ref: str) -> None:
        await self._call(lambda mgr: api.mark_traffic(mgr, ref))

    async def record_port_link(self, ref: str, port: int, expires_at: datetime) -> None:
        await self._call(lambda mgr: api.record_port_link(mgr, ref, port, expires_at))

    async def record_mcp_call(self, tool: str, ref: str | None) -> None:
        await self._call(lambda mgr: api.record_mcp_call(mgr, tool, ref))

    # -- warm pools (core/pools/__init__.py) ---------------------------------------------------------

    async def pools(self) -> list[dict[str, Any]]:
        return await self._call(api.pools)

    async def set_pool_size(self, profile: str, size: int) -> dict[str, Any]:
        return await self._call(lambda mgr: api.set_pool_size(mgr, profile, size))

    async def drain_pool(self, profile: str) -> dict[str, Any]:
        return await self._call(lambda mgr: api.drain_pool(mgr, profile))

    async def list_json(self, *, state: str | None, backend: str | None,
                        labels: Mapping[str, str] | None, include_destroyed: bool) -> bytes:
        """`list()` as one JSON document; from a mirror, each row's view as encoded when it
        was read (InventoryMirror.views_json)."""
        return await self._listing(True, state, backend, labels, include_destroyed)

    async def _listing(self, as_json: bool, state: str | None, backend: str | None,
                       labels: Mapping[str, str] | None, include_destroyed: bool) -> Any:
        """The views of `list()`, or with `as_json` their JSON document: from this
        transport's InventoryMirror (core/follow/watch.py) while the database is current,
        which reads only the rows changed since its last look, with the driver alone (no
        ORM: `sbx ls` stays fast from a fresh process); else through the Manager, which
        migrates."""
        from sandboxer.core.rules.clock import clock_from_env, to_iso
        from sandboxer.core.rules.states import State
        from sandboxer.core.rules.views import encode_list, sandbox_views
        from sandboxer.core.store import tenancy
        from sandboxer.core.store.inventory import parse_state

        owner = tenancy.current()
        state = None if state is None else parse_state(state).value
        shows_destroyed = include_destroyed or state == State.DESTROYED.value
        narrowing = dict(state=state, backend=backend, labels=labels)
        filters = dict(include_all=include_destroyed, pool_members=False, owner=owner,
                       **narrowing)

        def made_of(views: list[dict[str, Any]]) -> Any:
            return encode_list(views) if as_json else views

        def from_mirror(mirror: InventoryMirror, now: str, last: bool = False) -> Any:
            if as_json:
                return mirror.views_json(now, **narrowing)
            return mirror.views(now, last=last, **narrowing)

        def mirrored() -> Any:
            """A first listing reads every row once, as a one-shot `sbx ls` needs (a mirror
            costs more than it saves there), unless this process is a child of the resident
            server, which kept the listing for it; from the second on, the mirror."""
            from sandboxer.core.follow.watch import InventoryMirror, handed_down
            from sandboxer.core.rules.views import VIEW_COLUMNS
            from sandboxer.core.store import inventory

            key = (owner, shows_destroyed)
            now = to_iso(clock_from_env().now())
            if key not in self._mirrors:
                inherited = handed_down(self._database_url(), shows_destroyed, owner)
                if inherited is not None:
                    made = from_mirror(inherited, now, last=True)
                    inherited.close()
                    if made is not None:
                        return made
                rows = inventory.read_fast(self._database_url(), columns=VIEW_COLUMNS,
                                           as_tuples=True, **filters)
                if rows is not None:
                    self._mirrors[key] = None  # listed once: a mirror next time
                    return made_of(sandbox_views(rows, now))
                return None
            mirror = self._mirrors[key]
            if mirror is None:
                mirror = self._mirrors[key] = InventoryMirror(
                    self._database_url(), shows_destroyed, owner)
            return from_mirror(mirror, now)

        made = await self._call(mirrored, needs_manager=False)
        if made is not None:
            return made
        rows = await self._call(lambda mgr: api.list_rows(mgr, **filters))
        return made_of(sandbox_views(rows, to_iso(clock_from_env().now())))

    # `list` comes last: a method of that name hides the builtin from the annotations below it
    # (for a type checker), so none is below it.

    async def list(self, *, state: str | None, backend: str | None,
                   labels: Mapping[str, str] | None,
                   include_destroyed: bool) -> list[dict[str, Any]]:
        return await self._listing(False, state, backend, labels, include_destroyed)


class LocalWatch:
    """A watch of the inventory (sandboxer.core.follow.watch): the rows changed since the last
    look, with the driver alone while the database is current (SQLite or PostgreSQL), else
    through the Manager, which migrates. Reads run on a worker
    thread of the core loop. Made acting for a tenant (ActingTransport), it sees that
    owner's sandboxes only."""

    def __init__(self, transport: LocalTransport, include_destroyed: bool) -> None:
        from sandboxer.core.rules.settings import TENANT

        self._transport = transport
        self.include_destroyed = include_destroyed
        self._watcher: Any = None
        self._owner = TENANT.get()  # watch() runs in the acting caller's context

    async def read(self) -> dict[str, Any]:
        from sandboxer.core.rules.views import sandbox_view

        include = self.include_destroyed

        async def fast() -> Any:
            if self._watcher is None:
                from sandboxer.core.follow.watch import InventoryWatcher

                self._watcher = InventoryWatcher(self._transport._database_url(), include,
                                                 owner=self._owner)
            self._watcher.set_include_destroyed(include)
            return await asyncio.to_thread(self._watcher.read)

        delta = await self._transport._call(fast, needs_manager=False)
        if delta is None:  # no current SQLite database (yet): the Manager's way
            delta = await self._transport._call(
                lambda mgr: self._watcher.apply(mgr.list(include_all=include,
                                                         pool_members=False)))
        return {"added": [sandbox_view(r) for r in delta.added],
                "changed": [sandbox_view(r) for r in delta.changed],
                "removed": list(delta.removed)}

    async def close(self) -> None:
        if self._watcher is not None:
            await asyncio.to_thread(self._watcher.close)


class ActingTransport:
    """A transport recording every operation as done by `actor`, and, with `tenant`, seeing
    and touching that owner's records only (core/store/tenancy.py), sharing `inner`'s loop,
    database and backends. It sets settings.ACTING_AS and settings.TENANT for each call only,
    in the calling task's context, which the call carries to the core loop: concurrent
    callers acting as different actors never mix. Closing it leaves `inner` open.

    Its operations are made from the transport contract (`_acting_operation`), one for each
    of `Transport`'s, with its signature: an operation added to the contract is acted as
    without a line here."""

    def __init__(self, inner: Transport, actor: str, tenant: str | None = None) -> None:
        self._inner = inner
        self._actor = actor
        self._tenant = tenant

    def acting_as(self, actor: str, tenant: str | None = None) -> Transport:
        return cast("Transport", ActingTransport(self._inner, actor, tenant))

    def call_blocking(self, awaitable: Awaitable[T]) -> T:
        return self._inner.call_blocking(awaitable)

    async def close(self) -> None:
        """The inner transport belongs to whoever made it."""

    def close_blocking(self) -> None:
        pass


def _acting_operation(name: str, operation: Callable[..., Any]) -> Callable[..., Any]:
    """`name` of the inner transport, run as the acting transport's actor (and tenant)."""
    if inspect.iscoroutinefunction(operation):
        @functools.wraps(operation)
        async def acting_call(self: ActingTransport, *args: Any, **kwargs: Any) -> Any:
            with _acting((self._actor, self._tenant)):
                return await getattr(self._inner, name)(*args, **kwargs)

        return acting_call

    @functools.wraps(operation)
    def acting(self: ActingTransport, *args: Any, **kwargs: Any) -> Any:
        who = (self._actor, self._tenant)
        with _acting(who):
            result = getattr(self._inner, name)(*args, **kwargs)
        if hasattr(result, "__anext__"):  # a stream: each step acts as `who` too
            return _ActingIterator(who, result)
        return result

    return acting


def _make_acting() -> None:
    from sandboxer._transport import Transport, operations

    for name in operations(Transport):
        if name not in vars(ActingTransport):
            setattr(ActingTransport, name, _acting_operation(name, getattr(Transport, name)))


_make_acting()


@contextlib.contextmanager
def _acting(who: tuple[str, str | None]) -> Iterator[None]:
    from sandboxer.core.rules.settings import ACTING_AS, TENANT

    actor_token, tenant_token = ACTING_AS.set(who[0]), TENANT.set(who[1])
    try:
        yield
    finally:
        TENANT.reset(tenant_token)
        ACTING_AS.reset(actor_token)


async def _as_actor(who: tuple[str, str | None], awaitable: Awaitable[T]) -> T:
    with _acting(who):
        return await awaitable


class _ActingIterator:
    def __init__(self, who: tuple[str, str | None], agen: Any) -> None:
        self._who, self._agen = who, agen

    def __aiter__(self) -> _ActingIterator:
        return self

    async def __anext__(self) -> Any:
        return await _as_actor(self._who, self._agen.__anext__())

    async def aclose(self) -> None:
        if hasattr(self._agen, "aclose"):
            await _as_actor(self._who, self._agen.aclose())


async def _next(source: AsyncIterator[T]) -> T:
    return await source.__anext__()


def _flush_telemetry() -> None:
    """The spans and metrics of this client's operations go out on close (docs/telemetry.md);
    nothing is imported when there were none."""
    import sys

    telemetry = sys.modules.get("sandboxer.core.observe.telemetry")
    if telemetry is not None:
        telemetry.flush()
