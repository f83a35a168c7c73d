"""The HTTP service on the stub test double and a real SQLite file, through real HTTP on
127.0.0.1: keys and scopes, the actor recorded, errors and what they leave unwritten,
idempotent creates across a restart, pages, server-sent events, metrics, the unix socket,
the reaper's timer. The real engine: test_service_docker.py."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from datetime import timedelta

import httpx
import pytest
from support import table_rows

import sandboxer
from tests.service.conftest import Api
from tests.service.live import LiveService


def everything(home) -> dict:
    return {t: table_rows(home, t) for t in ("sandboxes", "events", "checkpoints",
                                             "idempotency_keys")}


def sse_events(response: httpx.Response, until: str | None = None) -> list[tuple[str, dict]]:
    """(event, data) of a server-sent event stream, up to the event `until`."""
    found, event, data = [], None, None
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
        elif line == "" and event is not None:
            found.append((event, data))
            if event == until:
                break
            event = data = None
    return found


# -- keys and scopes ------------------------------------------------------------------------


def test_no_key_or_a_bad_one_is_401_and_changes_nothing(live, sbx_home, stub_named):
    before = everything(sbx_home)
    for headers in ({}, {"Authorization": "Bearer nonsense"},
                    {"Authorization": "Bearer sbxk_" + "0" * 26 + "_" + "a" * 43},
                    {"Authorization": "Basic dXNlcjpwYXNz"}):
        answer = httpx.post(f"{live.url}/v1/sandboxes", json={"profile": stub_named},
                            headers=headers)
        assert answer.status_code == 401, headers
        assert answer.json()["error"]["kind"] == "unauthorized"
        assert answer.headers["www-authenticate"] == "Bearer"
    assert everything(sbx_home) == before


def test_a_read_key_reads_and_may_not_mutate(live, sbx_home, stub_named, api):
    made = api.post("/v1/sandboxes", json={"profile": stub_named}).json()
    reader = Api(live.url, live.key("read", owner="writer"))  # the writer's tenant
    assert reader.get(f"/v1/sandboxes/{made['id']}").json()["id"] == made["id"]
    before = everything(sbx_home)
    for method, path, body in (("POST", "/v1/sandboxes", {"profile": stub_named}),
                               ("DELETE", f"/v1/sandboxes/{made['id']}", None),
                               ("POST", f"/v1/sandboxes/{made['id']}/exec", {"argv": ["true"]}),
                               ("POST", f"/v1/sandboxes/{made['id']}/extend", {"by": "5m"}),
                               ("POST", "/v1/reap", None)):
        answer = reader.request(method, path, json=body)
        assert answer.status_code == 403, (method, path)
        assert answer.json()["error"]["kind"] == "forbidden"
        assert "read" in answer.json()["error"]["message"]
    assert everything(sbx_home) == before


def test_keys_are_stored_hashed_revoked_keys_stop_working(live, sbx_home):
    admin = Api(live.url, live.key("admin", owner="root-of-keys"))
    made = admin.post("/v1/api-keys", json={"scope": "read", "owner": "ci"})
    assert made.status_code == 201
    token = made.json()["token"]
    stored = table_rows(sbx_home, "api_keys")
    assert token not in repr(stored)  # only a hash of it
    reader = Api(live.url, token)
    assert reader.get("/v1/sandboxes").status_code == 200
    assert reader.get("/v1/api-keys").status_code == 403  # key management is admin's
    assert admin.delete(f"/v1/api-keys/{made.json()['key']['id']}").status_code == 200
    assert reader.get("/v1/sandboxes").status_code == 401
    listed = admin.get("/v1/api-keys").json()
    assert {k["owner"]: k["revoked_at"] is not None for k in listed} == {
        "root-of-keys": False, "ci": True}
    assert all("hash" not in json.dumps(k) for k in listed)


def test_a_write_key_names_profiles_only_an_admin_sends_a_document(live, sbx_home, api):
    document = {"name": "inline", "backend": "stub", "secrets": {"X": "env:HOME"}}
    before = everything(sbx_home)
    refused = api.post("/v1/sandboxes", json={"profile": document})
    assert refused.status_code == 403 and "admin" in refused.json()["error"]["message"]
    assert everything(sbx_home) == before
    admin = Api(live.url, live.key("admin", owner="boss"))
    made = admin.post("/v1/sandboxes", json={"profile": document})
    assert made.status_code == 201 and made.json()["profile"] == "inline"


def test_validate_refuses_what_create_would_refuse_on_the_backend(live, sbx_home, api):
    """POST /v1/profiles/validate applies the backend's rules as create does: a Docker
    profile asking for egress filtering is 400 naming the mode, not {"ok": true}."""
    before = everything(sbx_home)
    refused = api.post("/v1/profiles/validate", json={"name": "egress", "backend": "docker",
                                                       "network": {"mode": "egress"}})
    assert refused.status_code == 400, refused.text
    assert "cannot restrict egress" in refused.json()["error"]["message"]
    fine = api.post("/v1/profiles/validate", json={"name": "plain", "backend": "docker"})
    assert fine.status_code == 200 and fine.json()["profile"]["backend"] == "docker"
    assert everything(sbx_home) == before


def test_the_keys_owner_is_the_actor_and_concurrent_keys_never_mix(live, stub_named):
    """Forty creates at once under two keys: each sandbox's events name the key's owner."""
    tokens = {"alice": live.key("write", owner="alice"), "bob": live.key("write", owner="bob")}

    async def burst():
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as http:
            async def one(who: str) -> dict:
                answer = await http.post("/v1/sandboxes", json={"profile": stub_named,
                                                                 "task": who},
                                         headers={"Authorization": f"Bearer {tokens[who]}"})
                assert answer.status_code == 201, answer.text
                return answer.json()
            return await asyncio.gather(*(one("alice" if i % 2 else "bob")
                                          for i in range(40)))

    made = asyncio.run(burst())
    readers = {who: Api(live.url, token) for who, token in tokens.items()}
    for box in made:
        assert box["owner"] == box["task"]
        events = readers[box["owner"]].get("/v1/events", params={"sandbox": box["id"]}).json()
        assert {e["actor"] for e in events} == {box["task"]}, box["id"]


# -- errors ---------------------------------------------------------------------------------


def test_errors_carry_the_clis_body_and_status(live, sbx_home, stub_named, api):
    from sandboxer.adapters.base import BackendUnavailable
    from sandboxer.adapters.stub import StubAdapter

    box = api.post("/v1/sandboxes", json={"profile": stub_named}).json()
    before = everything(sbx_home)
    cases = [
        (api.post("/v1/sandboxes", json={"profile": stub_named, "ttl": "soon"}), 400,
         "bad_input", 2, "ttl"),
        (api.post("/v1/sandboxes", json={"profile": stub_named, "labels": {"sbx.id": "x"}}),
         400, "bad_input", 2, "sbx."),
        (api.post("/v1/sandboxes", json={"profile": "no-such"}), 404, "not_found", 3,
         "no-such"),
        (api.get("/v1/sandboxes/sbx-nothere"), 404, "not_found", 3, "sbx-nothere"),
        (api.post("/v1/sandboxes", json={"profile": stub_named, "ttl": [1]}), 422,
         "bad_input", 2, "ttl"),
        (api.post("/v1/sandboxes", json={"profile": stub_named, "colour": "red"}), 422,
         "bad_input", 2, "colour"),
        (api.post(f"/v1/sandboxes/{box['id']}/exec", json={"argv": []}), 422, "bad_input", 2,
         "argv"),
        (api.get("/v1/sandboxes", params={"cursor": "not-a-cursor"}), 400, "bad_input", 2,
         "cursor"),
        (api.get("/v1/nowhere"), 404, "not_found", 3, "Not Found"),
    ]
    for answer, status, kind, code, named in cases:
        assert answer.status_code == status, answer.text
        error = answer.json()["error"]
        assert (error["kind"], error["code"]) == (kind, code), answer.text
        assert named in error["message"] and "\n" not in error["message"]
        assert "Traceback" not in answer.text
    assert everything(sbx_home) == before
    assert api.delete(f"/v1/sandboxes/{box['id']}").status_code == 200
    conflict = api.post(f"/v1/sandboxes/{box['id']}/exec", json={"argv": ["true"]})
    assert conflict.status_code == 409 and conflict.json()["error"]["code"] == 4
    StubAdapter.fail_next["create"] = BackendUnavailable("stub engine asleep")
    down = api.post("/v1/sandboxes", json={"profile": stub_named})
    assert down.status_code == 503
    assert down.json()["error"] == {"code": 5, "kind": "unavailable",
                                    "message": "stub engine asleep"}


def test_the_remote_client_raises_the_same_error_classes(live, stub_named):
    with sandboxer.Sandboxer(url=live.url, token=live.key("write", owner="w")) as sbx:
        with pytest.raises(sandboxer.NotFound, match="sbx-nothere"):
            sbx.get("sbx-nothere")
        with pytest.raises(sandboxer.BadInput, match="ttl"):
            sbx.create(stub_named, ttl="soon")
        with pytest.raises(sandboxer.BadInput, match="admin key"):  # a 403 is bad input
            sbx.create_api_key("read")
    with sandboxer.Sandboxer(url=live.url) as keyless:  # a 401: the key is at fault
        with pytest.raises(sandboxer.Unauthorized, match="needs an API key"):
            keyless.list()
    with sandboxer.Sandboxer(url="http://127.0.0.1:9", token="x") as nowhere:
        with pytest.raises(sandboxer.Unavailable, match="cannot reach the sbx service"):
            nowhere.list()


# -- idempotent creates ---------------------------------------------------------------------


def test_an_idempotency_key_returns_the_first_sandbox_after_a_restart_too(sbx_home,
                                                                          stub_named):
    first = LiveService(sbx_home).start()
    token = first.key("write", owner="retrier")
    try:
        api = Api(first.url, token)
        body = {"profile": stub_named, "task": "once"}
        headers = {"Idempotency-Key": "job-42"}
        made = api.post("/v1/sandboxes", json=body, headers=headers)
        again = api.post("/v1/sandboxes", json=body, headers=headers)
        assert made.status_code == again.status_code == 201
        assert again.json()["id"] == made.json()["id"]
        other = api.post("/v1/sandboxes", json={**body, "task": "another"}, headers=headers)
        assert other.status_code == 422 and "another request" in other.json()["error"]["message"]
    finally:
        first.stop()
    second = LiveService(sbx_home).start()  # a new process's worth of state: the database
    try:
        after = Api(second.url, token).post("/v1/sandboxes", json=body, headers=headers)
        assert after.json()["id"] == made.json()["id"]
        # the same key string from another key's holder is another request
        theirs = Api(second.url, second.key("write", owner="someone-else")).post(
            "/v1/sandboxes", json=body, headers=headers)
        assert theirs.status_code == 201 and theirs.json()["id"] != made.json()["id"]
    finally:
        second.stop()
    assert len(table_rows(sbx_home, "sandboxes")) == 2


# -- listing --------------------------------------------------------------------------------


def test_list_pages_with_a_cursor_and_filters(live, api, stub_named):
    made = [api.post("/v1/sandboxes", json={"profile": stub_named,
                                            "labels": {"n": str(i % 2)}}).json()
            for i in range(7)]
    api.delete(f"/v1/sandboxes/{made[0]['id']}")
    seen, cursor, pages = [], None, 0
    while True:
        page = api.get("/v1/sandboxes", params={"limit": 3, **({"cursor": cursor}
                                                                if cursor else {})}).json()
        pages += 1
        seen += [b["id"] for b in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 2 and seen == [b["id"] for b in made[1:]]
    everyone = api.get("/v1/sandboxes", params={"include_destroyed": True}).json()["items"]
    assert [b["id"] for b in everyone] == [b["id"] for b in made]
    odd = api.get("/v1/sandboxes", params={"label": "n=1", "limit": 2}).json()
    assert [b["id"] for b in odd["items"]] == [made[1]["id"], made[3]["id"]]
    rest = api.get("/v1/sandboxes", params={"label": "n=1", "cursor": odd["next_cursor"]})
    assert [b["id"] for b in rest.json()["items"]] == [made[5]["id"]]
    destroyed = api.get("/v1/sandboxes", params={"state": "destroyed"}).json()["items"]
    assert [b["id"] for b in destroyed] == [made[0]["id"]]
    assert api.get("/v1/sandboxes", params={"backend": "docker"}).json()["items"] == []
    keys = {"id", "name", "state", "labels", "deadline", "ttl_left_s", "install"}
    assert keys <= set(everyone[0])


# -- streams --------------------------------------------------------------------------------


def test_exec_streams_stdout_and_stderr_then_exit(live, api, stub_named):
    box = api.post("/v1/sandboxes", json={"profile": stub_named}).json()
    with api.stream("POST", f"/v1/sandboxes/{box['id']}/exec", json={"argv": ["echo", "hi"]},
                    headers={"Accept": "text/event-stream"}) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        events = sse_events(answer, until="exit")
    assert events[0] == ("stdout", {"data": "hi\n"})
    assert events[-1][0] == "exit" and events[-1][1]["exit_code"] == 0
    plain = api.post(f"/v1/sandboxes/{box['id']}/exec", json={"argv": ["echo", "plain"]})
    assert plain.json()["stdout"] == "plain\n" and plain.json()["exit_code"] == 0
    missing = api.post("/v1/sandboxes/sbx-nothere/exec", json={"argv": ["true"]},
                       headers={"Accept": "text/event-stream"})
    assert missing.status_code == 404 and missing.json()["error"]["kind"] == "not_found"


def test_the_event_stream_resumes_from_last_event_id(live, api, stub_named):
    box = api.post("/v1/sandboxes", json={"profile": stub_named}).json()
    events = api.get("/v1/events", params={"sandbox": box["id"]}).json()
    assert [e["type"] for e in events] == ["sandbox.creating", "sandbox.created"]
    api.post(f"/v1/sandboxes/{box['id']}/touch")
    with api.stream("GET", "/v1/events", headers={"Accept": "text/event-stream",
                                                  "Last-Event-ID": str(events[0]["id"])},
                    params={"sandbox": box["id"]}) as answer:
        lines = []
        for line in answer.iter_lines():
            lines.append(line)
            if line.startswith("event: sandbox.touched"):
                break
    assert f"id: {events[1]['id']}" in lines  # from after the one named, not from now
    assert "event: sandbox.created" in lines and f"id: {events[0]['id']}" not in lines


def test_the_library_follows_events_through_the_service(live, stub_named):
    async def go():
        async with sandboxer.AsyncSandboxer(url=live.url,
                                            token=live.key("write", owner="fol")) as sbx:
            box = await sbx.create(stub_named)

            async def first_new():
                async for event in sbx.follow_events(box.id):
                    return event

            follower = asyncio.create_task(first_new())
            deadline = time.monotonic() + 60
            while not follower.done():  # it follows from when it starts: touch till it sees
                assert time.monotonic() < deadline, "the follower saw no touch within 60 s"
                await box.touch()
                await asyncio.wait({follower}, timeout=1)
            return follower.result()

    event = asyncio.run(go())
    assert event.type == sandboxer.EventType.SANDBOX_TOUCHED and event.actor == "fol"


# -- health and metrics ---------------------------------------------------------------------


def test_health_and_prometheus_metrics_without_sandbox_ids(live, api, stub_named):
    assert httpx.get(f"{live.url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{live.url}/readyz").json() == {"status": "ready"}
    assert httpx.get(f"{live.url}/metrics").status_code == 401
    boxes = [api.post("/v1/sandboxes", json={"profile": stub_named}).json() for _ in range(3)]
    api.delete(f"/v1/sandboxes/{boxes[0]['id']}")
    api.post(f"/v1/sandboxes/{boxes[1]['id']}/exec", json={"argv": ["true"]})
    with api.stream("POST", f"/v1/sandboxes/{boxes[1]['id']}/exec", json={"argv": ["true"]},
                    headers={"Accept": "text/event-stream"}) as streamed:
        assert sse_events(streamed, until="exit")[-1][0] == "exit"
    api.post("/v1/sandboxes", json={"profile": "no-such"})
    assert api.get("/metrics").status_code == 403  # the service's whole count: an operator's
    text = Api(live.url, live.key("admin", owner="scraper")).get("/metrics").text
    assert 'sbx_sandboxes{backend="stub",state="running"} 2.0' in text
    assert 'sbx_sandboxes{backend="stub",state="destroyed"} 1.0' in text
    assert 'sbx_operation_duration_seconds_count{backend="stub",kind="create",result="ok"} 3.0' \
        in text
    assert 'kind="exec",result="ok"} 2.0' in text  # the streamed one counts too
    assert 'kind="create",result="not_found"} 1.0' in text
    assert "sbx_reaper_runs_total" in text and "sbx_event_deliveries_total" in text
    assert not any(b["id"] in text or b["id"][4:] in text for b in boxes)


def test_the_service_reaps_and_delivers_on_its_timer(sbx_home, stub_named):
    live = LiveService(sbx_home, reap_every=timedelta(seconds=1)).start()
    try:
        api = Api(live.url, live.key("write", owner="w"))
        box = api.post("/v1/sandboxes", json={"profile": stub_named, "ttl": "1s"}).json()
        deadline = time.monotonic() + 30
        while api.get(f"/v1/sandboxes/{box['id']}").json()["state"] != "destroyed":
            assert time.monotonic() < deadline, "the service's reaper did not reap"
            time.sleep(0.2)
        events = api.get("/v1/events", params={"sandbox": box["id"]}).json()
        destroying = [e for e in events if e["type"] == "sandbox.destroying"]
        assert destroying[0]["reason"] == "ttl" and destroying[0]["actor"] == "the-service"
        deadline = time.monotonic() + 30
        scraper = Api(live.url, live.key("admin", owner="scraper"))
        while True:
            text = scraper.get("/metrics").text
            if 'sbx_reaped_sandboxes_total{reason="ttl"} 1.0' in text and \
                    'sbx_event_deliveries_total{result="delivered",sink="jsonl"}' in text:
                break
            assert time.monotonic() < deadline, text
            time.sleep(0.2)
        assert 'sbx_reaper_runs_total{result="ok"}' in text
        delivered = (sbx_home / "events.jsonl").read_text()
        assert box["id"] in delivered  # no cron: the service delivered the events itself
    finally:
        live.stop()


# -- the unix socket ------------------------------------------------------------------------


def test_the_unix_socket_is_0600_and_needs_no_key(sbx_home, stub_named, tmp_path):
    path = str(tmp_path / "sbx.sock")
    live = LiveService(sbx_home, socket_path=path).start()
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        transport = httpx.HTTPTransport(uds=path)
        with httpx.Client(transport=transport, base_url="http://sbx") as http:
            made = http.post("/v1/sandboxes", json={"profile": stub_named})
            assert made.status_code == 201 and made.json()["owner"] == "the-service"
        assert httpx.get(f"{live.url}/v1/sandboxes").status_code == 401  # TCP still needs one
        with sandboxer.Sandboxer(url=f"unix://{path}") as sbx:
            assert [b.id for b in sbx.list()] == [made.json()["id"]]
    finally:
        live.stop()
