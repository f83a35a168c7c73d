"""The evidence bundle: built from the database, verified offline, tampering named."""

import asyncio
import json

import pytest

from sandboxer.adapters.stub import StubAdapter
from sandboxer.core.lifecycle.manager import EVENTS, Manager
from sandboxer.core.observe.evidence import verify
from sandboxer.core.rules.clock import FrozenClock
from sandboxer.core.rules.profiles import ProfileLoader
from sandboxer.core.store.db import Database


@pytest.fixture
def finished(sbx_home, tmp_path, monkeypatch):
    monkeypatch.setenv("SBX_TEST_SECRET_VALUE", "s3cr3t-evidence-value")
    StubAdapter.reset()
    path = tmp_path / "p.yaml"
    path.write_text("backend: stub\nsecrets: {TOKEN: 'env:SBX_TEST_SECRET_VALUE'}\n")
    mgr = Manager(Database(f"sqlite:///{sbx_home / 'sbx.db'}"), FrozenClock(), actor="alice")
    row = asyncio.run(mgr.create(ProfileLoader().load_file(path), task="audit me"))
    asyncio.run(mgr.exec(row["id"], ["echo", "hello"]))
    asyncio.run(mgr.destroy(row["id"]))
    yield mgr, row["id"]
    asyncio.run(mgr.close())


def test_bundle_has_the_record_profile_events_execs_and_summary(finished):
    mgr, sid = finished
    bundle = mgr.evidence(sid)
    assert verify(bundle) == []
    assert bundle["sandbox"]["id"] == sid and bundle["sandbox"]["state"] == "destroyed"
    assert bundle["profile"]["secrets"] == {"TOKEN": "env:SBX_TEST_SECRET_VALUE"}
    assert [e["type"] for e in bundle["events"]] == [
        "sandbox.creating", "sandbox.created", "sandbox.exec", "sandbox.destroying",
        "sandbox.destroyed"]
    assert bundle["execs"][0]["argv"] == ["echo", "hello"]
    assert bundle["summary"]["actors"] == ["alice"] and bundle["summary"]["task"] == "audit me"
    assert "s3cr3t-evidence-value" not in json.dumps(bundle)


def test_an_altered_event_in_the_bundle_is_named(finished):
    mgr, sid = finished
    bundle = mgr.evidence(sid)
    bundle["events"][2]["payload_json"] = bundle["events"][2]["payload_json"].replace(
        '"exit_code":0', '"exit_code":1')
    problems = verify(bundle)
    assert any("event 3 (sandbox.exec) was altered" in p for p in problems)
    assert any("part 'events'" in p for p in problems)


def test_an_altered_row_in_the_database_shows_in_the_bundle(finished):
    mgr, sid = finished
    with mgr.db.engine.begin() as conn:
        conn.execute(EVENTS.update().where(EVENTS.c.id == 4).values(actor="mallory"))
    problems = verify(mgr.evidence(sid))
    assert problems == ["event 4 (sandbox.destroying) was altered: its hash does not match "
                        "its content"]
    assert mgr.verify_events().broken_at == 4
