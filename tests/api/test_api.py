"""The library's surface on the stub test double and a real SQLite file: handles, records,
errors, the sync twin, context managers, events. What needs a real engine is in
test_api_docker.py."""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from support import SBX, query, table_rows

import sandboxer
from sandboxer import (
    AsyncCheckpoint,
    AsyncSandbox,
    AsyncSandboxer,
    Checkpoint,
    ExitCode,
    Sandbox,
    Sandboxer,
    State,
)


def everything(home) -> dict:
    return {t: table_rows(home, t) for t in ("sandboxes", "events", "checkpoints")}


# -- the public surface ---------------------------------------------------------------------


async def test_public_names_are_in_all_and_nothing_else_is_public():
    assert len(set(sandboxer.__all__)) == len(sandboxer.__all__)
    for name in sandboxer.__all__:
        assert getattr(sandboxer, name) is not None, name
    public = {n for n in vars(sandboxer) if not n.startswith("_")}
    modules = {n for n in public if inspect.ismodule(getattr(sandboxer, n))}
    assert public - modules - {"annotations", "TYPE_CHECKING", "Any"} <= set(sandboxer.__all__)


async def test_errors_are_one_hierarchy_with_the_clis_exit_codes():
    expected = {"BadInput": 2, "NotFound": 3, "Conflict": 4, "Unavailable": 5,
                "OperationFailed": 1}
    for name, code in expected.items():
        cls = getattr(sandboxer, name)
        assert issubclass(cls, sandboxer.Error)
        assert cls.exit_code == code == ExitCode(code)
    assert ExitCode.TIMED_OUT == 124 and ExitCode.INTERRUPTED == 130


async def test_the_sync_api_is_the_async_one_made_blocking():
    """Every public method of the async classes has a sync twin with the same signature,
    and the twins hold no code of their own (they are generated)."""
    for sync_cls, async_cls in ((Sandboxer, AsyncSandboxer), (Sandbox, AsyncSandbox),
                                (Checkpoint, AsyncCheckpoint)):
        for name, member in inspect.getmembers(async_cls, callable):
            if name.startswith("_") or isinstance(member, type):
                continue
            twin = getattr(sync_cls, name, None)
            assert twin is not None, f"{sync_cls.__name__}.{name} is missing"
            if inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member):
                assert not inspect.iscoroutinefunction(twin), name
                assert inspect.signature(twin) == inspect.signature(member), name
                if (sync_cls, name) == (Sandboxer, "close"):
                    continue  # the one method of its own: it also stops the core's loop
                assert twin.__wrapped__ is member, f"{name} is not made from the async one"


# -- create, get, list, destroy -------------------------------------------------------------


async def test_create_returns_a_handle_with_typed_record_fields(client, stub_profile):
    box = await client.create(stub_profile, ttl="5m", name="typed", labels={"team": "api"},
                              owner="someone", task="typing")
    assert isinstance(box, AsyncSandbox)
    assert box.id.startswith("sbx-") and box.name == "typed"
    assert box.state is State.RUNNING and box.backend == "stub"
    assert box.owner == "someone" and box.task == "typing"
    assert dict(box.labels) == {"team": "api"}
    with pytest.raises(TypeError):
        box.labels["team"] = "other"  # a read-only view
    for moment in (box.created_at, box.deadline, box.hard_deadline, box.idle_deadline):
        assert isinstance(moment, datetime) and moment.tzinfo is not None
    assert box.deadline - box.created_at == timedelta(minutes=5)
    assert box.hard_deadline - box.created_at == timedelta(hours=1)
    assert timedelta(minutes=4) < box.ttl_left <= timedelta(minutes=5)
    assert box.to_dict()["id"] == box.id and box.to_dict()["state"] == "running"
    await box.destroy()
    assert box.state is State.DESTROYED and box.ttl_left is None


async def test_get_takes_an_id_a_prefix_or_a_name(client, stub_profile):
    box = await client.create(stub_profile, name="findme")
    for ref in (box.id, box.id[:12], box.id.removeprefix("sbx-")[:10], "findme"):
        assert (await client.get(ref)).id == box.id, ref
    with pytest.raises(sandboxer.NotFound) as caught:
        await client.get("sbx-nothere")
    assert caught.value.exit_code == 3


async def test_list_filters_as_the_cli_does(client, stub_profile):
    a = await client.create(stub_profile, labels={"k": "1"})
    b = await client.create(stub_profile, labels={"k": "2"})
    await b.destroy()
    assert [x.id for x in await client.list()] == [a.id]
    assert {x.id for x in await client.list(include_destroyed=True)} == {a.id, b.id}
    assert [x.id for x in await client.list(state="destroyed")] == [b.id]
    assert [x.id for x in await client.list(state=State.DESTROYED)] == [b.id]
    assert [x.id for x in await client.list(labels={"k": "1"})] == [a.id]
    assert await client.list(backend="docker") == []


async def test_async_with_destroys_on_leaving_and_on_an_exception(client, stub_profile):
    async with client.create(stub_profile) as box:
        assert box.state is State.RUNNING
    assert (await client.get(box.id)).state is State.DESTROYED
    with pytest.raises(RuntimeError):
        async with client.create(stub_profile) as other:
            raise RuntimeError("the task failed")
    assert (await client.get(other.id)).state is State.DESTROYED


async def test_bad_input_raises_bad_input_naming_it_and_writes_nothing(client, stub_profile,
                                                                       sbx_home):
    await client.create(stub_profile)  # an installation with something in it
    before = everything(sbx_home)
    cases = [
        (dict(ttl="0s"), "ttl"), (dict(ttl="soon"), "ttl"), (dict(ttl=-5), "ttl"),
        (dict(ttl="2h"), "1h"),  # over the profile's max
        (dict(labels={"Bad Key": "x"}), "Bad Key"), (dict(labels={"sbx.id": "x"}), "sbx."),
        (dict(name="bad name!"), "bad name!"),
    ]
    for kwargs, named in cases:
        with pytest.raises(sandboxer.BadInput) as caught:
            await client.create(stub_profile, **kwargs)
        assert named in str(caught.value), (kwargs, str(caught.value))
        assert caught.value.exit_code == 2
        assert "\n" not in str(caught.value)
    box = (await client.list())[0]
    for argv in ([], "sh -c ls", [1, 2]):
        with pytest.raises(sandboxer.BadInput):
            await box.exec(argv)
    with pytest.raises(sandboxer.NotFound):
        await client.create("no-such-profile")
    assert everything(sbx_home) == before


async def test_a_backend_error_is_raised_as_one_of_the_librarys_errors(client, stub_profile):
    from sandboxer.adapters.base import BackendUnavailable
    from sandboxer.adapters.stub import StubAdapter

    StubAdapter.fail_next["create"] = BackendUnavailable("stub engine asleep")
    with pytest.raises(sandboxer.Unavailable) as caught:
        await client.create(stub_profile)
    assert caught.value.exit_code == 5 and "stub engine asleep" in str(caught.value)


async def test_conflict_on_an_operation_the_state_forbids(client, stub_profile):
    box = await client.create(stub_profile)
    await box.destroy()
    with pytest.raises(sandboxer.Conflict) as caught:
        await box.exec(["true"])
    assert caught.value.exit_code == 4
    await box.destroy()  # already destroyed counts as done


async def test_a_refused_exec_changes_nothing(client, stub_profile, tmp_path):
    """The write that finds a running sandbox for an exec also marks its activity; a refusal
    (a bad mask pattern in the settings) rolls that back with the rest (docs/reliability.md
    §12): the record, its idle deadline and the event log stay as they were."""
    box = await client.create(stub_profile)
    await box.exec(["true"])
    async def state():
        record = (await client.get(box.id)).to_dict()
        record.pop("ttl_left_s", None)  # counts down by itself: a busy machine crosses a second
        return record, [e.to_dict() for e in await client.events()]

    before = await state()
    settings = tmp_path / "xdg-config" / "sandboxer" / "settings.toml"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text('[events]\nmask = ["(unclosed"]\n')
    with pytest.raises(sandboxer.BadInput, match="not a valid regular expression"):
        await box.exec(["true"])
    settings.write_text("")
    assert await state() == before


# -- exec, deadlines, activity --------------------------------------------------------------


async def test_exec_and_exec_stream_give_output_and_are_recorded(client, stub_profile):
    box = await client.create(stub_profile)
    result = await box.exec(["echo", "hello", "api"])
    assert (result.exit_code, result.stdout, result.stderr) == (0, b"hello api\n", b"")
    assert isinstance(result.duration, timedelta) and result.ok
    items = [item async for item in box.exec_stream(["echo", "streamed"])]
    assert items[0] == sandboxer.OutputChunk("stdout", b"streamed\n")
    assert isinstance(items[-1], sandboxer.ExecExit) and items[-1].exit_code == 0
    timed = await box.exec(["sleep", "5"], timeout=0.2)
    assert timed.exit_code == 124 and timed.timed_out
    execs = [e for e in await box.events() if e.type == sandboxer.EventType.SANDBOX_EXEC]
    assert [e.payload["argv"] for e in execs] == [
        ["echo", "hello", "api"], ["echo", "streamed"], ["sleep", "5"]]
    import hashlib

    assert execs[1].payload["stdout"] == {"sha256": hashlib.sha256(b"streamed\n").hexdigest(),
                                          "bytes": 9}


async def test_extend_caps_at_the_hard_deadline_and_touch_moves_the_idle_clock(client,
                                                                               stub_profile):
    box = await client.create(stub_profile, ttl="5m")
    first = box.deadline
    assert await box.extend("10m") is False
    assert box.deadline - first == timedelta(minutes=10)
    assert await box.extend(timedelta(hours=5)) is True
    assert box.deadline == box.hard_deadline
    idle_before = box.idle_deadline
    await asyncio.sleep(0.01)
    await box.touch()
    assert box.idle_deadline > idle_before
    with pytest.raises(sandboxer.BadInput):
        await box.extend("0s")


# -- events ---------------------------------------------------------------------------------


async def test_events_are_typed_and_follow_sees_another_processs_writes(client, stub_profile,
                                                                        sbx_home):
    box = await client.create(stub_profile)
    events = await client.events(box.id)
    assert [e.type for e in events] == [sandboxer.EventType.SANDBOX_CREATING,
                                        sandboxer.EventType.SANDBOX_CREATED]
    assert all(e.actor == "api-test" and e.time.tzinfo for e in events)

    async def first_new():
        async for event in client.follow_events(box.id, every=0.05):
            return event

    follower = asyncio.create_task(first_new())
    env = {**os.environ, "SBX_HOME": str(sbx_home), "SBX_ACTOR": "other-process"}
    deadline = time.monotonic() + 60
    while not follower.done():  # it follows from when it starts: touch until it sees one
        assert time.monotonic() < deadline, "the follower saw no touch within 60 s"
        done = await asyncio.to_thread(subprocess.run, [*SBX, "touch", box.id], env=env,
                                       capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        await asyncio.wait({follower}, timeout=1)
    event = follower.result()
    assert event.type == sandboxer.EventType.SANDBOX_TOUCHED
    assert event.actor == "other-process" and event.sandbox_id == box.id
    assert (await client.verify_events())["intact"]


# -- the reaper -----------------------------------------------------------------------------


async def test_reap_reports_and_destroys_what_is_past_its_deadline(client, stub_profile,
                                                                   monkeypatch, sbx_home):
    box = await client.create(stub_profile, ttl="5m")
    assert (await client.reap()).destroyed == ()
    planned = await client.reap(dry_run=True)
    assert planned.destroyed == () and planned.planned == ()
    monkeypatch.setenv("SBX_CLOCK_OFFSET", "6m")  # a reaper that runs 6 minutes later
    async with AsyncSandboxer(home=sbx_home) as later:
        planned = await later.reap(dry_run=True)
        assert [p["id"] for p in planned.planned if p["action"] == "destroy"] == [box.id]
        assert (await later.get(box.id)).state is State.RUNNING  # a dry run changes nothing
        report = await later.reap()
    assert report.destroyed == (box.id,), report
    assert (await box.refresh()).state is State.DESTROYED
    destroyed = [e for e in await box.events() if e.type == "sandbox.destroying"]
    assert destroyed[-1].reason == sandboxer.Reason.TTL


def count_stub_adapters(monkeypatch) -> tuple[list[Any], list[Any]]:
    """The stub adapters made and closed from now on (each stands for a backend connection)."""
    from sandboxer.adapters.stub import StubAdapter

    made: list[StubAdapter] = []
    closed: list[StubAdapter] = []
    make, close = StubAdapter.__init__, StubAdapter.close

    def counted_init(self) -> None:
        make(self)
        made.append(self)

    async def counted_close(self) -> None:
        closed.append(self)
        await close(self)

    monkeypatch.setattr(StubAdapter, "__init__", counted_init)
    monkeypatch.setattr(StubAdapter, "close", counted_close)
    monkeypatch.setenv("SBX_ADAPTERS", "stub")  # the cycles look at the test double alone
    return made, closed


async def test_a_client_that_reaps_again_keeps_what_its_busy_cycle_opened(
        sbx_home, stub_profile, monkeypatch, tmp_path):
    """A client that only reaps (an agent platform's loop; run_reaper's) keeps the store and
    the adapters its first cycle with something to do opened: later cycles act through them
    rather than open a backend's connection again (a Docker engine's identity is then asked
    once), and closing the client closes them. What it keeps is its own home's store, not
    the one SBX_HOME names."""
    made, closed = count_stub_adapters(monkeypatch)
    async with AsyncSandboxer(home=sbx_home, actor="creator") as creator:
        first = await creator.create(stub_profile, ttl="5m")
        monkeypatch.setenv("SBX_CLOCK_OFFSET", "6m")  # the reaper runs 6 minutes later
        monkeypatch.setenv("SBX_HOME", str(tmp_path / "another-home"))
        reaper = AsyncSandboxer(home=sbx_home, actor="reaper")
        try:
            before = len(made)
            assert (await reaper.reap()).destroyed == (first.id,)
            opened = made[before:]
            assert opened and not {id(a) for a in opened} & {id(a) for a in closed}
            second = await creator.create(stub_profile, ttl="5m")  # on the creator's clock
            report = await reaper.reap()
            assert report.destroyed == (second.id,) and report.failed == ()
            assert made[before:] == opened, "the second cycle opened an adapter again"
            assert (await reaper.get(second.id)).state is State.DESTROYED
        finally:
            await reaper.close()
        assert {id(a) for a in opened} <= {id(a) for a in closed}
    assert not (tmp_path / "another-home").exists()


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "refused"])
async def test_a_reaps_manager_is_closed_unless_someone_keeps_it(sbx_home, stub_profile,
                                                                 monkeypatch, kept):
    """The Manager a cycle made goes to `hand_over` (a client's) or is closed with its
    adapters: one a client refuses (it has its own, or is closing) is never left open."""
    from sandboxer.core import api

    made, closed = count_stub_adapters(monkeypatch)
    async with AsyncSandboxer(home=sbx_home) as creator:
        box = await creator.create(stub_profile, ttl="5m")
    monkeypatch.setenv("SBX_CLOCK_OFFSET", "6m")
    offered: list[Any] = []

    def hand_over(manager) -> bool:
        offered.append(manager)
        return kept

    before = len(made)
    report = await api.reap(database_url=None, manager=None, actor="reaper", dry_run=False,
                            orphans=False, hand_over=hand_over)
    assert report["destroyed"] == [box.id] and len(offered) == 1
    opened = made[before:]
    assert opened
    left_open = [a for a in opened if id(a) not in {id(c) for c in closed}]
    assert left_open == (opened if kept else [])
    if kept:
        await offered[0].close()


def exec_events(home, sandbox_id) -> list[tuple[str, list[str]]]:
    """The sandbox's exec events as committed in the database file: (actor, argv)."""
    import json

    return [(row["actor"], json.loads(row["payload_json"])["argv"]) for row in query(
        home, "SELECT actor, payload_json FROM events WHERE sandbox_id = ? AND type = ? "
        "ORDER BY id", sandbox_id, "sandbox.exec")]


async def test_exec_returns_after_its_event_is_committed(sbx_home, stub_profile):
    """Every event is committed before the caller has the answer (docs/reliability.md §12):
    the database file, read by another connection the moment exec returns, holds the exec's
    event; so does it after the sync twin's exec, and after a stream's end."""
    async with AsyncSandboxer(home=sbx_home, actor="api-test") as sbx:
        box = await sbx.create(stub_profile)
        assert (await box.exec(["echo", "early"])).stdout == b"early\n"
        assert exec_events(sbx_home, box.id) == [("api-test", ["echo", "early"])]
        assert [item async for item in box.exec_stream(["true"])][-1].exit_code == 0
        assert exec_events(sbx_home, box.id)[-1] == ("api-test", ["true"])
    with Sandboxer(home=sbx_home, actor="sync-test") as sync:
        sync.get(box.id).exec(["false"])
        assert exec_events(sbx_home, box.id)[-1] == ("sync-test", ["false"])


async def test_exec_marks_activity_while_the_command_runs(client, stub_profile):
    """The idle clock starts again when a command starts, not when it ends."""
    box = await client.create(stub_profile, ttl="5m")
    before = box.idle_deadline
    run = asyncio.ensure_future(box.exec(["sleep", "5"]))
    deadline = time.monotonic() + 60
    while box.idle_deadline <= before and not run.done():  # seen while the command runs
        assert time.monotonic() < deadline, "the exec never marked activity"
        await asyncio.sleep(0.05)
        await box.refresh()
    assert box.idle_deadline > before and not run.done()
    assert (await run).exit_code == 0


# -- the loop the caller runs ---------------------------------------------------------------


async def test_the_callers_event_loop_never_runs_database_io(client, stub_profile,
                                                             monkeypatch):
    """Every transaction runs on the core's own thread, never on the caller's loop."""
    from sandboxer.core.store.db import Database

    caller = threading.current_thread()
    seen: list[threading.Thread] = []
    real_write, real_read = Database.write, Database.read

    def spy(real):
        def wrapped(self, *a, **kw):
            seen.append(threading.current_thread())
            return real(self, *a, **kw)
        return wrapped

    monkeypatch.setattr(Database, "write", spy(real_write))
    monkeypatch.setattr(Database, "read", spy(real_read))
    box = await client.create(stub_profile)
    await box.exec(["true"])
    await box.extend("1m")
    await client.list()
    await client.events(box.id)
    await box.destroy()
    assert seen, "no transaction was seen"
    assert caller not in seen


async def test_two_clients_with_their_own_homes_keep_their_own_state(tmp_path, stub_profile):
    one = AsyncSandboxer(home=tmp_path / "one")
    two = AsyncSandboxer(home=tmp_path / "two")
    try:
        a = await one.create(stub_profile)
        b = await two.create(stub_profile)
        assert [x.id for x in await one.list()] == [a.id]
        assert [x.id for x in await two.list()] == [b.id]
        assert (tmp_path / "one" / "sbx.db").is_file() and (tmp_path / "two" / "sbx.db").is_file()
        assert (tmp_path / "one" / "install-id").read_text() != \
            (tmp_path / "two" / "install-id").read_text()
    finally:
        await one.close()
        await two.close()


# -- the sync twin --------------------------------------------------------------------------


def test_sync_with_blocks_destroys_on_leaving_and_on_an_exception(sync_client, stub_profile):
    with sync_client.create(stub_profile, task="sync") as box:
        assert isinstance(box, Sandbox) and box.state is State.RUNNING
        assert box.exec(["echo", "sync"]).stdout == b"sync\n"
        chunks = list(box.exec_stream(["echo", "x"]))
        assert chunks[0].data == b"x\n" and chunks[-1].exit_code == 0
    assert box.state is State.DESTROYED
    with pytest.raises(ValueError), sync_client.create(stub_profile) as other:
        raise ValueError("boom")
    assert sync_client.get(other.id).state is State.DESTROYED
    assert {b.id for b in sync_client.list(include_destroyed=True)} == {box.id, other.id}


def test_sync_api_works_inside_a_running_event_loop(sync_client, stub_profile):
    """A notebook or an async framework calling the sync API from its loop's thread."""
    async def inside():
        box = sync_client.create(stub_profile)
        box.destroy()
        return box.state

    assert asyncio.run(inside()) is State.DESTROYED


def test_a_closed_client_says_so(sbx_home, stub_profile):
    sbx = Sandboxer(home=sbx_home)
    sbx.list()
    sbx.close()
    with pytest.raises(sandboxer.Conflict, match="closed"):
        sbx.list()


def test_import_sandboxer_loads_no_heavy_module():
    code = ("import sys, sandboxer; heavy = ('sqlalchemy', 'pydantic', 'docker', 'textual', "
            "'e2b', 'modal', 'fastapi', 'opentelemetry', 'click', 'yaml'); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_records_times_are_utc(sync_client, stub_profile):
    box = sync_client.create(stub_profile)
    assert box.created_at.utcoffset() == timedelta(0)
    assert abs(box.created_at - datetime.now(UTC)) < timedelta(minutes=1)
