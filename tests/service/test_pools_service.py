"""Warm pools over the service: the library as a client of a live `sbx serve` (`pools()`,
`set_pool_size`, `drain_pool`, `launch` on every create), the /v1/pools routes and their
errors, and the service's own timer keeping the pool filled (on the stub, which the service in
this process shares)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

import sandboxer
from tests.service.conftest import Api
from tests.service.live import LiveService


def wait_for(predicate, what: str, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {within}s"
        time.sleep(0.1)


def test_the_services_timer_fills_the_pool_and_remote_creates_say_how_they_were_served(
        sbx_home, stub_named, tmp_path, monkeypatch):
    folder = tmp_path / "profiles"
    (folder / "warmstub.yaml").write_text("extends: stubby\npool: {size: 2, max_age: 10m}\n")
    live = LiveService(sbx_home, reap_every=timedelta(seconds=0.5)).start()
    try:
        token = live.key("write", owner="writer")
        with sandboxer.Sandboxer(url=live.url, token=token) as sbx, \
                sandboxer.Sandboxer(url=live.url, token=live.key("admin", owner="ops")) as ops:
            wait_for(lambda: sbx.pools()[0].ready == 2, "full pool")
            (pool,) = sbx.pools()
            assert (pool.profile, pool.backend, pool.size, pool.declared) == (
                "warmstub", "stub", 2, True)
            assert pool.max_age == timedelta(minutes=10) and len(pool.members) == 2
            box = sbx.create("warmstub", name="w", labels={"k": "v"}, ttl="5m")
            assert (box.launch, box.pool, box.owner) == ("warm", "warmstub", "writer")
            assert box.id in {m["id"] for m in pool.members}
            assert [b.id for b in sbx.list()] == [box.id]  # members are nobody's
            claimed = [e for e in sbx.events(box.id) if e.type == sandboxer.EventType.SANDBOX_CLAIMED]
            assert claimed[0].payload["launch"] == "warm" and claimed[0].actor == "writer"
            cold = sbx.create("stubby")
            assert cold.launch == "cold"
            wait_for(lambda: sbx.pools()[0].claimed == 1 and sbx.pools()[0].ready == 2,
                     "the timer's refill")

            with pytest.raises(sandboxer.BadInput, match="admin"):  # pools are the operator's
                sbx.set_pool_size("warmstub", 1)
            resized = ops.set_pool_size("warmstub", 1)
            assert (resized.size, resized.size_set) == (1, True)
            wait_for(lambda: sbx.pools()[0].ready == 1, "the timer's shrink")
            drained = ops.drain_pool("warmstub")
            assert len(drained["destroyed"]) == 1 and drained["failed"] == []
            assert sbx.pools()[0].size == 0
            time.sleep(1.5)  # a few timer cycles: a drained pool stays empty
            assert sbx.pools()[0].ready == 0

            with_errors = [(sandboxer.BadInput, lambda: ops.set_pool_size("warmstub", 500)),
                           (sandboxer.BadInput, lambda: ops.set_pool_size("stubby", 1)),
                           (sandboxer.NotFound, lambda: ops.drain_pool("nosuch"))]
            for error, call in with_errors:
                try:
                    call()
                except error:
                    continue
                raise AssertionError(f"{call} did not raise {error}")
        api = Api(live.url, token)
        made = api.post("/v1/sandboxes", json={"profile": "warmstub"})
        assert made.status_code == 201 and made.json()["launch"] == "cold"  # drained
        admin = Api(live.url, live.key("admin", owner="ops"))
        assert admin.put("/v1/pools/warmstub", json={"size": -1}).status_code == 422
        assert admin.put("/v1/pools/warmstub", json={"size": 500}).status_code == 400
        assert admin.post("/v1/pools/nosuch/drain").status_code == 404
        assert api.put("/v1/pools/warmstub", json={"size": 1}).status_code == 403
        reader = Api(live.url, live.key("read", owner="reader"))
        assert reader.get("/v1/pools").status_code == 200
        assert reader.put("/v1/pools/warmstub", json={"size": 1}).status_code == 403
        assert reader.post("/v1/pools/warmstub/drain").status_code == 403
    finally:
        live.stop()
