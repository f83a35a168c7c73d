"""The operations, written once: what every front end reaches through the library's
transport contract (sandboxer/_transport.py). Each takes the Manager first, runs the
operation and returns the record shapes of sandboxer.core.rules.views, plain data a
transport hands on unchanged: the in-process transport (sandboxer/_local.py) calls these
on its core loop, one line per operation; `sbx serve` reaches them through the library.

This is the engine's top room: it may use every room below it (pools and the reaper
included); nothing in the engine imports it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandboxer.core.lifecycle.manager import Manager
    from sandboxer.core.rules.profiles import Profile


def recorder(mgr: Manager) -> Callable[[Any, str, dict[str, Any]], None]:
    """An event of no sandbox, written in the caller's transaction as the acting actor."""
    return lambda conn, type, payload: mgr.event(conn, None, type, payload=payload)


def load_profile(profile: str | Profile) -> Profile:
    from sandboxer.core.rules.profiles import Profile, ProfileLoader

    if isinstance(profile, Profile):
        return profile
    if isinstance(profile, Mapping):
        return ProfileLoader().load_mapping(dict(profile))
    return ProfileLoader().load(profile)


def since_iso(mgr: Manager, since: datetime | timedelta | None) -> str | None:
    from sandboxer.core.rules.clock import to_iso

    if since is None:
        return None
    if isinstance(since, timedelta):
        return to_iso(mgr.clock.now() - since)
    return to_iso(since)


async def create(
    mgr: Manager,
    profile: str | Profile,
    *,
    ttl: timedelta | None,
    name: str | None,
    labels: Mapping[str, str] | None,
    owner: str | None,
    task: str | None,
    volumes: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    from sandboxer.core.rules.views import sandbox_view

    resolved = load_profile(profile)
    if volumes:  # mounts asked at create, beside the profile's own (docs/volumes.md)
        from sandboxer.core.lifecycle.volumes import with_mounts

        resolved = with_mounts(resolved, volumes)
    row = await mgr.create(resolved, ttl=ttl, name=name, labels=labels, owner=owner,
                           task=task)
    return sandbox_view(row, mgr.now_iso())


def get(mgr: Manager, ref: str, *, with_profile: bool = False) -> dict[str, Any]:
    import json

    from sandboxer.core.rules.views import sandbox_view

    row = mgr.resolve(ref)
    view = sandbox_view(row, mgr.now_iso())
    if with_profile:
        view["profile_resolved"] = json.loads(row["profile_json"] or "{}")
    return view


async def destroy(mgr: Manager, ref: str) -> tuple[dict[str, Any], bool]:
    from sandboxer.core.rules.views import sandbox_view

    _terminals(mgr, "ending", ref)
    row, done = await mgr.destroy(ref)
    await _terminals(mgr, "sandbox_ended", row["id"])
    return sandbox_view(row, mgr.now_iso()), done


def _terminals(mgr: Manager, what: str, ref: str) -> Any:
    """A destroyed sandbox's terminals end with it (only if this process opened any)."""
    import asyncio
    import sys

    terminals = sys.modules.get("sandboxer.core.lifecycle.terminals")
    if terminals is None:
        return asyncio.sleep(0) if what == "sandbox_ended" else None
    return getattr(terminals, what)(mgr, ref)


async def destroy_many(mgr: Manager, refs: Sequence[str]) -> dict[str, list[Any]]:
    mgr.make_room()  # a nearly full disk: the reserve goes first, so these can end
    ids = [mgr.resolve(ref)["id"] for ref in refs]  # all known before any is touched
    for sandbox_id in ids:
        _terminals(mgr, "ending", sandbox_id)
    done = await mgr.destroy_many(ids)
    for sandbox_id in ids:
        await _terminals(mgr, "sandbox_ended", sandbox_id)
    return done


async def exec(
    mgr: Manager,
    ref: str,
    argv: Sequence[str],
    timeout: timedelta | None,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    user: str | None = None,
    stdin: bytes | AsyncIterator[bytes] | None = None,
) -> dict[str, Any]:
    result = await mgr.exec(ref, list(argv), timeout=timeout, env=env, cwd=cwd, user=user,
                            stdin=stdin)
    return {"exit_code": result.exit_code, "stdout": result.stdout,
            "stderr": result.stderr, "duration": result.duration_s,
            "timed_out": result.timed_out}


def exec_stream(
    mgr: Manager,
    ref: str,
    argv: Sequence[str],
    timeout: timedelta | None,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    user: str | None = None,
    stdin: bytes | AsyncIterator[bytes] | None = None,
) -> AsyncIterator[tuple[str, Any]]:
    return mgr.exec_stream(ref, list(argv), timeout=timeout, env=env, cwd=cwd, user=user,
                           stdin=stdin)


# -- files in a sandbox (core/lifecycle/files.py) ------------------------------------------------

async def write_file(mgr: Manager, ref: str, path: str, data: AsyncIterator[bytes], *,
                     mode: int | None = None) -> dict[str, Any]:
    from sandboxer.core.lifecycle import files

    return await files.write_file(mgr, ref, path, data, mode=mode)


def read_file(mgr: Manager, ref: str, path: str) -> AsyncIterator[bytes]:
    from sandboxer.core.lifecycle import files

    return files.read_file(mgr, ref, path)


async def put_tree(mgr: Manager, ref: str, path: str,
                   tar: AsyncIterator[bytes]) -> dict[str, Any]:
    from sandboxer.core.lifecycle import files

    return await files.put_tree(mgr, ref, path, tar)


def get_tree(mgr: Manager, ref: str, path: str) -> AsyncIterator[bytes]:
    from sandboxer.core.lifecycle import files

    return files.get_tree(mgr, ref, path)


async def list_files(mgr: Manager, ref: str, path: str, depth: int) -> list[dict[str, Any]]:
    from sandboxer.core.lifecycle import files

    return await files.list_files(mgr, ref, path, depth)


async def stat_file(mgr: Manager, ref: str, path: str) -> dict[str, Any]:
    from sandboxer.core.lifecycle import files

    return await files.stat_file(mgr, ref, path)


async def remove_file(mgr: Manager, ref: str, path: str, *, recursive: bool) -> None:
    from sandboxer.core.lifecycle import files

    await files.remove_file(mgr, ref, path, recursive=recursive)


async def make_dir(mgr: Manager, ref: str, path: str, *, parents: bool) -> None:
    from sandboxer.core.lifecycle import files

    await files.make_dir(mgr, ref, path, parents=parents)


async def rename_file(mgr: Manager, ref: str, src: str, dst: str) -> None:
    from sandboxer.core.lifecycle import files

    await files.rename_file(mgr, ref, src, dst)


async def extend(mgr: Manager, ref: str, by: timedelta) -> tuple[dict[str, Any], bool]:
    from sandboxer.core.rules.views import sandbox_view

    row, capped = await mgr.extend(ref, by)
    return sandbox_view(row, mgr.now_iso()), capped


async def touch(mgr: Manager, ref: str) -> dict[str, Any]:
    from sandboxer.core.rules.views import sandbox_view

    return sandbox_view(await mgr.record_activity(ref), mgr.now_iso())


async def metrics(mgr: Manager, ref: str) -> dict[str, Any] | None:
    async for view in mgr.metrics(ref):
        return view
    return None


def events(
    mgr: Manager,
    sandbox: str | None,
    since: datetime | timedelta | None,
    after: int | None,
) -> list[dict[str, Any]]:
    from sandboxer.core.rules.views import event_view

    sandbox_id = mgr.resolve(sandbox)["id"] if sandbox else None
    return [event_view(r) for r in mgr.events(
        sandbox_id, since=since_iso(mgr, since), after_id=after or 0)]


def verify_events(mgr: Manager) -> dict[str, Any]:
    report = mgr.verify_events()
    return {"checked": report.checked, "intact": report.intact,
            "broken_at": report.broken_at, "problem": report.problem}


def deliver_events(mgr: Manager) -> list[dict[str, Any]]:
    from sandboxer.core.observe.delivery import default_deliverer

    return [r.as_json() for r in default_deliverer(mgr.db).run()]


def undelivered(mgr: Manager) -> list[dict[str, Any]]:
    from sandboxer.core.observe.delivery import default_deliverer

    return default_deliverer(mgr.db).undelivered()


def redeliver(mgr: Manager, event_ids: Sequence[int] | None) -> list[dict[str, Any]]:
    from sandboxer.core.observe.delivery import default_deliverer

    return default_deliverer(mgr.db).redeliver(list(event_ids) if event_ids else None)


async def snapshot(mgr: Manager, ref: str, name: str | None) -> dict[str, Any]:
    from sandboxer.core.lifecycle.checkpoints import Checkpoints, checkpoint_view

    return checkpoint_view(await Checkpoints(mgr).snapshot(ref, name))


def checkpoint(mgr: Manager, ref: str) -> dict[str, Any]:
    from sandboxer.core.lifecycle.checkpoints import Checkpoints, checkpoint_view

    return checkpoint_view(Checkpoints(mgr).resolve(ref))


def checkpoints(mgr: Manager, sandbox: str | None) -> list[dict[str, Any]]:
    from sandboxer.core.lifecycle.checkpoints import Checkpoints, checkpoint_view

    return [checkpoint_view(r) for r in Checkpoints(mgr).list(sandbox)]


async def restore(
    mgr: Manager,
    ref: str,
    *,
    ttl: timedelta | None,
    name: str | None,
    labels: Mapping[str, str] | None,
    owner: str | None,
    task: str | None,
    profile: str | None,
) -> dict[str, Any]:
    from sandboxer.core.lifecycle.checkpoints import Checkpoints
    from sandboxer.core.rules.views import sandbox_view

    row = await Checkpoints(mgr).restore(ref, ttl=ttl, name=name, labels=labels,
                                         owner=owner, task=task, profile_name=profile)
    return sandbox_view(row, mgr.now_iso())


async def remove_checkpoint(mgr: Manager, ref: str) -> dict[str, Any]:
    from sandboxer.core.lifecycle.checkpoints import Checkpoints, checkpoint_view

    return checkpoint_view(await Checkpoints(mgr).remove(ref))


async def prune_checkpoints(mgr: Manager) -> list[str]:
    from sandboxer.core.lifecycle.checkpoints import Checkpoints

    return await Checkpoints(mgr).prune()


async def export_checkpoint(mgr: Manager, ref: str, path: str) -> dict[str, Any]:
    from sandboxer.core.lifecycle.checkpoints import Checkpoints, checkpoint_view

    return checkpoint_view(await Checkpoints(mgr).export(ref, path))


async def import_checkpoint(mgr: Manager, path: str, name: str | None) -> dict[str, Any]:
    from sandboxer.core.lifecycle.checkpoints import Checkpoints, checkpoint_view

    return checkpoint_view(await Checkpoints(mgr).import_(path, name))


def check_profile(mgr: Manager, profile: Profile | Mapping[str, Any]) -> Profile:
    resolved = load_profile(profile)
    mgr.check_profile(resolved)
    return resolved


def copy_database(mgr: Manager, target_url: str) -> dict[str, Any]:
    from sandboxer.core.store.dbcopy import copy_inventory

    return copy_inventory(mgr.db, target_url).as_json()


async def backends(
    mgr: Manager,
    names: Sequence[str] | None,
    *,
    check: bool,
    timeout: float,
) -> list[dict[str, Any]]:
    from sandboxer.core.lifecycle.backends import backend_statuses

    return await backend_statuses(mgr, names, check=check, timeout_s=timeout)


def recent_metrics(mgr: Manager, since: datetime | timedelta) -> list[dict[str, Any]]:
    from sandboxer.core.follow.watch import recent_samples

    start = mgr.clock.now() - since if isinstance(since, timedelta) else since
    return recent_samples(mgr, start)


async def shell_command(mgr: Manager, ref: str) -> list[str]:
    from sandboxer.core.lifecycle.backends import shell_argv

    return await shell_argv(mgr, ref)


def list_page(
    mgr: Manager,
    *,
    state: str | None,
    backend: str | None,
    labels: Mapping[str, str] | None,
    include_destroyed: bool,
    limit: int | None,
    cursor: str | None,
) -> tuple[list[dict[str, Any]], str | None]:
    from sandboxer.core.rules.views import VIEW_COLUMNS, sandbox_views
    from sandboxer.core.store import inventory, tenancy

    after, size = inventory.parse_page(cursor, limit)
    placeholder = "?" if mgr.db.engine.dialect.paramstyle == "qmark" else "%s"
    with mgr.db.read() as conn:
        rows = inventory.list_sandboxes(
            conn.connection.driver_connection, include_all=include_destroyed,
            state=state, backend=backend, labels=labels, placeholder=placeholder,
            columns=VIEW_COLUMNS, after=after, limit=size + 1, pool_members=False,
            owner=tenancy.current(), as_tuples=True)
    more = len(rows) > size
    views = sandbox_views(rows[:size], mgr.now_iso())
    return views, inventory.page_cursor(views[-1]) if more else None


def list_rows(mgr: Manager, **filters: Any) -> list[tuple[Any, ...]]:
    """The rows of a listing through the Manager's database, as the tuples of the columns a
    view reads (inventory.list_sandboxes' filters; views.sandbox_views makes the views)."""
    from sandboxer.core.rules.views import VIEW_COLUMNS
    from sandboxer.core.store import inventory

    placeholder = "?" if mgr.db.engine.dialect.paramstyle == "qmark" else "%s"
    with mgr.db.read() as conn:
        return inventory.list_sandboxes(conn.connection.driver_connection,
                                        placeholder=placeholder, columns=VIEW_COLUMNS,
                                        as_tuples=True, **filters)


async def create_idempotent(
    mgr: Manager,
    key: str,
    caller: str,
    profile: str | Profile,
    *,
    ttl: timedelta | None,
    name: str | None,
    labels: Mapping[str, str] | None,
    owner: str | None,
    task: str | None,
) -> dict[str, Any]:
    from sandboxer.core.lifecycle import idempotency
    from sandboxer.core.rules.profiles import dump
    from sandboxer.core.rules.views import sandbox_view

    resolved = load_profile(profile)
    asked = {"profile": dump(resolved), "ttl": ttl.total_seconds() if ttl else None,
             "name": name, "labels": dict(labels or {}), "owner": owner, "task": task}
    row = await idempotency.create_once(
        mgr, caller, key, asked,
        lambda bind: mgr.create(resolved, ttl=ttl, name=name, labels=labels,
                                owner=owner, task=task, bind=bind))
    return sandbox_view(row, mgr.now_iso())


def create_api_key(
    mgr: Manager,
    scope: str,
    owner: str | None,
    quotas: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], str]:
    from sandboxer.core.store import apikeys

    return apikeys.create(mgr.db, scope=scope, owner=owner or mgr.actor,
                          created_by=mgr.actor, now=mgr.now_iso(), quotas=quotas,
                          record=recorder(mgr))


def api_keys(mgr: Manager) -> list[dict[str, Any]]:
    from sandboxer.core.store import apikeys

    return apikeys.list_keys(mgr.db)


def revoke_api_key(mgr: Manager, key_id: str) -> dict[str, Any]:
    from sandboxer.core.store import apikeys

    view, _ = apikeys.revoke(mgr.db, key_id, now=mgr.now_iso(), record=recorder(mgr))
    return view


def authenticate(mgr: Manager, token: str) -> dict[str, Any] | None:
    from sandboxer.core.store import apikeys

    return apikeys.authenticate(mgr.db, token)


def usable_api_keys(mgr: Manager) -> int:
    from sandboxer.core.store import apikeys

    return apikeys.usable_keys(mgr.db)


def sandbox_counts(mgr: Manager) -> list[dict[str, Any]]:
    from sandboxer.core.store import inventory, tenancy

    placeholder = "?" if mgr.db.engine.dialect.paramstyle == "qmark" else "%s"
    with mgr.db.read() as conn:
        return inventory.count_sandboxes(conn.connection.driver_connection,
                                         tenancy.current(), placeholder)


def ready(mgr: Manager) -> dict[str, Any]:
    from sandboxer.core.rules.errors import Unavailable
    from sandboxer.core.store.db import redact
    from sandboxer.core.store.migrations import SCHEMA_HEAD

    mgr.db.migrate()
    schema = mgr.db.schema_version()
    if schema != SCHEMA_HEAD:
        raise Unavailable(f"the database schema is {schema}, not {SCHEMA_HEAD}")
    return {"database": redact(mgr.db.url), "schema": schema}


async def current_metrics(mgr: Manager, timeout: timedelta | None = None) -> list[dict[str, Any]]:
    from sandboxer.core.follow.containermetrics import READ_TIMEOUT, read_all

    return await read_all(mgr, timeout or READ_TIMEOUT)


def pools(mgr: Manager) -> list[dict[str, Any]]:
    from sandboxer.core import pools

    return pools.statuses(mgr)


async def set_pool_size(mgr: Manager, profile: str, size: int) -> dict[str, Any]:
    from sandboxer.core import pools

    resolved = load_profile(profile)
    await pools.set_size(mgr, resolved, size)  # made (or retired) now
    return pools.statuses(mgr, {resolved.name: resolved}, only=resolved.name)[0]


async def drain_pool(mgr: Manager, profile: str) -> dict[str, Any]:
    from sandboxer.core import pools
    from sandboxer.core.rules.errors import NotFound

    try:
        resolved = load_profile(profile)
    except NotFound:  # gone from the search path: what is left can still go
        resolved = None
    return await pools.drain(mgr, profile, resolved)


async def pause(mgr: Manager, ref: str) -> dict[str, Any]:
    from sandboxer.core.rules.views import sandbox_view

    return sandbox_view(await mgr.pause(ref), mgr.now_iso())


async def resume(mgr: Manager, ref: str) -> dict[str, Any]:
    from sandboxer.core.rules.views import sandbox_view

    return sandbox_view(await mgr.resume(ref), mgr.now_iso())


async def reap(*, database_url: str | None, manager: Manager | None, actor: str | None,
               dry_run: bool, orphans: bool, reap: bool = True,
               timeout: timedelta | None = None,
               hand_over: Callable[[Manager], bool] | None = None) -> dict[str, Any]:
    """One reconcile-and-reap cycle. It reads with the driver alone when it can, so a cycle
    with nothing to do loads neither the ORM nor Alembic (no Manager is made for it).
    `hand_over`: offered the Manager the cycle made, when one was (Reaper.close)."""
    import asyncio

    from sandboxer.core.reconcile.reaper import default_reaper

    reaper = default_reaper(orphans=orphans, dry_run=dry_run, reap=reap,
                            database_url=database_url, manager=manager, actor=actor)
    try:
        job = reaper.cycle()
        try:
            report = await (asyncio.wait_for(job, timeout.total_seconds()) if timeout else job)
        except TimeoutError:
            from sandboxer.core.rules.durations import format_duration
            from sandboxer.core.rules.errors import TimedOut

            raise TimedOut(f"timed out after {format_duration(timeout)}; the next "
                           "run completes what this one left") from None
    finally:
        await reaper.close(keep_manager=manager is not None, hand_over=hand_over)
    return report.as_json()


def profiles() -> list[dict[str, Any]]:
    """Every profile on the search path, with the reason one cannot be used."""
    from sandboxer.core.rules.errors import BadInput
    from sandboxer.core.rules.profiles import ProfileLoader

    loader = ProfileLoader()
    found = []
    for name, path in loader.names().items():
        try:
            found.append({**loader.load(name).summary(), "source": str(path)})
        except BadInput as exc:
            found.append({"name": name, "backend": None, "description": None,
                          "source": str(path), "error": str(exc)})
    return found


async def doctor(database_url: str | None) -> dict[str, Any]:
    """What `sbx doctor` reports, on a database of its own (never the Manager's)."""
    from sandboxer.core.observe import doctor as checks
    from sandboxer.core.rules import settings
    from sandboxer.core.store.db import Database

    db = Database(database_url or settings.database_url())
    try:
        return await checks.report(db)
    finally:
        db.dispose()


# -- background processes (core/lifecycle/processes.py) ------------------------------------


async def start_process(mgr: Manager, ref: str, argv: Sequence[str], *,
                        env: Mapping[str, str] | None = None, cwd: str | None = None,
                        user: str | None = None, stdin: bool = False) -> dict[str, Any]:
    from sandboxer.core.lifecycle import processes

    return await processes.start(mgr, ref, argv, env=env, cwd=cwd, user=user, stdin=stdin)


async def list_processes(mgr: Manager, ref: str) -> list[dict[str, Any]]:
    from sandboxer.core.lifecycle import processes

    return await processes.list_processes(mgr, ref)


async def get_process(mgr: Manager, ref: str, pid: int) -> dict[str, Any]:
    from sandboxer.core.lifecycle import processes

    return await processes.get(mgr, ref, pid)


async def wait_process(mgr: Manager, ref: str, pid: int,
                       timeout: timedelta | None) -> dict[str, Any]:
    from sandboxer.core.lifecycle import processes

    return await processes.wait(mgr, ref, pid, timeout)


async def signal_process(mgr: Manager, ref: str, pid: int, signal: int) -> dict[str, Any]:
    from sandboxer.core.lifecycle import processes

    return await processes.signal(mgr, ref, pid, signal)


async def write_process_stdin(mgr: Manager, ref: str, pid: int, data: bytes) -> None:
    from sandboxer.core.lifecycle import processes

    await processes.write_stdin(mgr, ref, pid, data)


async def close_process_stdin(mgr: Manager, ref: str, pid: int) -> None:
    from sandboxer.core.lifecycle import processes

    await processes.close_stdin(mgr, ref, pid)


def process_output(mgr: Manager, ref: str, pid: int, *, stdout_offset: int = 0,
                   stderr_offset: int = 0, follow: bool = False,
                   ) -> AsyncIterator[dict[str, Any]]:
    from sandboxer.core.lifecycle import processes

    return processes.output(mgr, ref, pid, stdout_offset=stdout_offset,
                            stderr_offset=stderr_offset, follow=follow)


# -- a sandbox's ports as URLs (core/lifecycle/ports.py) -------------------------------------


async def port_urls(mgr: Manager, ref: str) -> list[dict[str, Any]]:
    from sandboxer.core.lifecycle import ports

    return await ports.list_ports(mgr, ref)


async def port_url(mgr: Manager, ref: str, port: int) -> dict[str, Any]:
    from sandboxer.core.lifecycle import ports

    return await ports.url(mgr, ref, port)


async def expose_port(mgr: Manager, ref: str, port: int) -> dict[str, Any]:
    from sandboxer.core.lifecycle import ports

    return await ports.expose(mgr, ref, port)


# -- terminals (core/lifecycle/terminals.py) -------------------------------------------------


async def open_pty(mgr: Manager, ref: str, argv: Sequence[str] | None, *, cols: int = 80,
                   rows: int = 24, env: Mapping[str, str] | None = None,
                   cwd: str | None = None) -> dict[str, Any]:
    from sandboxer.core.lifecycle import terminals

    return await terminals.open_terminal(mgr, ref, argv, cols=cols, rows=rows, env=env,
                                         cwd=cwd)


def get_pty(mgr: Manager, ref: str, session: str) -> dict[str, Any]:
    from sandboxer.core.lifecycle import terminals

    return terminals.get(mgr, ref, session)


def pty_output(mgr: Manager, ref: str, session: str, offset: int = 0,
               ) -> AsyncIterator[dict[str, Any]]:
    from sandboxer.core.lifecycle import terminals

    return terminals.output(mgr, ref, session, offset)


async def write_pty(mgr: Manager, ref: str, session: str, data: bytes) -> None:
    from sandboxer.core.lifecycle import terminals

    await terminals.write(mgr, ref, session, data)


async def resize_pty(mgr: Manager, ref: str, session: str, cols: int, rows: int) -> None:
    from sandboxer.core.lifecycle import terminals

    await terminals.resize(mgr, ref, session, cols, rows)


async def close_pty(mgr: Manager, ref: str, session: str) -> dict[str, Any]:
    from sandboxer.core.lifecycle import terminals

    return await terminals.close(mgr, ref, session)


# -- the service's proxy to a sandbox's ports (docs/terminals-and-ports.md, "The proxy and
# preview links") ----------------------------------------------------------------------------


def mark_traffic(mgr: Manager, ref: str) -> None:
    """Traffic reached the sandbox through a service's proxy: activity now, quietly (no
    event: a request is not one; the proxy calls this at most once a second a sandbox).
    Conflict when it is not running or paused; another tenant's is not found."""
    from sandboxer.core.store import tenancy

    row = mgr.resolve(ref)
    tenancy.check(row, "sandbox", ref)
    mgr._mark_active(row["id"])  # noqa: SLF001 (the lifecycle's own quiet mark)


def record_mcp_call(mgr: Manager, tool: str, ref: str | None) -> None:
    """An MCP tool call that records no event of its own: `mcp.call` with the tool's name,
    of the sandbox `ref` names (seen by the caller's tenant), or of none."""
    from sandboxer.core.rules.catalog import EventType
    from sandboxer.core.rules.errors import BadInput
    from sandboxer.core.store import tenancy

    if not isinstance(tool, str) or not tool.isidentifier() or len(tool) > 64:
        raise BadInput(f"bad tool name {tool!r}")
    sandbox_id = None
    if ref is not None:
        row = mgr.resolve(ref)
        tenancy.check(row, "sandbox", ref)
        sandbox_id = row["id"]
    with mgr.db.write() as conn:
        mgr.event(conn, sandbox_id, EventType.MCP_CALL, payload={"tool": tool})


def record_port_link(mgr: Manager, ref: str, port: int, expires_at: datetime) -> None:
    """A signed preview link to the running sandbox's `port` was handed out: the event
    `sandbox.port.link` with the port and when it expires (never the link itself)."""
    from sandboxer.core.rules.catalog import EventType
    from sandboxer.core.rules.clock import to_iso
    from sandboxer.core.rules.errors import Conflict
    from sandboxer.core.rules.states import State
    from sandboxer.core.store import tenancy

    row = mgr.resolve(ref)
    tenancy.check(row, "sandbox", ref)
    if row["state"] != State.RUNNING:
        raise Conflict(f"sandbox {row['id']} is {row['state']}: a preview link needs it "
                       "running")
    with mgr.db.write() as conn:
        mgr.event(conn, row["id"], EventType.SANDBOX_PORT_LINK,
                  payload={"port": port, "expires_at": to_iso(expires_at)})


# -- volumes (core/lifecycle/volumes.py) -----------------------------------------------------


async def create_volume(mgr: Manager, name: str, *, backend: str | None,
                        labels: Mapping[str, str] | None, ttl: timedelta | None,
                        shared: bool, owner: str | None) -> dict[str, Any]:
    from sandboxer.core.lifecycle import volumes

    return await volumes.create(mgr, name, backend=backend, labels=labels, ttl=ttl,
                                shared=shared, owner=owner)


def volumes(mgr: Manager) -> list[dict[str, Any]]:
    from sandboxer.core.lifecycle import volumes

    return volumes.list_volumes(mgr)


async def volume(mgr: Manager, ref: str) -> dict[str, Any]:
    from sandboxer.core.lifecycle import volumes

    return await volumes.show(mgr, ref)


async def remove_volume(mgr: Manager, ref: str) -> dict[str, Any]:
    from sandboxer.core.lifecycle import volumes

    return await volumes.remove(mgr, ref)


async def put_volume_tree(mgr: Manager, ref: str, path: str,
                          tar: AsyncIterator[bytes]) -> dict[str, Any]:
    from sandboxer.core.lifecycle import volumes

    return await volumes.put_tree(mgr, ref, path, tar)


def get_volume_tree(mgr: Manager, ref: str, path: str) -> AsyncIterator[bytes]:
    from sandboxer.core.lifecycle import volumes

    return volumes.get_tree(mgr, ref, path)
