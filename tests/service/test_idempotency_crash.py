"""An idempotent create survives `sbx serve` killed (-9) at each of its steps: the retry with
the same Idempotency-Key gets the one sandbox the first request recorded (or its failure),
and the engine holds at most one container for the key (docs/service.md, "Idempotent
creates")."""

from __future__ import annotations

import signal

import httpx
import pytest
from support import RUN_ID, SBX, containers_of, install_id_of, query, write_profile

from tests.service.live import start_process, stop_process

# step -> what the retry gets: the sandbox, made by the first request or by the retry itself,
# or the first request's failure (its row was recorded, and nothing reached the engine)
STEPS = {
    "idempotency.after-claim": "made by the retry",
    "create.after-intent": "its failure",
    "create.after-backend": "the first request's sandbox",
    "create.after-running": "the first request's sandbox",
}


@pytest.mark.docker
@pytest.mark.parametrize("step", list(STEPS))
def test_kill_9_at_each_step_of_a_create_then_the_retry_gets_one_sandbox(step, sbx, tmp_path,
                                                                         docker_api):
    made = sbx("api-keys", "create", "--scope", "write", "--owner", "retrier")
    assert made.code == 0, made.err
    headers = {"Authorization": f"Bearer {made.out.split()[-1]}",
               "Idempotency-Key": f"job-{step}"}
    body = {"profile": "default", "ttl": "10m", "labels": {"sbx-test-run": RUN_ID}}

    crashing, url = start_process(SBX, sbx.env({"SBX_FAILPOINT": step}), cwd=tmp_path)
    with pytest.raises(httpx.HTTPError):  # the service dies with the request in flight
        httpx.post(f"{url}/v1/sandboxes", json=body, headers=headers, timeout=120)
    assert crashing.wait(timeout=60) == -signal.SIGKILL
    first = query(sbx.home, "SELECT sandbox_id FROM idempotency_keys")
    bound_before = first[0]["sandbox_id"] if first else None
    assert (bound_before is None) == (step == "idempotency.after-claim")

    proc, url = start_process(SBX, sbx.env(), cwd=tmp_path)
    try:
        retried = [httpx.post(f"{url}/v1/sandboxes", json=body, headers=headers, timeout=120)
                   for _ in range(2)]
    finally:
        stop_process(proc)
    rows = query(sbx.home, "SELECT id, state FROM sandboxes")
    assert len(rows) == 1, rows  # never a second sandbox for the key
    sandbox_id, state = rows[0]["id"], rows[0]["state"]
    if STEPS[step] == "its failure":
        for answer in retried:
            assert answer.status_code == 500, answer.text
            message = answer.json()["error"]["message"]
            assert sandbox_id in message and "create failed" in message
        assert state == "failed"
        assert containers_of(docker_api, install_id_of(sbx.home)) == []
        return
    for answer in retried:
        assert answer.status_code == 201, answer.text
        assert answer.json()["id"] == sandbox_id and answer.json()["state"] == "running"
    if bound_before is not None:
        assert bound_before == sandbox_id
    assert state == "running"
    on_engine = containers_of(docker_api, install_id_of(sbx.home))
    assert [c["Labels"]["sbx.id"] for c in on_engine] == [sandbox_id]


@pytest.mark.docker
def test_a_create_whose_setup_failed_is_the_retrys_failure_too(sbx, tmp_path, docker_api):
    """The first request's setup fails and its sandbox is destroyed: every retry with the key
    gets that failure (500 naming the sandbox), never a 201 for the destroyed record nor a
    second sandbox."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    write_profile(folder, "doomed", "backend: docker\nsetup: ['exit 3']\n")
    made = sbx("api-keys", "create", "--scope", "write", "--owner", "retrier")
    headers = {"Authorization": f"Bearer {made.out.split()[-1]}", "Idempotency-Key": "once"}
    body = {"profile": "doomed", "labels": {"sbx-test-run": RUN_ID}}
    proc, url = start_process(SBX, sbx.env({"SBX_PROFILE_PATH": str(folder)}), cwd=tmp_path)
    try:
        answers = [httpx.post(f"{url}/v1/sandboxes", json=body, headers=headers, timeout=120)
                   for _ in range(3)]
    finally:
        stop_process(proc)
    (row,) = query(sbx.home, "SELECT id, state FROM sandboxes")
    assert row["state"] == "destroyed"
    for answer in answers:
        assert answer.status_code == 500, answer.text
        message = answer.json()["error"]["message"]
        assert "setup command 'exit 3' exited 3" in message, message
    assert all(row["id"] in a.json()["error"]["message"] for a in answers[1:])
    assert containers_of(docker_api, install_id_of(sbx.home)) == []


@pytest.mark.docker
def test_kill_9_during_setup_then_the_retry_gets_the_failure_never_a_half_set_up_sandbox(
        sbx, tmp_path, docker_api):
    """The service dies between two setup commands: the sandbox still says creating, so the
    retry fails it (its setup did not finish) and removes its container, instead of handing
    out a running sandbox whose setup never finished."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    write_profile(folder, "prepared", "backend: docker\n"
                  "setup: ['touch /tmp/first', 'touch /tmp/second']\n")
    made = sbx("api-keys", "create", "--scope", "write", "--owner", "retrier")
    headers = {"Authorization": f"Bearer {made.out.split()[-1]}", "Idempotency-Key": "setup"}
    body = {"profile": "prepared", "labels": {"sbx-test-run": RUN_ID}}
    env = {"SBX_PROFILE_PATH": str(folder)}
    crashing, url = start_process(SBX, sbx.env({**env, "SBX_FAILPOINT": "create.during-setup"}),
                                  cwd=tmp_path)
    with pytest.raises(httpx.HTTPError):
        httpx.post(f"{url}/v1/sandboxes", json=body, headers=headers, timeout=120)
    assert crashing.wait(timeout=60) == -signal.SIGKILL
    (row,) = query(sbx.home, "SELECT id, state FROM sandboxes")
    assert row["state"] == "creating"  # never running half set up

    proc, url = start_process(SBX, sbx.env(env), cwd=tmp_path)
    try:
        retried = httpx.post(f"{url}/v1/sandboxes", json=body, headers=headers, timeout=120)
    finally:
        stop_process(proc)
    assert retried.status_code == 500, retried.text
    assert "before it was ready" in retried.json()["error"]["message"]
    (row,) = query(sbx.home, "SELECT id, state, error FROM sandboxes")
    assert row["state"] == "destroyed"
    assert containers_of(docker_api, install_id_of(sbx.home)) == []


def test_a_retry_that_finds_its_failed_create_being_destroyed_gets_the_failure(tmp_path):
    """The service's reaper may be ending a failed create (state destroying) at the moment
    its retry arrives: the retry gets the failure, never the sandbox as made (seen in CI:
    a 201 with state destroying)."""
    import asyncio

    import sqlalchemy as sa

    from sandboxer.core.lifecycle.idempotency import _answer_for
    from sandboxer.core.lifecycle.manager import Manager
    from sandboxer.core.rules.errors import OperationFailed
    from sandboxer.core.rules.profiles import ProfileLoader
    from sandboxer.core.store.db import Database
    from sandboxer.core.store.models import Sandbox

    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "stubby.yaml").write_text("backend: stub\n")

    async def scenario() -> None:
        mgr = Manager(Database(f"sqlite:///{tmp_path / 'sbx.db'}"), actor="retry@test",
                      install_id="inst-retry")
        try:
            made = await mgr.create(ProfileLoader([tmp_path / "profiles"]).load("stubby"))
            table = Sandbox.__table__
            with mgr.db.write() as conn:  # as the reaper leaves it mid-destroy of a failure
                conn.execute(table.update().where(table.c.id == made["id"]).values(
                    state="destroying", started_at=None, error="setup was interrupted"))
            with pytest.raises(OperationFailed, match="setup was interrupted"):
                await _answer_for(mgr, made["id"])
            with mgr.db.read() as conn:
                assert conn.execute(sa.select(table.c.state)).scalar() == "destroying"
        finally:
            await mgr.close()

    asyncio.run(scenario())
