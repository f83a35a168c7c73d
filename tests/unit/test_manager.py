"""The manager's operation pattern, on the stub backend (a test double) and a real SQLite file:
intent, backend call, fenced result; leases; an event with every transition."""

import asyncio
import hashlib
import json
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from sandboxer.adapters.base import AdapterError
from sandboxer.adapters.stub import StubAdapter
from sandboxer.core.lifecycle.manager import EVENTS, SANDBOXES, Manager
from sandboxer.core.rules.clock import FrozenClock
from sandboxer.core.rules.errors import (
    BadInput,
    Conflict,
    LeaseLost,
    NotFound,
    OperationFailed,
    Unavailable,
)
from sandboxer.core.rules.profiles import ProfileLoader
from sandboxer.core.store.db import Database


@pytest.fixture
def stub_profile(sbx_home, tmp_path):
    path = tmp_path / "stubby.yaml"
    path.write_text("backend: stub\nttl: {default: 10m, max: 1h}\nlabels: {team: core}\n")
    return ProfileLoader().load_file(path)


@pytest.fixture
def clock():
    return FrozenClock()


@pytest.fixture
def mgr(sbx_home, clock):
    StubAdapter.reset()
    m = Manager(Database(f"sqlite:///{sbx_home / 'sbx.db'}"), clock, actor="tester")
    yield m
    asyncio.run(m.close())


def rows(mgr, table):
    with mgr.db.read() as conn:
        return [dict(r) for r in conn.execute(sa.select(table)).mappings()]


def test_create_records_intent_result_and_events(mgr, stub_profile, clock):
    row = asyncio.run(mgr.create(stub_profile, name="one", labels={"x": "1"}, task="t"))
    assert row["state"] == "running"
    assert row["backend_ref"] == f"stub-{row['id']}"
    assert row["lease_owner"] is None  # released
    assert row["deadline"] == "2026-01-01T00:10:00.000000Z"
    assert row["hard_deadline"] == "2026-01-01T01:00:00.000000Z"
    request = StubAdapter.requests[row["backend_ref"]]
    assert request.labels["sbx.id"] == row["id"]
    assert request.labels["sbx.install"] == mgr.install_id
    assert request.labels["sbx.hard-deadline"] == row["hard_deadline"]
    assert request.labels["team"] == "core" and request.labels["x"] == "1"
    assert [e["type"] for e in rows(mgr, EVENTS)] == ["sandbox.creating", "sandbox.created"]
    assert all(e["actor"] == "tester" for e in rows(mgr, EVENTS))


def test_ttl_longer_than_max_is_refused_before_anything_is_written(mgr, stub_profile):
    with pytest.raises(BadInput, match="max 1h"):
        asyncio.run(mgr.create(stub_profile, ttl=timedelta(hours=2)))
    assert rows(mgr, SANDBOXES) == [] and rows(mgr, EVENTS) == []
    assert StubAdapter.calls == []


def test_missing_secret_is_refused_before_anything_is_written(mgr, sbx_home, tmp_path, monkeypatch):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    path = tmp_path / "sec.yaml"
    path.write_text("backend: stub\nsecrets: {TOKEN: 'env:NOT_SET_ANYWHERE'}\n")
    with pytest.raises(BadInput, match=r"\$NOT_SET_ANYWHERE is not set"):
        asyncio.run(mgr.create(ProfileLoader().load_file(path)))
    assert rows(mgr, SANDBOXES) == []


def test_secret_value_reaches_the_backend_but_not_the_database(mgr, tmp_path, monkeypatch):
    monkeypatch.setenv("SBX_TEST_TOKEN", "tok-123456789")
    path = tmp_path / "sec.yaml"
    path.write_text("backend: stub\nsecrets: {TOKEN: 'env:SBX_TEST_TOKEN'}\n")
    row = asyncio.run(mgr.create(ProfileLoader().load_file(path)))
    assert StubAdapter.requests[row["backend_ref"]].env["TOKEN"] == "tok-123456789"
    db_bytes = Path(mgr.db.engine.url.database).read_bytes()
    wal = Path(str(mgr.db.engine.url.database) + "-wal")
    assert b"tok-123456789" not in db_bytes + (wal.read_bytes() if wal.exists() else b"")


def test_failed_create_ends_failed_with_its_event(mgr, stub_profile):
    StubAdapter.fail_next["create"] = AdapterError("quota exceeded")
    with pytest.raises(AdapterError, match="quota"):
        asyncio.run(mgr.create(stub_profile))
    (row,) = rows(mgr, SANDBOXES)
    assert row["state"] == "failed" and row["error"] == "quota exceeded"
    assert row["lease_owner"] is None
    events = rows(mgr, EVENTS)
    assert [e["type"] for e in events] == ["sandbox.creating", "sandbox.failed"]
    assert events[-1]["reason"] == "failed"


def test_destroy_is_idempotent_and_survives_backend_loss(mgr, stub_profile):
    row = asyncio.run(mgr.create(stub_profile, name="gone"))
    StubAdapter.lose(row["backend_ref"])  # removed out of band
    done, now = asyncio.run(mgr.destroy("gone"))
    assert now and done["state"] == "destroyed" and done["ended_at"]
    again, now = asyncio.run(mgr.destroy(row["id"]))
    assert not now and again["state"] == "destroyed"
    assert [e["type"] for e in rows(mgr, EVENTS)][-2:] == ["sandbox.destroying", "sandbox.destroyed"]


def test_a_held_lease_refuses_a_second_actor(mgr, stub_profile, sbx_home, clock):
    row = asyncio.run(mgr.create(stub_profile))
    lease, _ = mgr.leases.begin(row["id"], "destroying", reason="manual")
    other = Manager(mgr.db, clock, actor="other")
    with pytest.raises(Conflict, match="is busy"):
        asyncio.run(other.destroy(row["id"]))
    assert lease.fence == 2


def test_an_expired_lease_is_taken_over_and_the_stale_holder_cannot_commit(mgr, stub_profile, clock):
    row = asyncio.run(mgr.create(stub_profile))
    stale, _ = mgr.leases.begin(row["id"], "destroying", reason="manual")  # then "crashes"
    clock.advance(mgr.lease_ttl + timedelta(seconds=1))
    other = Manager(mgr.db, clock, actor="reaper")
    done, now = asyncio.run(other.destroy(row["id"]))  # completes the interrupted intent
    assert now and done["state"] == "destroyed" and done["fence"] == 3
    with pytest.raises(LeaseLost):
        mgr.leases.finish(stale, "destroyed")
    types = [e["type"] for e in rows(mgr, EVENTS)]
    assert types.count("sandbox.destroying") == 1 and types.count("sandbox.destroyed") == 1


def test_failed_destroy_keeps_the_intent_for_reconcile(mgr, stub_profile):
    row = asyncio.run(mgr.create(stub_profile))
    StubAdapter.fail_next["destroy"] = AdapterError("engine hiccup")
    with pytest.raises(AdapterError):
        asyncio.run(mgr.destroy(row["id"]))
    after = mgr.resolve(row["id"])
    assert after["state"] == "destroying" and after["lease_owner"] is None
    assert after["error"] == "engine hiccup"
    done, _ = asyncio.run(mgr.destroy(row["id"]))  # a retry completes it
    assert done["state"] == "destroyed"


def test_resolve_by_id_prefix_and_name(mgr, stub_profile):
    a = asyncio.run(mgr.create(stub_profile, name="alpha"))
    b = asyncio.run(mgr.create(stub_profile))
    assert mgr.resolve(a["id"])["id"] == a["id"]
    assert mgr.resolve(a["id"][:-3].upper())["id"] == a["id"]
    assert mgr.resolve(a["id"].removeprefix("sbx-")[:-2])["id"] == a["id"]
    assert mgr.resolve("alpha")["id"] == a["id"]
    common = next(i for i in range(30) if a["id"][i] != b["id"][i])
    with pytest.raises(BadInput, match="ambiguous"):
        mgr.resolve(a["id"][:common])
    with pytest.raises(NotFound):
        mgr.resolve("sbx-zzzz")


def test_names_are_unique_among_sandboxes_that_are_not_destroyed(mgr, stub_profile):
    asyncio.run(mgr.create(stub_profile, name="dup"))
    with pytest.raises(Conflict, match="taken"):
        asyncio.run(mgr.create(stub_profile, name="dup"))
    asyncio.run(mgr.destroy("dup"))
    again = asyncio.run(mgr.create(stub_profile, name="dup"))
    assert mgr.resolve("dup")["id"] == again["id"]


def test_exec_records_digests_not_output_and_refuses_dead_sandboxes(mgr, stub_profile, clock):
    row = asyncio.run(mgr.create(stub_profile))
    clock.advance(timedelta(minutes=1))
    result = asyncio.run(mgr.exec(row["id"], ["echo", "hello"]))
    assert (result.exit_code, result.stdout) == (0, b"hello\n")
    event = rows(mgr, EVENTS)[-1]
    payload = json.loads(event["payload_json"])
    assert event["type"] == "sandbox.exec" and payload["argv"] == ["echo", "hello"]
    assert payload["stdout"] == {"sha256": hashlib.sha256(b"hello\n").hexdigest(), "bytes": 6}
    assert "hello\\n" not in event["payload_json"]  # the digest, never the content
    assert mgr.resolve(row["id"])["last_activity_at"] == "2026-01-01T00:01:00.000000Z"
    asyncio.run(mgr.destroy(row["id"]))
    with pytest.raises(Conflict, match="is destroyed: cannot exec"):
        asyncio.run(mgr.exec(row["id"], ["echo", "x"]))


def test_the_chain_holds_across_operations(mgr, stub_profile):
    for _ in range(3):
        row = asyncio.run(mgr.create(stub_profile))
        asyncio.run(mgr.exec(row["id"], ["true"]))
        asyncio.run(mgr.destroy(row["id"]))
    report = mgr.verify_events()
    assert report.intact and report.checked == 15


def test_a_stored_sandbox_on_a_backend_not_installed_here_is_unavailable(mgr):
    with pytest.raises(Unavailable, match="backend 'nowhere' is not installed here"):
        mgr.adapter("nowhere")


def test_operation_failed_wraps_unexpected_errors(mgr, stub_profile):
    StubAdapter.fail_next["create"] = RuntimeError("boom")
    with pytest.raises(OperationFailed, match="create failed on stub: boom"):
        asyncio.run(mgr.create(stub_profile))


def due_sandboxes(mgr, profile, clock, count):
    """`count` sandboxes of `profile` (ttl 10m), then the clock moved past their deadline."""
    made = [asyncio.run(mgr.create(profile)) for _ in range(count)]
    clock.advance(timedelta(minutes=11))
    return [row["id"] for row in made]


def test_the_reapers_intents_share_one_commit_and_each_keeps_its_own_outcome(mgr, stub_profile,
                                                                            clock):
    """The reaper's N destroys write their N intents in one commit, so the N backend calls
    leave together; one that is no longer due, or busy, is refused alone and the rest go on."""
    due_one, due_two, extended, busy = due_sandboxes(mgr, stub_profile, clock, 4)
    asyncio.run(mgr.extend(extended, timedelta(minutes=30)))
    other = Manager(mgr.db, clock, actor="other")
    other.leases.begin(busy, "destroying", reason="manual")  # another process acts on it
    events_before = len(rows(mgr, EVENTS))
    writes, write = [], mgr.db.write
    mgr.db.write = lambda: writes.append(1) or write()  # counts the write transactions

    async def reap_all():
        return await asyncio.gather(*(mgr.destroy_if(sid, "stub", reason="ttl")
                                      for sid in (due_one, extended, busy, due_two)),
                                    return_exceptions=True)

    one, not_due, held, two = asyncio.run(reap_all())
    assert one["state"] == two["state"] == "destroyed"
    assert not_due is None and mgr.resolve(extended)["state"] == "running"
    assert held is None and mgr.resolve(busy)["lease_owner"] == other.leases.owner
    written = rows(mgr, EVENTS)[events_before:]
    assert [(e["type"], e["sandbox_id"]) for e in written[:2]] == [
        ("sandbox.destroying", due_one), ("sandbox.destroying", due_two)]  # one after the other
    assert sorted((e["type"], e["sandbox_id"]) for e in written[2:]) == sorted(
        [("sandbox.destroyed", due_one), ("sandbox.destroyed", due_two)])
    assert len(writes) == 3  # the two intents together, then each result


def test_a_reaper_cancelled_before_its_intent_commits_has_written_nothing(mgr, stub_profile, clock):
    kept, reaped = due_sandboxes(mgr, stub_profile, clock, 2)
    events_before = len(rows(mgr, EVENTS))

    async def cancel_one():
        first = asyncio.create_task(mgr.destroy_if(kept, "stub", reason="ttl"))
        second = asyncio.create_task(mgr.destroy_if(reaped, "stub", reason="ttl"))
        await asyncio.sleep(0)  # both wait for the shared commit, which has not run yet
        first.cancel()
        return await asyncio.gather(first, second, return_exceptions=True)

    cancelled, done = asyncio.run(cancel_one())
    assert isinstance(cancelled, asyncio.CancelledError) and done["state"] == "destroyed"
    row = mgr.resolve(kept)
    assert row["state"] == "running" and row["lease_owner"] is None
    assert {e["sandbox_id"] for e in rows(mgr, EVENTS)[events_before:]} == {reaped}


def test_a_reaper_cancelled_after_its_intent_commits_gives_its_lease_back(mgr, stub_profile, clock):
    """A reap cycle's timeout (or Ctrl-C) that lands between the shared commit and the caller
    going on: the intent stays for the next cycle, and the lease is not left to lapse (until
    then `sbx destroy` would be refused as busy and the next cycles would skip it)."""
    (due,) = due_sandboxes(mgr, stub_profile, clock, 1)
    events_before = len(rows(mgr, EVENTS))

    async def cancel_after_the_commit():
        reaping = asyncio.create_task(mgr.destroy_if(due, "stub", reason="ttl"))
        while mgr.resolve(due)["state"] != "destroying":  # the shared commit has run
            await asyncio.sleep(0)
        reaping.cancel()  # before the reaping task has gone on from it
        return await asyncio.gather(reaping, return_exceptions=True)

    (cancelled,) = asyncio.run(cancel_after_the_commit())
    assert isinstance(cancelled, asyncio.CancelledError)
    row = mgr.resolve(due)
    assert row["state"] == "destroying" and row["lease_owner"] is None  # the intent, free
    assert f"stub-{due}" in StubAdapter.objects  # the backend was never asked
    assert [e["type"] for e in rows(mgr, EVENTS)[events_before:]] == [
        "sandbox.destroying", "sandbox.attempt-failed"]
    row, _ = asyncio.run(mgr.destroy(due))  # not refused as busy: it carries the intent on
    assert row["state"] == "destroyed" and f"stub-{due}" not in StubAdapter.objects


def test_a_loop_stopped_with_its_shared_commit_queued_holds_up_no_later_caller(mgr, stub_profile,
                                                                               clock):
    """A Manager used on one loop that stopped before its queued commit ran (the library's
    loop closed mid-reap) and then on another: the second loop's intents are written."""
    first, second = due_sandboxes(mgr, stub_profile, clock, 2)
    stopped = asyncio.new_event_loop()

    async def queue_one():  # its first step queues the commit, then the loop stops
        asyncio.get_running_loop().create_task(mgr.leases.begin_together(
            first, "destroying", reason="ttl", precondition=lambda row: None))

    async def on_another_loop():
        return await asyncio.wait_for(mgr.destroy_if(second, "stub", reason="ttl"), 30)

    try:
        stopped.run_until_complete(queue_one())
        assert mgr.resolve(first)["state"] == "running"  # the commit never ran
        assert asyncio.run(on_another_loop())["state"] == "destroyed"
        waiting = asyncio.all_tasks(stopped)  # the first loop's caller, given up
        for task in waiting:
            task.cancel()
        stopped.run_until_complete(asyncio.gather(*waiting, return_exceptions=True))
    finally:
        stopped.close()
    row = mgr.resolve(first)
    assert row["state"] == "running" and row["lease_owner"] is None  # nothing written for it


def test_an_interrupt_while_intents_are_written_one_by_one_leaves_no_lease_held(mgr, stub_profile,
                                                                                 clock):
    """The shared transaction failed, so each intent is written alone; Ctrl-C lands while the
    third is: the second's intent, already written, is released as its caller is cancelled,
    not left leased until the lease lapses."""
    broken_check, written, interrupted = due_sandboxes(mgr, stub_profile, clock, 3)

    def broken(row):
        raise RuntimeError("the check itself broke")

    def interrupt(row):
        raise KeyboardInterrupt

    async def three():
        return await asyncio.gather(*(
            mgr.leases.begin_together(sandbox_id, "destroying", reason="ttl", precondition=check)
            for sandbox_id, check in ((broken_check, broken), (written, lambda row: None),
                                      (interrupted, interrupt))))

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(three())
    row = mgr.resolve(written)
    assert row["state"] == "destroying" and row["lease_owner"] is None
    assert [mgr.resolve(i)["state"] for i in (broken_check, interrupted)] == ["running"] * 2


def test_one_intent_that_fails_unexpectedly_leaves_the_others_to_go_on(mgr, stub_profile, clock):
    """The shared transaction is rolled back and each intent written alone: the failing one's
    caller gets its error, the others their leases."""
    good, bad = due_sandboxes(mgr, stub_profile, clock, 2)

    def broken(row):
        raise RuntimeError("the check itself broke")

    async def both():
        return await asyncio.gather(
            mgr.leases.begin_together(good, "destroying", reason="ttl", precondition=lambda r: None),
            mgr.leases.begin_together(bad, "destroying", reason="ttl", precondition=broken),
            return_exceptions=True)

    (lease, _), error = asyncio.run(both())
    assert lease.sandbox_id == good and mgr.resolve(good)["state"] == "destroying"
    assert isinstance(error, RuntimeError) and mgr.resolve(bad)["state"] == "running"
