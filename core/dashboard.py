"""What the dashboard shows and does, without any UI: the inventory read each second with
change detection, backend health, recent metrics, the actions (one Manager call each), and
the small rules the screen follows (filter, sort on raw values, countdown levels, which
action applies to which sandbox, the equivalent `sbx` command of each action).

The front end (sandboxer_tui.app) only draws what this module computes. Everything that
waits (the database, a backend) runs on one background asyncio loop in its own thread
(`Dashboard.run` / `Dashboard.call`), so the UI's loop never blocks on I/O, and backend
clients stay on one loop for the whole session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import shutil
import sqlite3
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from core.clock import Clock, from_iso, to_iso
from core.errors import BadInput
from core.states import ACTIVE, ON_THE_CLOCK, State
from core.ttl import effective_deadline

if TYPE_CHECKING:
    from core.manager import Manager

# -- formatting (pure) ----------------------------------------------------------------------


def human_duration(seconds: float | None) -> str:
    """Compact and readable at a glance: `42s`, `29m59s`, `3h59m`, `2d3h`; `-` for None."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600}h"


def human_age(seconds: float) -> str:
    """An age needs less precision than a countdown: `42s`, `12m`, `3h12m`, `2d3h`."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    return human_duration(s)


def human_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{int(value)}B"


# Countdown levels: `expired` (still on the clock past its deadline: the reaper has not run),
# `critical` (a minute or less), `warning` (inside the expiry-warning window), `ok`.
def ttl_level(left_s: float | None, warn_s: float) -> str | None:
    if left_s is None:
        return None
    if left_s <= 0:
        return "expired"
    if left_s <= 60:
        return "critical"
    if left_s <= warn_s:
        return "warning"
    return "ok"


SPARK_BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None], width: int, top: float | None = None) -> str:
    """The last `width` values as block characters, scaled to `top` (or their maximum)."""
    tail = [v for v in values if v is not None][-width:]
    if not tail:
        return ""
    high = top if top else max(tail)
    if high <= 0:
        return SPARK_BLOCKS[0] * len(tail)
    last = len(SPARK_BLOCKS) - 1
    return "".join(SPARK_BLOCKS[min(last, max(0, round(v / high * last)))] for v in tail)


def short_id_length(ids: Iterable[str], minimum: int = 14) -> int:
    """The shortest prefix length (at least `minimum`) that tells every id apart, git-style:
    any unique prefix is accepted by the CLI, so the short form can be typed back."""
    ordered = sorted(ids)
    need = minimum
    for a, b in zip(ordered, ordered[1:], strict=False):
        common = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            common += 1
        need = max(need, common + 1)
    return need


# -- one sandbox as the dashboard sees it ---------------------------------------------------


@dataclass(frozen=True, eq=False)
class SandboxRow:
    """A sandbox row with its times parsed once (rows are re-parsed only when they change)."""

    id: str
    name: str | None
    profile: str
    backend: str
    state: str
    owner: str
    task: str | None
    labels: dict[str, str]
    created_at: datetime
    deadline: datetime | None  # the effective one (idle limit included), when on the clock
    hard_deadline: datetime | None
    busy_by: str | None  # a lease held now: which process is working on it
    error: str | None
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_db(cls, row: Mapping[str, Any]) -> SandboxRow:
        on_clock = row["state"] in ON_THE_CLOCK
        return cls(
            id=row["id"], name=row["name"], profile=row["profile"], backend=row["backend"],
            state=row["state"], owner=row["owner"], task=row["task"],
            labels=json.loads(row["labels_json"] or "{}"),
            created_at=from_iso(row["created_at"]),
            deadline=effective_deadline(row) if on_clock else None,
            hard_deadline=from_iso(row["hard_deadline"]),
            busy_by=row["lease_owner"], error=row["error"], raw=dict(row),
        )

    def ttl_left(self, now: datetime) -> float | None:
        return None if self.deadline is None else (self.deadline - now).total_seconds()

    def age(self, now: datetime) -> float:
        return (now - self.created_at).total_seconds()

    def label_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.labels.items())


# -- filter and sort (pure) -----------------------------------------------------------------

FILTER_FIELDS = ("id", "name", "profile", "backend", "state", "owner", "task")


def matches(row: SandboxRow, query: str) -> bool:
    """Every word must match. `field:value` matches that field (`state:running`,
    `label:team=core`); a bare word matches any field or label, case-insensitive."""
    for word in query.lower().split():
        key, sep, value = word.partition(":")
        if sep and key in FILTER_FIELDS:
            if value not in str(getattr(row, key) or "").lower():
                return False
        elif sep and key in ("label", "labels"):
            if value not in row.label_text().lower():
                return False
        else:
            haystack = " ".join(str(getattr(row, f) or "") for f in FILTER_FIELDS)
            if word not in f"{haystack} {row.label_text()}".lower():
                return False
    return True


# The columns the table can be sorted by, in the order `o` cycles through them.
SORT_COLUMNS = ("created", "name", "profile", "backend", "state", "owner", "ttl", "cpu", "mem")
_STATE_ORDER = {s.value: i for i, s in enumerate(State)}
_LAST = float("inf")


def sort_key(row: SandboxRow, column: str, now: datetime,
             latest: Mapping[str, Any] | None = None) -> tuple:
    """A key on raw values (seconds, bytes, percent), never on the formatted text; rows
    without a value sort last; ties keep creation order."""
    tie = (row.created_at, row.id)
    if column == "created":
        return (0, *tie)
    if column == "ttl":
        left = row.ttl_left(now)
        return (left is None, left if left is not None else _LAST, *tie)
    if column in ("cpu", "mem"):
        value = (latest or {}).get("cpu_pct" if column == "cpu" else "memory_bytes")
        return (value is None, -(value or 0), *tie)  # the busiest first
    if column == "state":
        return (_STATE_ORDER.get(row.state, 99), *tie)
    value = getattr(row, column)
    return (value is None, (value or "").lower(), *tie)


# -- actions: which applies, and the command line that does the same ------------------------

MUTATING = frozenset({"new", "destroy", "extend", "extend_by", "snapshot", "restore",
                      "pause", "exec", "shell", "touch"})


def available(action: str, row: SandboxRow, capabilities: frozenset[str],
              has_shell: bool = False) -> bool:
    """Whether `action` applies to this sandbox in its state on its backend."""
    state = row.state
    if action == "destroy":
        return state != State.DESTROYED
    if action in ("extend", "extend_by"):
        return state in ON_THE_CLOCK
    if action == "touch":
        return state in ACTIVE
    if action == "pause":
        return state in ACTIVE and "pause" in capabilities
    if action == "snapshot":
        return state in ACTIVE and "snapshot" in capabilities
    if action == "restore":
        return "snapshot" in capabilities
    if action == "exec":
        return state == State.RUNNING and "exec" in capabilities
    if action == "shell":
        return state == State.RUNNING and has_shell
    if action == "logs":
        return state in ACTIVE and "logs" in capabilities
    return True


def equivalent_command(verb: str, ids: Sequence[str] = (), *args: str) -> str:
    """The `sbx` command line doing what the dashboard is about to do."""
    return shlex.join(["sbx", verb, *ids, *args])


def create_command(profile: str, ttl: str | None = None, name: str | None = None,
                   labels: Mapping[str, str] | None = None) -> str:
    argv = ["sbx", "create", "--profile", profile]
    if ttl:
        argv += ["--ttl", ttl]
    if name:
        argv += ["--name", name]
    for key, value in (labels or {}).items():
        argv += ["--label", f"{key}={value}"]
    return shlex.join(argv)


def shell_argv(row: Mapping[str, Any]) -> list[str] | None:
    """An interactive shell in the sandbox, as a command to hand the terminal to; None when
    its backend has none here. (The adapter contract has no interactive call yet, so this
    knows Docker's CLI; the `docker` command honours DOCKER_HOST like the adapter does.)"""
    if row["backend"] == "docker" and row["backend_ref"] and row["state"] == State.RUNNING:
        docker = shutil.which("docker")
        if docker:
            return [docker, "exec", "-it", row["backend_ref"], "sh"]
    return None


def one_line(exc: BaseException) -> str:
    """The one-line message a person sees for any error (never a traceback)."""
    return " ".join(str(exc).split()) or type(exc).__name__


@dataclass
class Outcome:
    """What one action did, to tell the person in one notification."""

    verb: str
    done: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    command: str = ""
    result: Any = None

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def severity(self) -> str:
        if self.failed:
            return "error"
        return "warning" if self.notes else "information"

    def message(self) -> str:
        lines = []
        if self.done:
            shown = ", ".join(self.done[:3]) + (f" and {len(self.done) - 3} more"
                                                 if len(self.done) > 3 else "")
            lines.append(f"{self.verb} {shown}")
        lines += [f"{sid}: {error}" for sid, error in self.failed[:3]]
        if len(self.failed) > 3:
            lines.append(f"... and {len(self.failed) - 3} more failed")
        lines += self.notes
        return "\n".join(lines) or f"{self.verb}: nothing to do"


@dataclass(frozen=True)
class CommandRecord:
    """One line of the dashboard's command log: what it ran, when, and how it ended."""

    time: datetime
    command: str
    ok: bool
    outcome: str


# -- backend health -------------------------------------------------------------------------


@dataclass(frozen=True)
class BackendStatus:
    """`connecting` (not asked yet, or asking), `up`, `down` (unreachable), `no-credentials`,
    `broken` (the adapter cannot be loaded)."""

    name: str
    state: str
    detail: str
    test_double: bool = False


async def check_backend(mgr: Manager, name: str, timeout_s: float = 5.0) -> BackendStatus:
    """Never raises: a backend that does not answer in time is `down`."""
    try:
        adapter = mgr.adapter(name)
    except Exception as exc:
        return BackendStatus(name, "broken", one_line(exc))
    double = bool(getattr(adapter, "test_double", False))
    try:
        health = await asyncio.wait_for(adapter.health(), timeout_s)
    except TimeoutError:
        return BackendStatus(name, "down", f"no answer in {timeout_s:g}s", double)
    except Exception as exc:
        return BackendStatus(name, "down", one_line(exc), double)
    if not health.credentials:
        state = "no-credentials"  # not contacted, or the key was refused
    elif not health.reachable:
        state = "down"
    else:
        state = "up"
    return BackendStatus(name, state, " ".join(health.detail.split()), double)


# -- metrics --------------------------------------------------------------------------------


class MetricsBuffer:
    """The last samples of each sandbox, fed from any thread (the sampler's loop), read by
    the UI. Keeps `size` samples per sandbox and remembers which ones changed."""

    def __init__(self, size: int = 30) -> None:
        self.size = size
        self._series: dict[str, deque[dict[str, Any]]] = {}
        self._changed: set[str] = set()
        self._lock = threading.Lock()

    def add(self, sample: Mapping[str, Any]) -> None:
        sandbox_id = sample["sandbox_id"]
        with self._lock:
            series = self._series.setdefault(sandbox_id, deque(maxlen=self.size))
            if series and series[-1]["time"] >= sample["time"]:
                return  # already seen (a stored sample read back, or a replay)
            series.append(dict(sample))
            self._changed.add(sandbox_id)

    def take_changed(self) -> set[str]:
        with self._lock:
            changed, self._changed = self._changed, set()
        return changed

    def series(self, sandbox_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._series.get(sandbox_id, ()))

    def latest(self, sandbox_id: str) -> dict[str, Any] | None:
        with self._lock:
            series = self._series.get(sandbox_id)
            return dict(series[-1]) if series else None

    def forget(self, keep: Iterable[str]) -> None:
        keep = set(keep)
        with self._lock:
            for sandbox_id in [s for s in self._series if s not in keep]:
                del self._series[sandbox_id]


def recent_samples(mgr: Manager, since: datetime) -> list[dict[str, Any]]:
    """Stored samples of every sandbox since `since`, oldest first (one query): what another
    process (`sbx metrics --all`) or an earlier session recorded."""
    import sqlalchemy as sa

    from core.models import MetricSample

    samples = MetricSample.__table__
    with mgr.db.read() as conn:
        return [dict(r) for r in conn.execute(
            sa.select(samples).where(samples.c.time >= to_iso(since))
            .order_by(samples.c.time, samples.c.id)).mappings()]


# -- the inventory, read each tick ----------------------------------------------------------


@dataclass
class Inventory:
    """One read of the inventory: every row, and which changed since the previous read."""

    rows: dict[str, SandboxRow]
    added: list[str]
    changed: list[str]
    removed: list[str]
    now: datetime

    @property
    def any_change(self) -> bool:
        return bool(self.added or self.changed or self.removed)


class InventoryReader:
    """Reads the sandboxes every tick, cheaply: on SQLite, through a read-only connection of
    its own (no ORM, as `sbx ls` does), where `PRAGMA data_version` says whether anyone
    committed since the last read; when nobody did, nothing is read. Only rows whose values
    changed are parsed again. `fallback(include_all)` reads through the Manager (which
    migrates) when the database is not a current SQLite file."""

    def __init__(self, url: str, clock: Clock,
                 fallback: Callable[[bool], list[dict[str, Any]]],
                 include_all: bool = False) -> None:
        self.url = url
        self.clock = clock
        self.fallback = fallback
        self.include_all = include_all
        self._raw: dict[str, dict[str, Any]] = {}
        self._rows: dict[str, SandboxRow] = {}
        self._conn: sqlite3.Connection | None = None
        self._version: int | None = None
        self._closed = False
        self._lock = threading.Lock()  # a read and close() run on different worker threads

    def set_include_all(self, include_all: bool) -> None:
        with self._lock:
            if include_all != self.include_all:
                self.include_all = include_all
                self._version = None  # read again

    def _read_rows(self) -> list[dict[str, Any]] | None:
        from core import inventory

        if self._closed:
            return None
        if self._conn is None:
            self._conn = inventory.open_sqlite_readonly(self.url, any_thread=True)
        if self._conn is not None:
            version = self._conn.execute("PRAGMA data_version").fetchone()[0]
            if version == self._version:
                return None
            rows = inventory.list_sandboxes(self._conn, include_all=self.include_all)
            self._version = version
            return rows
        return self.fallback(self.include_all)  # no current SQLite file (yet): the Manager

    def read(self) -> Inventory:
        with self._lock:
            now = self.clock.now()
            rows = self._read_rows()
            if rows is None:
                return Inventory(dict(self._rows), [], [], [], now)
            added, changed = [], []
            fresh_raw: dict[str, dict[str, Any]] = {}
            fresh: dict[str, SandboxRow] = {}
            for raw in rows:
                sid = raw["id"]
                fresh_raw[sid] = raw
                old = self._raw.get(sid)
                if old == raw:
                    fresh[sid] = self._rows[sid]
                    continue
                fresh[sid] = SandboxRow.from_db(raw)
                (changed if old is not None else added).append(sid)
            removed = [sid for sid in self._raw if sid not in fresh_raw]
            self._raw, self._rows = fresh_raw, fresh
            return Inventory(dict(fresh), added, changed, removed, now)

    def close(self) -> None:
        """After the read in progress, if any: closing SQLite's connection under a running
        statement crashed the process (seen when the dashboard quit mid-refresh)."""
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None


# -- profiles for the picker ----------------------------------------------------------------


@dataclass(frozen=True)
class ProfileChoice:
    name: str
    backend: str | None
    description: str
    summary: list[tuple[str, str]]  # (field, value) lines shown beside the list
    error: str | None = None


def profile_choices() -> list[ProfileChoice]:
    """Every profile on the search path, resolved; an invalid one carries its error."""
    from core.profiles import ProfileLoader

    loader = ProfileLoader()
    choices = []
    for name, path in loader.names().items():
        try:
            profile = loader.load(name)
        except BadInput as exc:
            choices.append(ProfileChoice(name, None, "", [("source", str(path))], one_line(exc)))
            continue
        choices.append(ProfileChoice(profile.name, profile.backend, profile.description,
                                     profile_summary(profile, path)))
    return choices


def profile_summary(profile: Any, path: Any = None) -> list[tuple[str, str]]:
    from core.durations import format_duration

    res, ttl, net = profile.resources, profile.ttl, profile.network
    lines = [("backend", profile.backend),
             ("image", profile.image or profile.template or "-"),
             ("cpu", f"{res.cpu:g}"),
             ("memory", human_bytes(res.memory) if res.memory else "unlimited"),
             ("pids", str(res.pids) if res.pids else "unlimited"),
             ("network", net.mode + (f" (allow {', '.join(net.allow)})" if net.allow else "")),
             ("ttl", f"default {format_duration(ttl.default)}, max {format_duration(ttl.max)}"
                     + (f", idle {format_duration(ttl.idle)}" if ttl.idle else ""))]
    if profile.labels:
        lines.append(("labels", ", ".join(f"{k}={v}" for k, v in profile.labels.items())))
    if profile.secrets:  # references only, never values
        lines.append(("secrets", ", ".join(f"{k} <- {v}" for k, v in profile.secrets.items())))
    if profile.setup:
        lines.append(("setup", f"{len(profile.setup)} command(s)"))
    if path is not None:
        lines.append(("source", str(path)))
    return lines


@dataclass(frozen=True)
class CreateArgs:
    profile: str
    ttl: timedelta | None
    ttl_text: str | None
    name: str | None
    labels: dict[str, str]

    @property
    def command(self) -> str:
        return create_command(self.profile, self.ttl_text, self.name, self.labels)


def parse_create_args(profile: str, ttl: str = "", name: str = "",
                      labels: str = "") -> CreateArgs:
    """The picker's fields, checked as `sbx create` checks them (BadInput naming the field)."""
    from core.durations import parse_duration
    from core.ids import validate_name
    from core.labels import parse_labels

    ttl_text, name_text = ttl.strip() or None, name.strip() or None
    ttl_delta = parse_duration(ttl_text, "ttl") if ttl_text else None
    if name_text:
        validate_name(name_text)
    parsed = parse_labels(t.strip() for t in labels.split(",") if t.strip())
    return CreateArgs(profile, ttl_delta, ttl_text, name_text, parsed)


# -- the background loop --------------------------------------------------------------------


class CoreLoop:
    """An asyncio loop in a daemon thread, where every core call of the dashboard runs."""

    def __init__(self, workers: int = 64) -> None:
        self.loop = asyncio.new_event_loop()
        # metric streams and log reads each hold a thread for a while: room for many
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="sbx-io")
        self.loop.set_default_executor(self.executor)
        self._thread = threading.Thread(target=self.loop.run_forever, name="sbx-core",
                                        daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[Any]) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]

    def call(self, fn: Callable[..., Any], *args: Any) -> Future:
        async def in_executor() -> Any:
            return await self.loop.run_in_executor(None, fn, *args)

        return self.run(in_executor())

    def stop(self, timeout: float = 5.0) -> None:
        if not self.loop.is_running():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        self.executor.shutdown(wait=False, cancel_futures=True)


# -- the dashboard service ------------------------------------------------------------------


class Dashboard:
    """The dashboard's one handle on the core: a Manager (the CLI's), the background loop,
    the inventory reader, health, metrics, and one method per action."""

    def __init__(self, manager: Manager | None = None, *, sample_metrics: bool = True,
                 backends: Sequence[str] | None = None, include_all: bool = False) -> None:
        self._manager = manager
        self._clock = manager.clock if manager is not None else None
        self._url = manager.db.url if manager is not None else None
        self.sample_metrics = sample_metrics
        self.fixed_backends = list(backends) if backends is not None else None
        self.include_all = include_all
        self.metrics = MetricsBuffer()
        self.core = CoreLoop()
        self._reader: InventoryReader | None = None
        self._sampler_stop: asyncio.Event | None = None
        self._sampler: Future | None = None
        self._capabilities: dict[str, frozenset[str]] = {}
        self._profile_backends: set[str] | None = None
        self.command_log: deque[CommandRecord] = deque(maxlen=500)
        self._warn_s: float | None = None
        self._manager_lock = threading.Lock()

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def mgr(self) -> Manager:
        """The Manager, made on first use (importing it is the slow part of starting: the
        first inventory is read without it)."""
        with self._manager_lock:  # asked for from the core's threads at once
            if self._manager is None:
                from core.db import Database
                from core.manager import Manager

                self._manager = Manager(Database(self.database_url), clock=self.clock)
        return self._manager

    @property
    def clock(self) -> Clock:
        if self._clock is None:
            from core.clock import clock_from_env

            self._clock = clock_from_env()
        return self._clock

    @property
    def database_url(self) -> str:
        if self._url is None:
            from core import settings

            self._url = settings.database_url()
        return self._url

    def now(self) -> datetime:
        return self.clock.now()

    def run(self, coro: Awaitable[Any]) -> Future:
        return self.core.run(coro)

    def call(self, fn: Callable[..., Any], *args: Any) -> Future:
        return self.core.call(fn, *args)

    def warn_seconds(self) -> float:
        """The expiry-warning window (`SBX_EXPIRY_WARNING`): the countdown turns yellow."""
        if self._warn_s is None:
            from core import settings

            try:
                self._warn_s = settings.expiry_warning().total_seconds()
            except BadInput:
                self._warn_s = 300.0
        return self._warn_s

    def close(self) -> None:
        """Stop the sampler, close the Manager's adapters and the database; stop the loop."""
        if self._sampler_stop is not None:
            self.core.loop.call_soon_threadsafe(self._sampler_stop.set)
        with contextlib.suppress(Exception):
            if self._sampler is not None:
                self._sampler.result(timeout=3)
        if self._reader is not None:
            self._reader.close()
        if self._manager is not None:
            with contextlib.suppress(Exception):
                self.run(self._manager.close()).result(timeout=3)
        self.core.stop()

    # -- reading ----------------------------------------------------------------------------

    def read_inventory(self) -> Inventory:
        """The inventory now (call through `call`: it reads the database)."""
        if self._reader is None:
            self._reader = InventoryReader(
                self.database_url, self.clock,
                lambda include_all: self.mgr.list(include_all=include_all), self.include_all)
        self._reader.set_include_all(self.include_all)
        inventory = self._reader.read()
        if self._manager is not None:  # else: loaded with the health check, after paint
            self.load_capabilities(r.backend for r in inventory.rows.values())
        if self.sample_metrics and inventory.removed:
            self.metrics.forget(inventory.rows)
        return inventory

    def capabilities(self, backend: str) -> frozenset[str]:
        if backend not in self._capabilities:
            try:
                adapter = self.mgr.adapter(backend)
                from adapters.base import Capability

                caps = frozenset(c.value for c in Capability
                                 if c != Capability.MEMORY_CHECKPOINT and adapter.supports(c))
            except Exception:
                caps = frozenset()
            self._capabilities[backend] = caps
        return self._capabilities[backend]

    def load_capabilities(self, backends: Iterable[str]) -> None:
        for backend in set(backends) - self._capabilities.keys():
            self.capabilities(backend)

    def known_capabilities(self, backend: str) -> frozenset[str]:
        """What is known without loading anything (for the UI thread)."""
        return self._capabilities.get(backend, frozenset())

    def watched_backends(self, in_use: Iterable[str]) -> list[str]:
        """The backends in the header: every registered one that is not a test double, and
        any backend a sandbox or a profile uses."""
        if self.fixed_backends is not None:
            return self.fixed_backends
        from adapters import registry

        if self._profile_backends is None:
            with contextlib.suppress(Exception):
                self._profile_backends = {c.backend for c in profile_choices() if c.backend}
        used = set(in_use) | (self._profile_backends or set())
        names = []
        for name in registry.names():
            try:
                double = registry.load_class(name).test_double
            except Exception:
                double = False
            if not double or name in used:
                names.append(name)
        return names

    async def health(self, names: Sequence[str], timeout_s: float = 5.0) -> list[BackendStatus]:
        return list(await asyncio.gather(*(check_backend(self.mgr, n, timeout_s)
                                           for n in names)))

    def seed_metrics(self, window: timedelta = timedelta(minutes=5)) -> None:
        """Fill the sparklines from samples stored by this or another process."""
        for sample in recent_samples(self.mgr, self.now() - window):
            self.metrics.add(sample)

    def start_sampler(self, refresh: timedelta = timedelta(seconds=2)) -> None:
        """Stream every running sandbox's metrics into the buffer (and, at a bounded rate,
        into the database, as `sbx metrics --all` does)."""
        if not self.sample_metrics or self._sampler is not None:
            return
        from core.sampler import follow_all

        async def sample() -> None:
            self._sampler_stop = asyncio.Event()
            await follow_all(self.mgr, self.metrics.add, self._sampler_stop, refresh)

        self._sampler = self.run(sample())

    def events(self, sandbox_id: str, after_id: int = 0) -> list[dict[str, Any]]:
        from core.views import event_view

        return [event_view(r) for r in self.mgr.events(sandbox_id, after_id=after_id)]

    def metric_history(self, sandbox_id: str) -> list[dict[str, Any]]:
        return self.mgr.metric_history(sandbox_id)

    def checkpoints(self, sandbox_id: str | None = None) -> list[dict[str, Any]]:
        from core.checkpoints import Checkpoints

        return Checkpoints(self.mgr).list(sandbox_id)

    def checkpoint_tree(self, sandbox_id: str) -> list[dict[str, Any]]:
        """The lineage around one sandbox: every tree that holds one of its checkpoints, or
        the checkpoint it was restored from."""
        from core.checkpoints import Checkpoints

        store = Checkpoints(self.mgr)
        rows = store.list()
        origin = self.mgr.rows_by_ids([sandbox_id]).get(sandbox_id, {}).get("restored_from")
        roots = store.tree(rows)

        def holds(node: Mapping[str, Any]) -> bool:
            return node["sandbox_id"] == sandbox_id or node["id"] == origin or any(
                holds(child) for child in node["children"])

        return [root for root in roots if holds(root)]

    async def logs_tail(self, sandbox_id: str, lines: int = 500) -> str:
        chunks = [chunk async for chunk in self.mgr.logs(sandbox_id, tail=lines)]
        return b"".join(chunks).decode("utf-8", "replace")

    # -- actions ----------------------------------------------------------------------------

    def record(self, outcome: Outcome) -> Outcome:
        summary = ("; ".join(error for _, error in outcome.failed) if outcome.failed
                   else outcome.message().splitlines()[0])
        self.command_log.append(CommandRecord(self.now(), outcome.command, outcome.ok, summary))
        return outcome

    async def _each(self, verb: str, ids: Sequence[str], command: str,
                    fn: Callable[[str], Awaitable[str | None]]) -> Outcome:
        outcome = Outcome(verb, command=command)
        for sandbox_id in ids:
            try:
                note = await fn(sandbox_id)
                outcome.done.append(sandbox_id)
                if note:
                    outcome.notes.append(note)
            except Exception as exc:
                outcome.failed.append((sandbox_id, one_line(exc)))
        return self.record(outcome)

    async def create(self, args: CreateArgs, owner: str | None = None,
                     task: str | None = None) -> Outcome:
        from core.profiles import ProfileLoader

        outcome = Outcome("created", command=args.command)
        try:
            profile = await asyncio.to_thread(ProfileLoader().load, args.profile)
            row = await self.mgr.create(profile, ttl=args.ttl, name=args.name,
                                        labels=args.labels, owner=owner, task=task)
            outcome.done.append(row["id"] + (f" ({row['name']})" if row["name"] else ""))
            outcome.result = row
        except Exception as exc:
            outcome.failed.append((args.profile, one_line(exc)))
        return self.record(outcome)

    async def destroy(self, ids: Sequence[str]) -> Outcome:
        result = await self.mgr.destroy_many(list(ids))
        outcome = Outcome("destroyed", command=equivalent_command("destroy", ids, "--yes"))
        outcome.done = result["destroyed"] + result["already_destroyed"]
        outcome.failed = [(f["id"], f["error"]) for f in result["failed"]]
        return self.record(outcome)

    async def extend(self, ids: Sequence[str], by: timedelta) -> Outcome:
        from core.durations import format_duration

        text = format_duration(by)

        async def one(sandbox_id: str) -> str | None:
            row, capped = await self.mgr.extend(sandbox_id, by)
            return f"{sandbox_id}: capped at the hard deadline {row['hard_deadline']}" \
                if capped else None

        command = "; ".join(equivalent_command("extend", [i], text) for i in ids)
        return await self._each(f"extended by {text}", ids, command, one)

    async def touch(self, ids: Sequence[str]) -> Outcome:
        async def one(sandbox_id: str) -> None:
            await self.mgr.record_activity(sandbox_id)

        command = "; ".join(equivalent_command("touch", [i]) for i in ids)
        return await self._each("touched", ids, command, one)

    async def pause_or_resume(self, ids: Sequence[str]) -> Outcome:
        """Pause the running ones, resume the paused ones."""
        verbs = []

        async def one(sandbox_id: str) -> None:
            row = await asyncio.to_thread(self.mgr.resolve, sandbox_id)
            if row["state"] == State.PAUSED:
                await self.mgr.resume(sandbox_id)
                verbs.append("resumed")
            else:
                await self.mgr.pause(sandbox_id)
                verbs.append("paused")

        rows = await asyncio.to_thread(self.mgr.rows_by_ids, ids)
        command = "; ".join(equivalent_command(
            "resume" if rows.get(i, {}).get("state") == State.PAUSED else "pause", [i])
            for i in ids)
        outcome = await self._each("paused/resumed", ids, command, one)
        if verbs and len(set(verbs)) == 1:
            outcome.verb = verbs[0]
        return outcome

    async def snapshot(self, ids: Sequence[str], name: str | None = None) -> Outcome:
        from core.checkpoints import Checkpoints

        made = []

        async def one(sandbox_id: str) -> None:
            ckpt = await Checkpoints(self.mgr).snapshot(sandbox_id, name)
            made.append(ckpt["id"])

        command = "; ".join(equivalent_command("snapshot", [i]) for i in ids)
        outcome = await self._each("snapshot of", ids, command, one)
        if made:
            outcome.notes.append(f"checkpoint {', '.join(made)}")
            outcome.result = made
        return outcome

    async def restore(self, checkpoint_id: str, name: str | None = None) -> Outcome:
        from core.checkpoints import Checkpoints

        outcome = Outcome("restored", command=equivalent_command("restore", [checkpoint_id]))
        try:
            row = await Checkpoints(self.mgr).restore(checkpoint_id, name=name)
            outcome.done.append(f"{checkpoint_id} as {row['id']}")
            outcome.result = row
        except Exception as exc:
            outcome.failed.append((checkpoint_id, one_line(exc)))
        return self.record(outcome)

    async def exec(self, sandbox_id: str, command: str,
                   timeout: timedelta | None = None) -> Outcome:
        """Run a command line (split as a shell would, without a shell)."""
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise BadInput(f"bad command: {exc}") from None
        if not argv:
            raise BadInput("no command given")
        outcome = Outcome("ran", command=shlex.join(["sbx", "exec", sandbox_id, "--", *argv]))
        try:
            result = await self.mgr.exec(sandbox_id, argv, timeout=timeout)
            outcome.done.append(f"{shlex.join(argv)} (exit {result.exit_code})")
            outcome.result = result
        except Exception as exc:
            outcome.failed.append((sandbox_id, one_line(exc)))
        return self.record(outcome)

    def record_error(self, command: str, exc: BaseException) -> str:
        message = one_line(exc)
        self.command_log.append(CommandRecord(self.now(), command, False, message))
        return message
