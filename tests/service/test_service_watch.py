"""The routes a long-running front end (the dashboard) needs over a service, through real
HTTP on 127.0.0.1: the inventory as a conditional GET (304 and nothing read while nobody
commits), backends as the service reaches them, a sandbox's origin, every sandbox's metric
samples (stored, and followed: on the engine), each with a read key."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from support import remove_test_containers

import sandboxer
from tests.api.conftest import RUN
from tests.service.conftest import Api
from tests.service.live import LiveService
from tests.service.test_service import everything


@pytest.fixture
def reader(live: LiveService):
    client = Api(live.url, live.key("read", owner="writer"))  # the api fixture's tenant
    yield client
    client.http.close()


def test_the_inventory_answers_304_and_reads_nothing_until_someone_commits(
        live, api, reader, stub_named, sbx_home, monkeypatch):
    from sandboxer.core.follow.watch import InventoryWatcher

    made = api.post("/v1/sandboxes", json={"profile": stub_named}).json()
    first = reader.get("/v1/inventory")
    assert first.status_code == 200
    etag = first.headers["etag"]
    assert [b["id"] for b in first.json()] == [made["id"]]
    assert "ttl_left_s" not in first.json()[0]  # only what is stored: it moves by itself
    reads = []
    real = InventoryWatcher._select
    monkeypatch.setattr(InventoryWatcher, "_select",
                        lambda *a, **k: reads.append(1) or real(*a, **k))
    same = reader.get("/v1/inventory", headers={"If-None-Match": etag})
    assert (same.status_code, same.content, same.headers["etag"]) == (304, b"", etag)
    assert reads == []  # nobody committed: not a row was read
    with sandboxer.Sandboxer(home=sbx_home, actor="elsewhere") as other:  # another process
        other.get(made["id"]).extend("5m")
    moved = reader.get("/v1/inventory", headers={"If-None-Match": etag})
    assert moved.status_code == 200 and moved.headers["etag"] != etag and reads == [1]
    assert moved.json()[0]["deadline"] > first.json()[0]["deadline"]
    api.delete(f"/v1/sandboxes/{made['id']}")
    assert reader.get("/v1/inventory",
                      headers={"If-None-Match": moved.headers["etag"]}).json() == []
    # the view with destroyed ones is another listing: the live view's ETag is not its own
    shown = reader.get("/v1/inventory", params={"include_destroyed": True},
                       headers={"If-None-Match": moved.headers["etag"]})
    assert [(b["id"], b["state"]) for b in shown.json()] == [(made["id"], "destroyed")]
    assert httpx.get(f"{live.url}/v1/inventory").status_code == 401


async def test_the_librarys_watch_asks_for_the_changes_since_its_last_answer(
        live, stub_named, monkeypatch):
    from sandboxer_tui.service.watching import InventoryVersions

    asked = []  # (since, reset, records sent) of each look the service answered
    real = InventoryVersions.changes

    async def spy(self, include_destroyed, since, tenant=None):
        answer = await real(self, include_destroyed, since, tenant)
        asked.append((since is not None, answer["reset"], len(answer["changed"])))
        return answer

    monkeypatch.setattr(InventoryVersions, "changes", spy)
    async with sandboxer.AsyncSandboxer(url=live.url, token=live.key("read")) as sbx, \
            sbx.watch() as watch:
        assert not await watch.read() and not await watch.read()
        async with sandboxer.AsyncSandboxer(url=live.url, token=live.key("write")) as writer:
            box = await writer.create(stub_named)
            await writer.create(stub_named)
            assert len((await watch.read()).added) == 2
            await box.extend("5m")
            assert [b.id for b in (await watch.read()).changed] == [box.id]
            assert not await watch.read()
    assert asked == [(False, True, 0), (True, False, 0), (True, False, 2), (True, False, 1),
                     (True, False, 0)]


def test_backends_as_the_service_reaches_them_and_a_sandboxs_origin(live, api, reader,
                                                                    stub_named, sbx_home):
    from sandboxer.adapters.base import Capability
    from sandboxer.adapters.docker import DockerAdapter

    stub, missing = reader.get("/v1/backends", params={"name": ["stub", "no-such"]}).json()
    assert (stub["name"], stub["loaded"], stub["test_double"]) == ("stub", True, True)
    assert (stub["reachable"], stub["capabilities"]) == (True, ["exec", "files", "logs"])
    assert (missing["loaded"], missing["reachable"]) == (False, False)
    assert "'no-such' is not installed here" in missing["detail"]
    every = reader.get("/v1/backends", params={"check": False}).json()
    docker = next(b for b in every if b["name"] == "docker")
    assert docker["checked"] is False and docker["reachable"] is None
    # the route says what the service's host offers; its library client never gets the
    # shell, which would run on that host
    assert ("shell" in docker["capabilities"]) == DockerAdapter().supports(Capability.SHELL)
    with sandboxer.Sandboxer(url=live.url, token=live.key("read")) as remote:
        (seen,) = remote.backends(["docker"], check=False)
        assert "snapshot" in seen.capabilities and "shell" not in seen.capabilities
    bad = reader.get("/v1/backends", params={"timeout": 0})
    assert bad.status_code == 422 and "timeout" in bad.json()["error"]["message"]

    made = api.post("/v1/sandboxes", json={"profile": stub_named}).json()
    assert reader.get(f"/v1/sandboxes/{made['id']}/origin").json() == {"restored_from": None}
    gone = reader.get("/v1/sandboxes/sbx-nothere/origin")
    assert gone.status_code == 404 and "sbx-nothere" in gone.json()["error"]["message"]


def test_metric_samples_of_every_sandbox_refuse_what_makes_no_sense(live, reader, sbx_home):
    assert reader.get("/v1/metrics/samples", params={"since": "5m"}).json() == []
    before = everything(sbx_home)
    for params, status, says in (
            ({}, 400, "since is needed"),
            ({"since": "soon"}, 400, "since"),
            ({"since": "2024-01-01T00:00:00"}, 400, "zone"),
            ({"since": "5m", "follow": True}, 400, "not both"),
            ({"since": "5m", "every": 2}, 400, "every applies to follow"),
            ({"follow": True, "every": 0.5}, 422, "every")):
        answer = reader.get("/v1/metrics/samples", params=params)
        assert answer.status_code == status, (params, answer.text)
        assert says in answer.json()["error"]["message"], params
    assert everything(sbx_home) == before


def test_a_client_of_a_service_is_refused_an_interactive_shell_and_told_why(live, api,
                                                                             stub_named):
    made = api.post("/v1/sandboxes", json={"profile": stub_named}).json()
    with sandboxer.Sandboxer(url=live.url, token=live.key("write", owner="writer")) as remote:
        box = remote.get(made["id"])
        with pytest.raises(sandboxer.Conflict) as refused:
            box.shell_command()
        message = str(refused.value)
        # ... and told what does work through the service: a terminal over its WebSocket
        assert live.url in message and "without SBX_URL" in message
        assert "sbx shell" in message and "Sandbox.pty()" in message


# -- on the engine ----------------------------------------------------------------------------


@pytest.mark.docker
def test_the_library_follows_every_running_sandbox_through_the_service(sbx_home, docker_api):
    live = LiveService(sbx_home).start()

    async def main() -> None:
        async with sandboxer.AsyncSandboxer(url=live.url, token=live.key("write")) as sbx:
            box = await sbx.create("default", labels=RUN)
            try:
                async def first_of_the_box() -> sandboxer.MetricSample:
                    async for sample in sbx.follow_all_metrics(every="1s"):
                        if sample.sandbox_id == box.id:
                            return sample

                sample = await asyncio.wait_for(first_of_the_box(), 120)
                assert sample.memory_bytes and sample.pids is not None
                with pytest.raises(sandboxer.BadInput, match="every"):
                    async for _ in sbx.follow_all_metrics(every=0.5):
                        break
            finally:
                await box.destroy()

    try:
        asyncio.run(main())
    finally:
        live.stop()
        remove_test_containers(sbx_home)
