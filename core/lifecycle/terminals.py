"""Terminals in a sandbox (docs/terminals-and-ports.md, "Terminals"): a program on a
pseudo-terminal the backend opened (Capability.PTY), held by the process that runs the
Manager (the library in process, or `sbx serve`) for as long as the program runs.

Each session has one pump task reading the program's output into a bounded replay buffer
(`SBX_TERMINAL_REPLAY`, 1 MiB: the last that many bytes are kept). Every byte has an offset
from the session's start, so a client whose connection dropped reads again from the offset
it had reached and misses nothing still kept; an offset older than the oldest kept byte
reads on from that byte (the reader sees the gap in the offsets). Input counts as activity
for the idle limit, at most once every ACTIVITY_EVERY_S. A session ends when its program
exits, when it is closed, or when its sandbox is destroyed; an ended session is kept (its
last output and exit code) for ENDED_KEEP_S, at most ENDED_KEEP of them.

Events: `sandbox.pty.opened` and `sandbox.pty.closed` (argv masked as an exec's, env by names,
size, duration, exit code): never keystrokes nor output.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from sandboxer.adapters.base import Capability, PtyChannel
from sandboxer.core.rules.catalog import EventType
from sandboxer.core.rules.errors import BadInput, Conflict, NotFound
from sandboxer.core.rules.states import State
from sandboxer.core.store import tenancy
from sandboxer.core.store.models import Sandbox

if TYPE_CHECKING:
    from sandboxer.core.lifecycle.manager import Manager

SANDBOXES = Sandbox.__table__
# a login shell: bash where the sandbox has it, else sh
LOGIN_SHELL = ["sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; "
                           "else exec sh -l; fi"]
MAX_SIZE = 1000  # columns or rows
READ_PIECE = 64 * 1024  # one output item carries at most this many bytes
ACTIVITY_EVERY_S = 10.0  # input marks the sandbox active at most this often
ENDED_KEEP_S = 600.0
ENDED_KEEP = 64
CLOSE_WAIT_S = 5.0  # close waits this long for the program's end to be seen

_SESSIONS: weakref.WeakKeyDictionary[Any, dict[str, Session]] = weakref.WeakKeyDictionary()


class Session:
    """One terminal: its channel, its replay buffer and what the events need."""

    def __init__(self, mgr: Manager, sandbox: Mapping[str, Any], channel: PtyChannel,
                 argv: list[str], recorded: list[str], cols: int, rows: int,
                 keep: int) -> None:
        self.id = "pty-" + secrets.token_hex(8)
        self.sandbox_id, self.owner = sandbox["id"], sandbox["owner"]
        self.name = sandbox.get("name")
        self.channel, self.argv, self.recorded = channel, argv, recorded
        self.cols, self.rows = cols, rows
        self.keep = keep
        self.buffer = bytearray()
        self.start = 0  # the offset of buffer[0]
        self.opened = time.monotonic()
        self.active_marked = self.opened
        self.ended_at: float | None = None
        self.exit_code: int | None = None
        self.how: str | None = None  # exited, closed, sandbox-ended
        self._changed = asyncio.Event()
        self._mgr = weakref.ref(mgr)
        self.pump: asyncio.Task[None] | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.buffer)

    def view(self) -> dict[str, Any]:
        return {"id": self.id, "sandbox_id": self.sandbox_id, "argv": list(self.recorded),
                "cols": self.cols, "rows": self.rows, "offset": self.end,
                "kept_from": self.start, "running": self.ended_at is None,
                "exit_code": self.exit_code}

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def run(self) -> None:
        """The pump: the program's output into the buffer until it ends."""
        try:
            while data := await self.channel.read():
                self.buffer += data
                if len(self.buffer) > self.keep:
                    drop = len(self.buffer) - self.keep
                    del self.buffer[:drop]
                    self.start += drop
                self._notify()
        except Exception:  # noqa: BLE001 (the backend's connection broke: the session ends)
            pass
        finally:
            self.exit_code = self.channel.exit_code
            self.how = self.how or "exited"
            self.ended_at = time.monotonic()
            with contextlib.suppress(Exception):
                await self.channel.close()
            self._record_end()
            self._notify()

    def _record_end(self) -> None:
        mgr = self._mgr()
        if mgr is None:
            return
        with contextlib.suppress(Exception), mgr.db.write() as conn:
            if self.how == "exited" and self.exit_code is None:  # the reaper's destroy, say
                state = conn.execute(sa.select(SANDBOXES.c.state).where(
                    SANDBOXES.c.id == self.sandbox_id)).scalar()
                if state not in (State.RUNNING, State.PAUSED):
                    self.how = "sandbox-ended"
            mgr.event(conn, self.sandbox_id, EventType.SANDBOX_PTY_CLOSED, payload={
                "id": self.id, "argv": self.recorded, "cols": self.cols, "rows": self.rows,
                "duration_s": round((self.ended_at or time.monotonic()) - self.opened, 3),
                "exit_code": self.exit_code, "how": self.how})

    async def changed(self, since_end: int) -> None:
        """Until there is output past `since_end`, or the session ended."""
        while self.end <= since_end and self.ended_at is None:
            await self._changed.wait()


def _sessions(mgr: Manager) -> dict[str, Session]:
    found = _SESSIONS.get(mgr)
    if found is None:
        found = _SESSIONS[mgr] = {}
    return found


def _forget_old(mgr: Manager) -> None:
    sessions = _sessions(mgr)
    now = time.monotonic()
    ended = sorted((s for s in sessions.values() if s.ended_at is not None),
                   key=lambda s: s.ended_at or 0)
    for i, session in enumerate(ended):
        if len(ended) - i > ENDED_KEEP or now - (session.ended_at or now) > ENDED_KEEP_S:
            sessions.pop(session.id, None)


def _session(mgr: Manager, ref: str, session_id: str) -> Session:
    """The session `session_id` of the sandbox `ref`, as the caller's tenant may see it."""
    session = _sessions(mgr).get(session_id) if isinstance(session_id, str) else None
    tenant = tenancy.current()
    if session is not None and (tenant is None or session.owner == tenant):
        if ref in (session.sandbox_id, session.name):
            return session
        with contextlib.suppress(NotFound):
            if mgr.resolve(ref)["id"] == session.sandbox_id:
                return session
    raise NotFound(f"no terminal {session_id!r} in sandbox {ref}")


def _size(cols: Any, rows: Any) -> tuple[int, int]:
    for what, value in (("cols", cols), ("rows", rows)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIZE:
            raise BadInput(f"bad {what} {value!r}: a whole number from 1 to {MAX_SIZE}")
    return cols, rows


# -- the operations (core/api.py calls these) -----------------------------------------------


async def open_terminal(mgr: Manager, ref: str, argv: Sequence[str] | None, *,
                        cols: int = 80, rows: int = 24, env: Mapping[str, str] | None = None,
                        cwd: str | None = None) -> dict[str, Any]:
    """Start `argv` (a login shell when None) on a new terminal; opening it is activity.
    A backend without Capability.PTY refuses (Conflict naming it, exit 4), writing nothing."""
    from sandboxer.core.lifecycle.processes import check_argv, check_cwd, check_env
    from sandboxer.core.rules import settings

    run = LOGIN_SHELL if argv is None else check_argv(argv)
    env, cwd = check_env(env), check_cwd(cwd)
    cols, rows = _size(cols, rows)
    sandbox, recorded = mgr._start_using(ref, Capability.PTY, "open a terminal", run)
    adapter = await mgr.adapter_for(sandbox)
    channel = await adapter.open_pty(sandbox["backend_ref"], list(run), cols=cols, rows=rows,
                                     env=env or None, cwd=cwd)
    session = Session(mgr, sandbox, channel, list(run), recorded, cols, rows,
                      settings.terminal_replay_bytes())
    _forget_old(mgr)
    _sessions(mgr)[session.id] = session
    with mgr.db.write() as conn:
        mgr.event(conn, sandbox["id"], EventType.SANDBOX_PTY_OPENED, payload={
            "id": session.id, "argv": recorded, "cols": cols, "rows": rows,
            "env": sorted(env), "cwd": cwd})
    session.pump = asyncio.get_running_loop().create_task(session.run())
    return session.view()


def get(mgr: Manager, ref: str, session_id: str) -> dict[str, Any]:
    return _session(mgr, ref, session_id).view()


async def output(mgr: Manager, ref: str, session_id: str,
                 offset: int = 0) -> AsyncIterator[dict[str, Any]]:
    """`{"offset", "data"}` items from `offset` on as the program writes (an offset past the
    one asked for: what lay between is no longer kept), then `{"exit": code}` once it ended
    and everything kept was given."""
    session = _session(mgr, ref, session_id)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise BadInput(f"bad offset {offset!r}: a whole number of bytes, 0 or more")
    if offset > session.end:
        raise BadInput(f"offset {offset} is past the terminal's output ({session.end} bytes)")
    at = offset
    while True:
        if at < session.start:
            at = session.start
        if at < session.end:
            data = bytes(session.buffer[at - session.start:at - session.start + READ_PIECE])
            yield {"offset": at, "data": data}
            at += len(data)
            continue
        if session.ended_at is not None:
            yield {"exit": session.exit_code}
            return
        await session.changed(at)


async def write(mgr: Manager, ref: str, session_id: str, data: bytes) -> None:
    """Keystrokes to the program; input is activity (the idle clock starts again)."""
    session = _session(mgr, ref, session_id)
    if not isinstance(data, bytes | bytearray):
        raise BadInput("a terminal takes bytes")
    if session.ended_at is not None:
        raise Conflict(f"terminal {session_id} has ended (exit code {session.exit_code})")
    await session.channel.write(bytes(data))
    now = time.monotonic()
    if now - session.active_marked >= ACTIVITY_EVERY_S:
        session.active_marked = now
        with mgr.db.write() as conn:
            conn.execute(SANDBOXES.update().where(SANDBOXES.c.id == session.sandbox_id)
                         .values(last_activity_at=mgr.now_iso()))


async def resize(mgr: Manager, ref: str, session_id: str, cols: int, rows: int) -> None:
    session = _session(mgr, ref, session_id)
    cols, rows = _size(cols, rows)
    if session.ended_at is None:
        await session.channel.resize(cols, rows)
        session.cols, session.rows = cols, rows


async def close(mgr: Manager, ref: str, session_id: str) -> dict[str, Any]:
    """End the program (its terminal hangs up); idempotent. Its view, once the end is seen."""
    session = _session(mgr, ref, session_id)
    await _end(session, "closed")
    return session.view()


async def _end(session: Session, how: str) -> None:
    if session.ended_at is None:
        session.how = session.how or how
        with contextlib.suppress(Exception):
            await session.channel.close()
    if session.pump is not None:
        await asyncio.wait({session.pump}, timeout=CLOSE_WAIT_S)


def ending(mgr: Manager, ref: str) -> None:
    """The sandbox `ref` (its id or name) is being destroyed: its terminals' ends are said
    to be that, whichever is seen first."""
    for session in _sessions(mgr).values():
        if ref in (session.sandbox_id, session.name) and session.ended_at is None:
            session.how = "sandbox-ended"


async def sandbox_ended(mgr: Manager, sandbox_id: str) -> None:
    """The sandbox was destroyed: its terminals end with it."""
    sessions = [s for s in _sessions(mgr).values()
                if s.sandbox_id == sandbox_id and s.ended_at is None]
    if sessions:
        await asyncio.gather(*(_end(s, "sandbox-ended") for s in sessions))


async def close_all(mgr: Manager) -> None:
    """The Manager closes: every terminal it holds ends."""
    sessions = [s for s in _sessions(mgr).values() if s.ended_at is None]
    if sessions:
        await asyncio.gather(*(_end(s, "closed") for s in sessions))
