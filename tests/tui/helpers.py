"""What the dashboard tests share: a stub backend that can also pause, snapshot and report
metrics (the registered `stub` test double offers only exec and logs), deterministic ids,
seeding through the core, the dashboard over a Manager of the test's own, and reading the
app's screen."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

from sandboxer.adapters.base import Artifact, BackendObject, Capability, CreateRequest, MetricSample
from sandboxer.adapters.stub import StubAdapter
from sandboxer.core.lifecycle.manager import Manager
from sandboxer.core.rules.clock import FrozenClock
from sandboxer.core.store.db import Database

STUB_PROFILE = """\
description: an in-process test double
backend: stub
ttl: {default: 30m, max: 4h}
labels: {team: core}
"""


class FullStub(StubAdapter):
    """The stub test double plus pause/resume, snapshot/restore and metrics, all in memory,
    so every dashboard action can be driven without an engine. Metrics are a fixed series
    on the given clock, one sample every 5 s."""

    capabilities = frozenset({Capability.EXEC, Capability.LOGS, Capability.PAUSE,
                              Capability.SNAPSHOT, Capability.METRICS})
    artifacts: ClassVar[dict[str, Artifact]] = {}
    snapshot_delay: ClassVar[float] = 0.0  # a slow backend, for progress in the row
    series: ClassVar[list[tuple[float, int]]] = [
        (2.0, 40), (15.0, 42), (60.0, 55), (35.0, 61), (80.0, 70), (20.0, 66), (5.0, 64)]

    def __init__(self, clock: FrozenClock | None = None) -> None:
        self.clock = clock

    @classmethod
    def reset(cls) -> None:
        super().reset()
        cls.artifacts.clear()
        cls.snapshot_delay = 0.0

    def _status(self, ref: str, status: str) -> None:
        obj = self.objects[ref]
        self.objects[ref] = BackendObject(obj.ref, obj.labels, status, status == "running",
                                          obj.created_at)

    async def pause(self, ref: str) -> None:
        self.calls.append(("pause", ref))
        self._maybe_fail("pause")
        self._status(ref, "paused")

    async def resume(self, ref: str) -> None:
        self.calls.append(("resume", ref))
        self._status(ref, "running")

    async def snapshot(self, ref: str, labels: Mapping[str, str]) -> Artifact:
        self.calls.append(("snapshot", ref))
        await asyncio.sleep(self.snapshot_delay)
        self._maybe_fail("snapshot")
        name = f"stub-image:{labels.get('sbx.checkpoint', len(self.artifacts))}"
        artifact = Artifact(name, dict(labels), 4 * 1024 * 1024)
        self.artifacts[name] = artifact
        return artifact

    async def restore(self, artifact: str, request: CreateRequest) -> BackendObject:
        self.calls.append(("restore", artifact))
        return await self.create(request)

    async def delete_artifact(self, artifact: str) -> None:
        self.artifacts.pop(artifact, None)

    async def list_artifacts(self, labels: Mapping[str, str]) -> list[Artifact]:
        want = dict(labels).items()
        return [a for a in self.artifacts.values() if want <= dict(a.labels).items()]

    async def metrics(self, ref: str) -> AsyncIterator[MetricSample]:
        start = self.clock.now() - timedelta(seconds=5 * len(self.series))
        for index, (cpu, mem_mb) in enumerate(self.series):
            yield MetricSample(start + timedelta(seconds=5 * (index + 1)), cpu_pct=cpu,
                               memory_bytes=mem_mb * 1024 * 1024,
                               memory_limit=512 * 1024 * 1024, net_rx_bytes=0,
                               net_tx_bytes=0, pids=3 + index % 3)


def write_stub_profile(folder: Path, name: str = "stub", body: str = STUB_PROFILE) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(body)
    return path


def make_manager(home: Path, clock: FrozenClock, actor: str = "alice") -> Manager:
    FullStub.reset()
    return Manager(Database(f"sqlite:///{home / 'sbx.db'}"), clock, actor=actor,
                   adapters={"stub": FullStub(clock)})


def make_dashboard(mgr: Manager, clock=None, **options: Any):
    """The dashboard's model over the library, the library over this Manager (its stub,
    its clock): what `sbx tui` builds, with the test's own backend and time."""
    from sandboxer import AsyncSandboxer
    from sandboxer._local import LocalTransport
    from sandboxer_tui.dashboard.model import Dashboard

    client = AsyncSandboxer(_transport=LocalTransport(manager=mgr))
    return Dashboard(client, clock=clock or mgr.clock, **options)


def deterministic_ids(monkeypatch) -> None:
    """Sandbox and checkpoint ids that are the same on every run (for snapshots)."""
    counter = itertools.count(1)
    alphabet = "0123456789abcdefghjkmnpqrstvwxyz"

    def sandbox_id() -> str:
        n = next(counter)
        return f"sbx-01kc{alphabet[n // 32]}{alphabet[n % 32]}7q4m9p2r8t6v3w5y1z0ab"

    def checkpoint_id() -> str:
        n = next(counter)
        return f"ckpt-01kc{alphabet[n // 32]}{alphabet[n % 32]}8h2k6n4s0d9f3g7j5x1ce"

    monkeypatch.setattr("sandboxer.core.lifecycle.manager.new_sandbox_id", sandbox_id)
    monkeypatch.setattr("sandboxer.core.lifecycle.checkpoints.new_checkpoint_id", checkpoint_id)


def run(coro) -> Any:
    return asyncio.run(coro)


async def store_metrics(mgr: Manager, sandbox_id: str) -> int:
    """Read the stub's metric series through the core, which stores it (as any front end
    reading metrics does)."""
    seen = 0
    async for _ in mgr.metrics(sandbox_id, follow=True):
        seen += 1
    return seen


async def seed_fleet(mgr: Manager, clock: FrozenClock) -> dict[str, dict[str, Any]]:
    """A varied inventory, made through the core over 50 minutes of frozen time:
    running, paused, failed, a restored fork with lineage, an owner written in markup,
    countdowns in every colour, stored metrics."""
    from sandboxer.core.lifecycle.checkpoints import Checkpoints
    from sandboxer.core.rules.profiles import ProfileLoader

    stub = ProfileLoader().load("stub")
    made = {}
    made["api"] = await mgr.create(stub, name="api-dev", ttl=timedelta(hours=2),
                                   task="build the payments api", labels={"env": "dev"})
    clock.advance(timedelta(minutes=10))
    made["ci"] = await mgr.create(stub, name="ci-runner-42", ttl=timedelta(minutes=40, seconds=45),
                                  owner="ci@build-7", labels={"ci": "true"})
    clock.advance(timedelta(minutes=5))
    made["evil"] = await mgr.create(stub, name="markup-owner", owner="[red]mallory[/red]",
                                    task="[bold]not bold[/bold]", ttl=timedelta(minutes=38),
                                    labels={"note": "[link=x]y"})
    clock.advance(timedelta(minutes=5))
    made["paused"] = await mgr.create(stub, name="batch-7", ttl=timedelta(minutes=25))
    await mgr.pause(made["paused"]["id"])
    FullStub.fail_next["create"] = RuntimeError("stub: out of capacity")
    try:
        await mgr.create(stub, name="broken", owner="bob@laptop")
    except Exception:
        pass
    made["broken"] = mgr.resolve("broken")
    clock.advance(timedelta(minutes=10))
    ckpt = await Checkpoints(mgr).snapshot(made["api"]["id"], "before-migration")
    made["fork"] = await Checkpoints(mgr).restore(ckpt["id"], name="api-fork",
                                                  ttl=timedelta(minutes=90))
    clock.advance(timedelta(minutes=20))
    for key in ("api", "ci", "fork"):
        await store_metrics(mgr, made[key]["id"])
    made["checkpoint"] = ckpt
    return made


# -- reading the screen ---------------------------------------------------------------------

_TAGS = re.compile(r"<[^>]+>")


def screen_text(app) -> str:
    """The text on the app's screen now (from its SVG export, tags stripped)."""
    import html

    svg = app.export_screenshot()
    lines = re.findall(r'<text class="[^"]*" x="[^"]*" y="([^"]*)"[^>]*>(.*?)</text>', svg)
    by_y: dict[float, list[str]] = {}
    for y, body in lines:
        by_y.setdefault(float(y), []).append(
            html.unescape(_TAGS.sub("", body)).replace("\xa0", " "))
    return "\n".join("".join(parts) for _, parts in sorted(by_y.items()))


async def wait_for(pilot, predicate, within: float = 30.0, step: float = 0.05,
                   what: str = "condition") -> None:
    """Let the app run until `predicate()` holds; fail after `within` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await pilot.pause(step)


async def settle(pilot) -> None:
    """Every pending worker done, and the screen redrawn."""
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


@contextlib.asynccontextmanager
async def opened(dashboard, size: tuple[int, int] = (120, 36), **options):
    """The real app on `dashboard`, headless, once its first inventory read and health
    check have landed."""
    from sandboxer_tui.dashboard.app import SandboxerApp

    app = SandboxerApp(dashboard, **options)
    app.told = []  # every notification: (severity, title, message)
    shown = app.notify

    def notify(message, *, title="", severity="information", timeout=None, markup=True):
        app.told.append((severity, title, message))
        shown(message, title=title, severity=severity, timeout=timeout, markup=markup)

    app.notify = notify
    async with app.run_test(size=size, notifications=True) as pilot:
        await wait_for(pilot, lambda: app.main.table.loaded and app.main.health.statuses,
                       within=60, what="the first inventory read and health check")
        await pilot.pause()
        yield app, pilot


async def select(pilot, sandbox_id: str) -> None:
    table = pilot.app.main.table
    table.move_cursor(row=table.get_row_index(sandbox_id), animate=False)
    await pilot.pause()
    assert table.selected_id == sandbox_id


def told(app, severity: str | None = None) -> list[str]:
    """The messages the app notified (of one severity), oldest first."""
    return [m for s, _, m in app.told if severity is None or s == severity]
