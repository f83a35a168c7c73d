"""`sbx pool set` fills the pool before it returns, through the CLI, the library and the
service alike, so the create that follows is served warm without any reap; and a warm-served
sandbox's record says when it was made (`created_at`) and when it was handed out
(`started_at`), both true. On the real Docker engine."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from support import RUN_LABEL, query, show, table_rows

import sandboxer
from tests.pools.test_pools import members, near, parse, pool_of, pooled
from tests.reliability.test_reliability import warm_up
from tests.service.live import LiveService

pytestmark = pytest.mark.docker


def running(docker_api, ref: str) -> bool:
    return bool(docker_api.inspect_container(ref)["State"]["Running"])


def test_pool_set_fills_the_pool_before_it_returns_and_the_next_create_is_warm(sbx,
                                                                              docker_api):
    pooled(sbx, size=1)
    warm_up(sbx)
    assert query(sbx.home, "SELECT id FROM sandboxes") == []  # no reap has run

    done = sbx("pool", "set", "warm", "--size", "2", "--json")
    assert done.code == 0, done.err
    assert (done.json()["size"], done.json()["ready"], done.json()["starting"]) == (2, 2, 0)
    pool = pool_of(sbx)  # without any reap: two warm members, running on the engine
    assert (pool["ready"], pool["starting"]) == (2, 0)
    assert [m["state"] for m in pool["members"]] == ["warm", "warm"]
    made = {show(sbx, m["id"])["backend_ref"]: m for m in pool["members"]}
    assert set(made) == set(members(docker_api, sbx))
    assert all(running(docker_api, ref) for ref in made)

    before = time.time()
    box = sbx.create("--profile", "warm", "--ttl", "5m")
    assert box["launch"] == "warm" and box["backend_ref"] in made
    member = made[box["backend_ref"]]
    # made when the member was made; handed out (started) at the claim, which the
    # deadline counts from; never started before it was made
    assert box["created_at"] == member["created_at"]
    started, created = parse(box["started_at"]), parse(box["created_at"])
    assert created < started and started.timestamp() >= before - 0.5
    assert near(started, parse(show(sbx, box["id"])["last_activity_at"]), 1)
    assert parse(box["deadline"]) - started == timedelta(minutes=5)
    assert parse(box["hard_deadline"]) - started == timedelta(hours=4)
    assert show(sbx, box["id"])["started_at"] == box["started_at"]
    claimed = [e for e in sbx("events", box["id"], "--json").json()
               if e["type"] == "sandbox.claimed"]
    assert near(parse(claimed[0]["time"]), started, 1)
    assert pool_of(sbx)["claimed"] == 1  # counted by its claim

    again = sbx("pool", "set", "warm", "--size", "2")  # refilled at once, as said
    assert again.code == 0 and again.out == "pool warm: size 2, 2 ready\n", again.out
    assert len(members(docker_api, sbx)) == 3  # two members, and the one claimed

    emptied = sbx("pool", "set", "warm", "--size", "0", "--json")
    assert emptied.code == 0 and emptied.json()["ready"] == 0
    assert set(members(docker_api, sbx)) == {box["backend_ref"]}  # the claimed one stays
    assert running(docker_api, box["backend_ref"])


def test_pool_set_without_the_engine_writes_nothing_and_a_failing_member_keeps_the_size(
        sbx, docker_api, tmp_path):
    pooled(sbx, size=1)
    warm_up(sbx)

    def state() -> tuple:
        return (table_rows(sbx.home, "sandboxes"), table_rows(sbx.home, "events"),
                table_rows(sbx.home, "pools"))

    before = state()
    nowhere = sbx("pool", "set", "warm", "--size", "2",
                  env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert nowhere.code == 5, (nowhere.out, nowhere.err)
    assert len(nowhere.err.strip().splitlines()) == 1 and "Traceback" not in nowhere.err
    assert state() == before

    pooled(sbx, name="broken", size=1, extra="setup: ['echo no >&2; exit 3']\n")
    failed = sbx("pool", "set", "broken", "--size", "1")
    assert failed.code == 1, (failed.out, failed.err)
    assert "pool broken: size 1 is kept" in failed.err and "exited 3" in failed.err
    assert "the next sbx reap tries again" in failed.err
    assert len(failed.err.strip().splitlines()) == 1 and "Traceback" not in failed.err
    broken = pool_of(sbx, "broken")
    assert (broken["size"], broken["size_set"], broken["ready"]) == (1, True, 0)
    assert members(docker_api, sbx, "broken") == {}  # the failed member was removed


def test_pool_set_fills_now_through_the_library_and_the_service(sbx, docker_api):
    pooled(sbx, size=1)
    warm_up(sbx)
    with sandboxer.Sandboxer(home=sbx.home) as local:
        pool = local.set_pool_size("warm", 1)
        assert (pool.size, pool.ready, pool.starting) == (1, 1, 0)
        box = local.create("warm", labels=dict([RUN_LABEL.split("=")]))
        assert box.launch == "warm" and box.started_at >= box.created_at

    service = LiveService(sbx.home).start()
    try:
        with sandboxer.Sandboxer(url=service.url, token=service.key("admin", owner="ops")) as remote:
            pool = remote.set_pool_size("warm", 2)
            assert (pool.size, pool.ready, pool.starting) == (2, 2, 0)
            assert len(members(docker_api, sbx)) == 3  # two members, and the one claimed
            served = remote.create("warm", labels=dict([RUN_LABEL.split("=")]))
            assert served.launch == "warm" and served.started_at >= served.created_at
            assert served.backend_ref in members(docker_api, sbx)
    finally:
        service.stop()
