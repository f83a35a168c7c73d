"""Several `sbx serve` on one PostgreSQL share the reaper's and the deliverer's work through
the existing leases: each expired sandbox is destroyed once, each event delivered once."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from support import RUN_LABEL, SBX

from tests.service.live import start_process, stop_process
from tests.store.test_postgres import pg_url  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.docker, pytest.mark.postgres]


def test_two_services_on_one_postgres_reap_and_deliver_each_once(sbx, pg_url, docker_api):  # noqa: F811
    env = sbx.env({"SBX_DATABASE_URL": pg_url})
    made = sbx("api-keys", "create", "--scope", "write", "--owner", "fleet", env=env)
    assert made.code == 0, made.err
    headers = {"Authorization": f"Bearer {made.out.split()[-1]}"}
    services = [start_process(SBX, {**env, "SBX_ACTOR": f"serve-{n}"}, "--reap-every", "1s",
                              cwd=sbx.cwd) for n in ("a", "b")]
    try:
        url = services[0][1]
        label = dict([RUN_LABEL.split("=", 1)])
        ids = []
        for _ in range(6):
            answer = httpx.post(f"{url}/v1/sandboxes", headers=headers, timeout=60,
                                json={"profile": "default", "ttl": "2s", "labels": label})
            assert answer.status_code == 201, answer.text
            ids.append(answer.json()["id"])
        deadline = time.monotonic() + 90
        while True:
            states = {httpx.get(f"{services[1][1]}/v1/sandboxes/{i}", headers=headers
                                ).json()["state"] for i in ids}
            if states == {"destroyed"}:
                break
            assert time.monotonic() < deadline, states
            time.sleep(0.5)
        time.sleep(3)  # a few more cycles of both: nothing is done twice
        events = httpx.get(f"{url}/v1/events", headers=headers).json()
    finally:
        for proc, _ in services:
            stop_process(proc)
    for sandbox_id in ids:
        mine = [e for e in events if e["sandbox_id"] == sandbox_id]
        destroyed = [e for e in mine if e["type"] == "sandbox.destroyed"]
        assert len(destroyed) == 1, mine
        assert destroyed[0]["actor"] in ("serve-a", "serve-b")
        assert [e["reason"] for e in mine if e["type"] == "sandbox.destroying"] == ["ttl"]
    delivered = [json.loads(line)["id"] for line in
                 (sbx.home / "events.jsonl").read_text().splitlines()]
    assert len(delivered) == len(set(delivered))  # no event delivered twice
    assert {e["hash"] for e in events} <= set(delivered)
    left = docker_api.containers(all=True, filters={"label": [RUN_LABEL]})
    assert not {c["Labels"].get("sbx.id") for c in left} & set(ids)  # none leaked
