"""What the dashboard shows and does, without any widget: its rows, the rules the screen
follows (filter, sort on raw values, countdown levels, which action applies to which sandbox,
the `sbx` command equivalent to each action), and `Dashboard`, its one handle on sbx.

`Dashboard` holds an `AsyncSandboxer`, the library the CLI uses, awaited on Textual's own
loop: the library keeps every database read and backend call off that loop (its core runs
on a loop and a thread of its own), so the screen never waits on I/O. Everything sbx knows
(the inventory and its changes, backend health, metrics, checkpoints) comes through the
library; this module only decides how to present it.
"""

from __future__ import annotations

import asyncio
import shlex
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sandboxer import BadInput, State
from sandboxer.core.rules.states import ACTIVE, ON_THE_CLOCK
from sandboxer_tui.formatting import exact_duration, human_bytes, one_line

if TYPE_CHECKING:
    from sandboxer import (
        AsyncCheckpoint,
        AsyncInventoryWatch,
        AsyncSandbox,
        AsyncSandboxer,
        BackendStatus,
        Event,
        ExecResult,
        MetricSample,
        Profile,
    )
    from sandboxer.core.rules.clock import Clock

# -- small pure rules -----------------------------------------------------------------------


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
    """A sandbox's record with the times the table reads every second parsed once (a row is
    made again only when its record changed). `record` is the library's handle."""

    id: str
    name: str | None
    profile: str
    backend: str
    state: State | str
    owner: str
    task: str | None
    labels: Mapping[str, str]
    created_at: datetime
    deadline: datetime | None  # the effective one (idle limit included), when on the clock
    hard_deadline: datetime | None
    error: str | None
    record: AsyncSandbox = field(repr=False)

    @classmethod
    def from_record(cls, box: AsyncSandbox) -> SandboxRow:
        view = box.to_dict()
        try:
            state: State | str = State(view["state"])
        except ValueError:  # written by a newer sbx: show the word
            state = view["state"]
        deadline = None
        if state in ON_THE_CLOCK:
            deadline = min(t for t in (box.deadline, box.idle_deadline) if t is not None)
        return cls(id=box.id, name=box.name, profile=box.profile, backend=box.backend,
                   state=state, owner=box.owner, task=box.task, labels=dict(box.labels),
                   created_at=box.created_at, deadline=deadline,
                   hard_deadline=box.hard_deadline, error=box.error, record=box)

    def ttl_left(self, now: datetime) -> float | None:
        return None if self.deadline is None else (self.deadline - now).total_seconds()

    def age(self, now: datetime) -> float:
        return (now - self.created_at).total_seconds()

    def label_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.labels.items())


@dataclass(frozen=True)
class SandboxDetail:
    """What the overview shows beyond the record, read once per sandbox (it never changes):
    the resolved profile it was made from and the checkpoint it was restored from."""

    profile: Mapping[str, Any]
    origin: str | None


@dataclass
class Inventory:
    """One read of the inventory: every row, which changed since the previous read, and how
    many are in each state (kept up to date from the changes, not counted again)."""

    rows: dict[str, SandboxRow]
    added: list[str]
    changed: list[str]
    removed: list[str]
    now: datetime
    counts: Mapping[str, int] = field(default_factory=dict)

    @property
    def any_change(self) -> bool:
        return bool(self.added or self.changed or self.removed)


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
_STATE_ORDER = {s: i for i, s in enumerate(State)}
_LAST = float("inf")


def sort_key(row: SandboxRow, column: str, now: datetime,
             latest: MetricSample | None = None) -> tuple:
    """A key on raw values (seconds, bytes, percent), never on the formatted text; rows
    without a value sort last; ties keep creation order."""
    tie = (row.created_at, row.id)
    if column == "created":
        return (0, *tie)
    if column == "ttl":
        left = row.ttl_left(now)
        return (left is None, left if left is not None else _LAST, *tie)
    if column in ("cpu", "mem"):
        value = None if latest is None else (
            latest.cpu_pct if column == "cpu" else latest.memory_bytes)
        return (value is None, -(value or 0), *tie)  # the busiest first
    if column == "state":
        return (_STATE_ORDER.get(row.state, 99), *tie)
    value = getattr(row, column)
    return (value is None, (value or "").lower(), *tie)


# -- actions: which applies, and the command line that does the same ------------------------

MUTATING = frozenset({"new", "destroy", "extend", "extend_by", "snapshot", "restore",
                      "pause", "exec", "shell", "touch"})


def available(action: str, row: SandboxRow, capabilities: frozenset[str]) -> bool:
    """Whether `action` applies to this sandbox in its state, given its backend's
    capabilities (the values of `sandboxer.adapters.base.Capability`)."""
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
        return state == State.RUNNING and ("pty" in capabilities or "shell" in capabilities)
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


# -- backend health, as the header words it -------------------------------------------------


def health_state(status: BackendStatus) -> str:
    """`up`, `down` (unreachable), `no-credentials`, `broken` (the adapter cannot be
    loaded); the header shows `connecting` until a backend was first asked."""
    if not status.loaded:
        return "broken"
    if status.credentials is False:
        return "no-credentials"  # not contacted, or the key was refused
    if not status.reachable:
        return "down"
    return "up"


# -- metrics --------------------------------------------------------------------------------


class MetricsBuffer:
    """The last samples of each sandbox, fed by the metrics worker, read by the table on the
    clock's tick. Keeps `size` samples per sandbox and remembers which ones changed."""

    def __init__(self, size: int = 30) -> None:
        self.size = size
        self._series: dict[str, deque[MetricSample]] = {}
        self._changed: set[str] = set()

    def add(self, sample: MetricSample) -> None:
        series = self._series.setdefault(sample.sandbox_id, deque(maxlen=self.size))
        if series and series[-1].time >= sample.time:
            return  # already seen (a stored sample read back, or a replay)
        series.append(sample)
        self._changed.add(sample.sandbox_id)

    def take_changed(self) -> set[str]:
        changed, self._changed = self._changed, set()
        return changed

    def series(self, sandbox_id: str) -> list[MetricSample]:
        return list(self._series.get(sandbox_id, ()))

    def latest(self, sandbox_id: str) -> MetricSample | None:
        series = self._series.get(sandbox_id)
        return series[-1] if series else None

    def forget(self, keep: Iterable[str]) -> None:
        keep = set(keep)
        for sandbox_id in [s for s in self._series if s not in keep]:
            del self._series[sandbox_id]


# -- checkpoints ----------------------------------------------------------------------------


def lineage_around(nodes: Sequence[Mapping[str, Any]], sandbox_id: str,
                   origin: str | None) -> list[Mapping[str, Any]]:
    """The trees (`sandboxer.lineage` nodes) that hold one of the sandbox's checkpoints, or
    the checkpoint it was restored from."""
    def holds(node: Mapping[str, Any]) -> bool:
        return node["sandbox_id"] == sandbox_id or node["id"] == origin or any(
            holds(child) for child in node["children"])

    return [root for root in nodes if holds(root)]


# -- profiles for the picker ----------------------------------------------------------------


@dataclass(frozen=True)
class ProfileChoice:
    name: str
    backend: str | None
    description: str
    summary: list[tuple[str, str]]  # (field, value) lines shown beside the list
    error: str | None = None


def profile_summary(profile: Profile, path: Any = None) -> list[tuple[str, str]]:
    res, ttl, net = profile.resources, profile.ttl, profile.network
    lines = [("backend", profile.backend),
             ("image", profile.image or profile.template or "-"),
             ("cpu", f"{res.cpu:g}"),
             ("memory", human_bytes(res.memory) if res.memory else "unlimited"),
             ("pids", str(res.pids) if res.pids else "unlimited"),
             ("network", net.mode + (f" (allow {', '.join(net.allow)})" if net.allow else "")),
             ("ttl", f"default {exact_duration(ttl.default)}, max {exact_duration(ttl.max)}"
                     + (f", idle {exact_duration(ttl.idle)}" if ttl.idle else ""))]
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
    from sandboxer.core.rules.durations import parse_duration
    from sandboxer.core.rules.ids import validate_name
    from sandboxer.core.rules.labels import parse_labels

    ttl_text, name_text = ttl.strip() or None, name.strip() or None
    ttl_delta = parse_duration(ttl_text, "ttl") if ttl_text else None
    if name_text:
        validate_name(name_text)
    parsed = parse_labels(t.strip() for t in labels.split(",") if t.strip())
    return CreateArgs(profile, ttl_delta, ttl_text, name_text, parsed)


def parse_command_line(command: str) -> list[str]:
    """A command line typed in the exec screen, split as a shell would (without a shell)."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise BadInput(f"bad command: {exc}") from None
    if not argv:
        raise BadInput("no command given")
    return argv


# -- the dashboard's handle on sbx ----------------------------------------------------------


class Dashboard:
    """The library client (`AsyncSandboxer`, defaults as the CLI's), the inventory watch, the
    capabilities and health of the backends, the metrics buffer, the command log, and one
    method per action. `backends`: the ones the header shows (default: every installed one
    that is not a test double, and any that a sandbox or a profile uses)."""

    def __init__(self, sandboxer: AsyncSandboxer | None = None, *, clock: Clock | None = None,
                 backends: Sequence[str] | None = None, sample_metrics: bool = True,
                 include_destroyed: bool = False) -> None:
        if sandboxer is None:  # as the CLI's: a client of the service at SBX_URL, if any
            from sandboxer import AsyncSandboxer
            from sandboxer.core.rules.settings import service_token, service_url

            url = service_url()
            sandboxer = AsyncSandboxer(url=url, token=service_token()) if url \
                else AsyncSandboxer()
        if clock is None:
            from sandboxer.core.rules.clock import clock_from_env

            clock = clock_from_env()
        self.sbx = sandboxer
        self.clock = clock
        self.fixed_backends = list(backends) if backends is not None else None
        self.sample_metrics = sample_metrics
        self.metrics = MetricsBuffer()
        self.command_log: deque[CommandRecord] = deque(maxlen=500)
        self._include_destroyed = include_destroyed
        self._watch: AsyncInventoryWatch | None = None
        self._rows: dict[str, SandboxRow] = {}
        # kept from each read's changes, so nothing per second walks every row (issue 36)
        self._states: Counter[str] = Counter()
        self._backends: Counter[str] = Counter()
        self._running: Counter[str] = Counter()  # running sandboxes per backend
        self._capabilities: dict[str, frozenset[str]] = {}
        self._registered: list[BackendStatus] | None = None
        self._profile_backends: set[str] | None = None
        self._details: dict[str, SandboxDetail] = {}
        self._warn_s: float | None = None

    def now(self) -> datetime:
        return self.clock.now()

    def warn_seconds(self) -> float:
        """The expiry-warning window (`SBX_EXPIRY_WARNING`): the countdown turns yellow."""
        if self._warn_s is None:
            from sandboxer.core.rules import settings

            try:
                self._warn_s = settings.expiry_warning().total_seconds()
            except BadInput:
                self._warn_s = 300.0
        return self._warn_s

    async def close(self, timeout_s: float = 5.0) -> None:
        """Stop watching; close the library client (its database and backends). A backend
        that does not let go within `timeout_s` does not hold the dashboard's exit."""
        import contextlib

        with contextlib.suppress(TimeoutError):
            if self._watch is not None:
                await asyncio.wait_for(self._watch.aclose(), timeout_s)
            await asyncio.wait_for(self.sbx.close(), timeout_s)

    # -- the inventory ----------------------------------------------------------------------

    @property
    def include_destroyed(self) -> bool:
        return self._include_destroyed

    @include_destroyed.setter
    def include_destroyed(self, include: bool) -> None:
        self._include_destroyed = include
        if self._watch is not None:
            self._watch.include_destroyed = include

    async def read_inventory(self) -> Inventory:
        """The inventory now, and what changed since the previous read (nothing is read
        when nobody committed)."""
        if self._watch is None:
            self._watch = self.sbx.watch(include_destroyed=self._include_destroyed)
        change = await self._watch.read()
        rows = [SandboxRow.from_record(box) for box in (*change.added, *change.changed)]
        before = [self._rows[row.id] for row in rows if row.id in self._rows]
        for row in rows:
            self._rows[row.id] = row
        for sandbox_id in change.removed:
            if sandbox_id in self._rows:
                before.append(self._rows.pop(sandbox_id))
            self._details.pop(sandbox_id, None)
        self._count(rows, Counter.update)
        self._count(before, Counter.subtract)
        if change.removed:
            self.metrics.forget(self._rows)
        return Inventory(dict(self._rows), [b.id for b in change.added],
                         [b.id for b in change.changed], list(change.removed), self.now(),
                         {state: n for state, n in self._states.items() if n})

    def _count(self, rows: list[SandboxRow], how: Any) -> None:
        """Add (`Counter.update`) or take away (`Counter.subtract`) rows from the counts."""
        how(self._states, Counter(row.state for row in rows))
        how(self._backends, Counter(row.backend for row in rows))
        how(self._running, Counter(row.backend for row in rows if row.state == State.RUNNING))

    def backends_in_use(self) -> set[str]:
        """The backends of the sandboxes in the inventory."""
        return {backend for backend, n in self._backends.items() if n}

    def metrics_to_follow(self) -> bool:
        """Whether a running sandbox is on a backend known to report metrics: following
        them lists the running sandboxes every few seconds, worth it only then."""
        return any(n and "metrics" in self.known_capabilities(backend)
                   for backend, n in self._running.items())

    async def detail(self, row: SandboxRow) -> SandboxDetail:
        if row.id not in self._details:
            profile, origin = await asyncio.gather(row.record.profile_resolved(),
                                                   row.record.origin())
            self._details[row.id] = SandboxDetail(profile, origin)
        return self._details[row.id]

    def known_detail(self, sandbox_id: str) -> SandboxDetail | None:
        return self._details.get(sandbox_id)

    # -- backends ---------------------------------------------------------------------------

    def known_capabilities(self, backend: str) -> frozenset[str]:
        """What is known so far (the screen asks often; nothing is read here)."""
        return self._capabilities.get(backend, frozenset())

    def capabilities_known(self) -> set[str]:
        """The backends whose capabilities were read."""
        return set(self._capabilities)

    async def load_capabilities(self, backends: Iterable[str]) -> None:
        missing = sorted(set(backends) - self._capabilities.keys())
        if missing:
            for status in await self.sbx.backends(missing, check=False):
                self._capabilities[status.name] = status.capabilities

    async def watched_backends(self, in_use: Iterable[str]) -> list[str]:
        """The backends in the header."""
        if self.fixed_backends is not None:
            return self.fixed_backends
        if self._registered is None:
            self._registered = await self.sbx.backends(check=False)
            for status in self._registered:
                self._capabilities.setdefault(status.name, status.capabilities)
        if self._profile_backends is None:
            try:
                self._profile_backends = {p.backend for p in await self.sbx.profiles()
                                          if p.backend}
            except Exception:
                self._profile_backends = set()
        used = set(in_use) | self._profile_backends
        return [s.name for s in self._registered if not s.test_double or s.name in used]

    async def health(self, names: Sequence[str], timeout_s: float = 5.0,
                     ) -> list[BackendStatus]:
        statuses = await self.sbx.backends(names, timeout=timeout_s)
        for status in statuses:
            self._capabilities[status.name] = status.capabilities
        return statuses

    # -- metrics, events, logs, checkpoints -------------------------------------------------

    async def seed_metrics(self, window: timedelta = timedelta(minutes=5)) -> None:
        """Fill the sparklines from samples stored by this or another process."""
        for sample in await self.sbx.recent_metrics(self.now() - window):
            self.metrics.add(sample)

    async def follow_metrics(self, every: timedelta = timedelta(seconds=2)) -> None:
        """Every running sandbox's samples into the buffer, until cancelled (the library
        stores them at a bounded rate, as `sbx metrics --all` does)."""
        async for sample in self.sbx.follow_all_metrics(every=every):
            self.metrics.add(sample)

    async def events(self, sandbox_id: str, after_id: int = 0) -> list[Event]:
        return await self.sbx.events(sandbox_id, after=after_id)

    async def metric_history(self, row: SandboxRow) -> list[MetricSample]:
        return await row.record.metric_history()

    async def checkpoints(self, sandbox_id: str | None = None) -> list[AsyncCheckpoint]:
        return await self.sbx.checkpoints(sandbox_id)

    async def checkpoint_tree(self, row: SandboxRow) -> list[Mapping[str, Any]]:
        """The lineage around one sandbox."""
        from sandboxer import lineage

        detail = self._details.get(row.id)
        origin = detail.origin if detail is not None else await row.record.origin()
        return lineage_around(lineage(await self.sbx.checkpoints()), row.id, origin)

    async def logs_tail(self, row: SandboxRow, lines: int = 500) -> str:
        chunks = [chunk async for chunk in row.record.logs(tail=lines)]
        return b"".join(chunks).decode("utf-8", "replace")

    async def profile_choices(self) -> list[ProfileChoice]:
        """Every profile on the search path, resolved; an invalid one carries its error."""
        choices = []
        for info in await self.sbx.profiles():
            if info.error:
                choices.append(ProfileChoice(info.name, None, "", [("source", info.source)],
                                             " ".join(info.error.split())))
                continue
            try:
                profile = await self.sbx.profile(info.name)
            except BadInput as exc:
                choices.append(ProfileChoice(info.name, None, "", [("source", info.source)],
                                             one_line(exc)))
                continue
            choices.append(ProfileChoice(profile.name, profile.backend, profile.description,
                                         profile_summary(profile, info.source)))
        return choices

    async def shell_command(self, row: SandboxRow) -> list[str]:
        return await row.record.shell_command()

    # -- actions ----------------------------------------------------------------------------

    def record(self, outcome: Outcome) -> Outcome:
        summary = ("; ".join(error for _, error in outcome.failed) if outcome.failed
                   else outcome.message().splitlines()[0])
        self.command_log.append(CommandRecord(self.now(), outcome.command, outcome.ok, summary))
        return outcome

    def record_error(self, command: str, exc: BaseException) -> str:
        message = one_line(exc)
        self.command_log.append(CommandRecord(self.now(), command, False, message))
        return message

    async def _each(self, verb: str, ids: Sequence[str], command: str, fn) -> Outcome:
        """`fn(handle)` on each sandbox in turn; one failure does not stop the others."""
        outcome = Outcome(verb, command=command)
        for sandbox_id in ids:
            try:
                note = await fn(await self.sbx.get(sandbox_id))
                outcome.done.append(sandbox_id)
                if note:
                    outcome.notes.append(note)
            except Exception as exc:
                outcome.failed.append((sandbox_id, one_line(exc)))
        return self.record(outcome)

    async def create(self, args: CreateArgs, owner: str | None = None,
                     task: str | None = None) -> Outcome:
        outcome = Outcome("created", command=args.command)
        try:
            box = await self.sbx.create(args.profile, ttl=args.ttl, name=args.name,
                                        labels=args.labels, owner=owner, task=task)
            outcome.done.append(box.id + (f" ({box.name})" if box.name else ""))
            outcome.result = box
        except Exception as exc:
            outcome.failed.append((args.profile, one_line(exc)))
        return self.record(outcome)

    async def destroy(self, ids: Sequence[str]) -> Outcome:
        outcome = Outcome("destroyed", command=equivalent_command("destroy", ids, "--yes"))
        try:
            result = await self.sbx.destroy(*ids)
        except Exception as exc:  # one of them is unknown: nothing was destroyed
            outcome.failed = [(sandbox_id, one_line(exc)) for sandbox_id in ids]
        else:
            outcome.done = result["destroyed"] + result["already_destroyed"]
            outcome.failed = [(f["id"], f["error"]) for f in result["failed"]]
        return self.record(outcome)

    async def extend(self, ids: Sequence[str], by: timedelta) -> Outcome:
        text = exact_duration(by)

        async def one(box: AsyncSandbox) -> str | None:
            capped = await box.extend(by)
            return (f"{box.id}: capped at the hard deadline {box.to_dict()['hard_deadline']}"
                    if capped else None)

        command = "; ".join(equivalent_command("extend", [i], text) for i in ids)
        return await self._each(f"extended by {text}", ids, command, one)

    async def touch(self, ids: Sequence[str]) -> Outcome:
        async def one(box: AsyncSandbox) -> None:
            await box.touch()

        command = "; ".join(equivalent_command("touch", [i]) for i in ids)
        return await self._each("touched", ids, command, one)

    async def pause_or_resume(self, ids: Sequence[str]) -> Outcome:
        """Pause the running ones, resume the paused ones."""
        verbs = []

        async def one(box: AsyncSandbox) -> None:
            if box.state == State.PAUSED:
                await box.resume()
                verbs.append("resumed")
            else:
                await box.pause()
                verbs.append("paused")

        command = "; ".join(equivalent_command(
            "resume" if i in self._rows and self._rows[i].state == State.PAUSED else "pause",
            [i]) for i in ids)
        outcome = await self._each("paused/resumed", ids, command, one)
        if verbs and len(set(verbs)) == 1:
            outcome.verb = verbs[0]
        return outcome

    async def snapshot(self, ids: Sequence[str], name: str | None = None) -> Outcome:
        made = []

        async def one(box: AsyncSandbox) -> None:
            made.append((await box.snapshot(name)).id)

        command = "; ".join(equivalent_command("snapshot", [i]) for i in ids)
        outcome = await self._each("snapshot of", ids, command, one)
        if made:
            outcome.notes.append(f"checkpoint {', '.join(made)}")
            outcome.result = made
        return outcome

    async def restore(self, checkpoint_id: str, name: str | None = None) -> Outcome:
        outcome = Outcome("restored", command=equivalent_command("restore", [checkpoint_id]))
        try:
            box = await (await self.sbx.checkpoint(checkpoint_id)).restore(name=name)
            outcome.done.append(f"{checkpoint_id} as {box.id}")
            outcome.result = box
        except Exception as exc:
            outcome.failed.append((checkpoint_id, one_line(exc)))
        return self.record(outcome)

    async def exec(self, sandbox_id: str, command: str,
                   timeout: timedelta | None = None) -> Outcome:
        """Run a command line (split as a shell would, without a shell); BadInput, with
        nothing run, for one that cannot be split."""
        argv = parse_command_line(command)
        outcome = Outcome("ran", command=shlex.join(["sbx", "exec", sandbox_id, "--", *argv]))
        try:
            result: ExecResult = await (await self.sbx.get(sandbox_id)).exec(argv, timeout)
            outcome.done.append(f"{shlex.join(argv)} (exit {result.exit_code})")
            outcome.result = result
        except Exception as exc:
            outcome.failed.append((sandbox_id, one_line(exc)))
        return self.record(outcome)
