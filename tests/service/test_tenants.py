"""Tenants (docs/security.md, "Tenants"): a read or write key acts for its owner only. Two
tenants side by side through every route: neither sees nor touches the other's sandboxes,
checkpoints or events, each is bound by the quotas an admin set, an admin sees all, and a
key names profiles, never files of the service's host."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

import sandboxer
from tests.service.conftest import Api
from tests.service.test_service import everything
from tests.support import RUN_LABEL, install_id_of, remove_test_containers, table_rows


@pytest.fixture
def tenants(live):
    """Write keys of alice and bob, a read key of bob, and an admin key."""
    keys = {"alice": Api(live.url, live.key("write", owner="alice")),
            "bob": Api(live.url, live.key("write", owner="bob")),
            "bob-reader": Api(live.url, live.key("read", owner="bob")),
            "admin": Api(live.url, live.key("admin", owner="ops"))}
    yield keys
    for api in keys.values():
        api.http.close()


def made(api: Api, **body) -> dict:
    answer = api.post("/v1/sandboxes", json=body)
    assert answer.status_code == 201, answer.text
    return answer.json()


def not_found_like_a_missing_one(answer: httpx.Response, ref: str) -> None:
    assert answer.status_code == 404, (answer.request.url, answer.text)
    assert answer.json()["error"] == {"code": 3, "kind": "not_found",
                                      "message": f"no sandbox {ref!r}"}


def test_each_tenant_sees_and_touches_only_its_own_sandboxes_and_events(
        live, sbx_home, stub_named, tenants):
    alice, bob, reader, admin = (tenants[k] for k in ("alice", "bob", "bob-reader", "admin"))
    hers = made(alice, profile=stub_named, name="twin", task="alice's work")
    his = made(bob, profile=stub_named, name="twin", task="bob's work")  # names are per tenant
    assert (hers["owner"], his["owner"]) == ("alice", "bob")
    alice.post(f"/v1/sandboxes/{hers['id']}/exec", json={"argv": ["true"]})

    # listing, the watched inventory, events: each its own
    assert [b["id"] for b in alice.get("/v1/sandboxes").json()["items"]] == [hers["id"]]
    assert [b["id"] for b in reader.get("/v1/sandboxes").json()["items"]] == [his["id"]]
    assert [b["id"] for b in alice.get("/v1/inventory").json()] == [hers["id"]]
    assert [b["id"] for b in reader.get("/v1/inventory").json()] == [his["id"]]
    seen_by_alice = {e["sandbox_id"] for e in alice.get("/v1/events").json()}
    assert hers["id"] in seen_by_alice and his["id"] not in seen_by_alice
    assert alice.get("/v1/sandboxes/twin").json()["id"] == hers["id"]
    assert reader.get("/v1/sandboxes/twin").json()["id"] == his["id"]
    assert {b["id"] for b in admin.get("/v1/sandboxes").json()["items"]} == {
        hers["id"], his["id"]}

    # every route that names bob's sandbox, by id, by a unique prefix, or with a NUL after it
    before = everything(sbx_home)
    prefix = his["id"][:-6]
    for ref in (his["id"], prefix, his["id"][4:]):
        not_found_like_a_missing_one(alice.get(f"/v1/sandboxes/{ref}"), ref)
    ref = his["id"]
    for method, path, body in (
            ("DELETE", f"/v1/sandboxes/{ref}", None),
            ("POST", f"/v1/sandboxes/{ref}/exec", {"argv": ["true"]}),
            ("POST", f"/v1/sandboxes/{ref}/extend", {"by": "5m"}),
            ("POST", f"/v1/sandboxes/{ref}/touch", None),
            ("POST", f"/v1/sandboxes/{ref}/pause", None),
            ("POST", f"/v1/sandboxes/{ref}/resume", None),
            ("POST", f"/v1/sandboxes/{ref}/snapshot", {}),
            ("GET", f"/v1/sandboxes/{ref}/logs", None),
            ("GET", f"/v1/sandboxes/{ref}/metrics", None),
            ("GET", f"/v1/sandboxes/{ref}/metrics/history", None),
            ("GET", f"/v1/sandboxes/{ref}/origin", None),
            ("GET", f"/v1/sandboxes/{ref}/evidence", None),
            ("GET", f"/v1/events?sandbox={ref}", None),
            ("GET", f"/v1/checkpoints?sandbox={ref}", None),
            ("POST", "/v1/sandboxes/destroy", {"refs": [ref]}),
            # a sandbox's files and processes (docs/service.md, "Files", "Processes")
            ("GET", f"/v1/sandboxes/{ref}/files?path=/tmp", None),
            ("GET", f"/v1/sandboxes/{ref}/files/tree?path=/tmp", None),
            ("GET", f"/v1/sandboxes/{ref}/files/list?path=/tmp", None),
            ("GET", f"/v1/sandboxes/{ref}/files/stat?path=/tmp", None),
            ("DELETE", f"/v1/sandboxes/{ref}/files?path=/tmp", None),
            ("POST", f"/v1/sandboxes/{ref}/files/mkdir", {"path": "/tmp/x"}),
            ("POST", f"/v1/sandboxes/{ref}/files/rename", {"src": "/tmp", "dst": "/t"}),
            ("POST", f"/v1/sandboxes/{ref}/processes", {"argv": ["true"]}),
            ("GET", f"/v1/sandboxes/{ref}/processes", None),
            ("GET", f"/v1/sandboxes/{ref}/processes/1", None),
            ("POST", f"/v1/sandboxes/{ref}/processes/1/wait", None),
            ("POST", f"/v1/sandboxes/{ref}/processes/1/signal", {"signal": 9}),
            ("DELETE", f"/v1/sandboxes/{ref}/processes/1/stdin", None),
            ("GET", f"/v1/sandboxes/{ref}/processes/1/output", None)):
        answer = alice.request(method, path, json=body)
        not_found_like_a_missing_one(answer, ref)
    for path in ("files?path=/tmp/x", "files/tree?path=/tmp", "processes/1/stdin"):
        answer = alice.request("PUT" if "files" in path else "POST",
                               f"/v1/sandboxes/{ref}/{path}", content=b"data")
        not_found_like_a_missing_one(answer, ref)
    with alice.stream("POST", f"/v1/sandboxes/{ref}/exec", json={"argv": ["true"]},
                      headers={"Accept": "text/event-stream"}) as streamed:
        streamed.read()
        not_found_like_a_missing_one(streamed, ref)
    # a NUL and anything after a whole id names nothing (it once named the sandbox)
    answer = bob.delete(f"/v1/sandboxes/{ref}%00garbage")
    assert answer.status_code == 404, answer.text
    assert everything(sbx_home) == before  # nothing changed, not even an activity mark

    # a write key records its own owner; naming another is an admin's
    refused = alice.post("/v1/sandboxes", json={"profile": stub_named, "owner": "bob"})
    assert refused.status_code == 403 and "admin" in refused.json()["error"]["message"]
    assert everything(sbx_home) == before
    assert made(alice, profile=stub_named, owner="alice")["owner"] == "alice"
    assert made(admin, profile=stub_named, owner="bob")["owner"] == "bob"

    # what spans tenants is an admin's
    for method, path in (("POST", "/v1/reap"), ("POST", "/v1/reconcile"),
                         ("POST", "/v1/events/deliver"), ("GET", "/v1/events/undelivered"),
                         ("POST", "/v1/checkpoints/prune"), ("GET", "/metrics"),
                         ("PUT", f"/v1/pools/{stub_named}")):
        answer = bob.request(method, path, json={"size": 1} if method == "PUT" else None)
        assert answer.status_code == 403, (method, path, answer.text)
    assert alice.delete(f"/v1/sandboxes/{hers['id']}").status_code == 200
    assert reader.get(f"/v1/sandboxes/{his['id']}").json()["state"] == "running"


def test_the_library_narrows_acting_as_a_tenant(sbx_home, stub_named):
    """`acting_as(owner, tenant=True)`, which the service runs each request through."""
    async def run() -> None:
        async with sandboxer.AsyncSandboxer(home=sbx_home, actor="root") as sbx:
            alice = sbx.acting_as("alice", tenant=True)
            bob = sbx.acting_as("bob", tenant=True)
            hers = await alice.create(stub_named, name="mine")
            with pytest.raises(sandboxer.NotFound):
                await bob.get(hers.id)
            with pytest.raises(sandboxer.NotFound):
                await bob.get("mine")
            assert [b.id for b in await bob.list()] == []
            assert [b.id for b in await alice.list()] == [hers.id]
            assert [b.id for b in await sbx.list()] == [hers.id]  # not narrowed
            assert hers.owner == "alice"
            await hers.destroy()

    asyncio.run(run())


def test_quotas_bound_a_tenant_and_refusals_change_nothing(live, sbx_home, stub_named,
                                                           tenants):
    admin = tenants["admin"]
    key = admin.post("/v1/api-keys", json={"scope": "write", "owner": "carol",
                                           "max_sandboxes": 2, "max_ttl_s": 600,
                                           "max_execs": 1})
    assert key.status_code == 201, key.text
    assert key.json()["key"]["quotas"] == {"max_sandboxes": 2, "max_ttl_s": 600,
                                           "max_execs": 1}
    carol = Api(live.url, key.json()["token"])
    first, _ = made(carol, profile=stub_named), made(carol, profile=stub_named)

    before = everything(sbx_home)
    for body, quota in (({"profile": stub_named}, "max_sandboxes"),
                        ({"profile": stub_named, "ttl": "1h"}, "max_ttl")):
        answer = carol.post("/v1/sandboxes", json=body)
        assert answer.status_code == 429, answer.text
        error = answer.json()["error"]
        assert error["kind"] == "quota_exceeded" and error["code"] == 4
        assert quota in error["message"] and "\n" not in error["message"]
    longer = carol.post(f"/v1/sandboxes/{first['id']}/extend", json={"by": "1h"})
    assert longer.status_code == 429 and "max_ttl" in longer.json()["error"]["message"]
    assert everything(sbx_home) == before  # nothing created, the deadline unchanged
    assert made(tenants["alice"], profile=stub_named)  # another tenant is not bound

    # one command at a time: a second while the first runs is refused
    long_one: dict[str, Any] = {}
    running = threading.Thread(target=lambda: long_one.update(answer=carol.post(
        f"/v1/sandboxes/{first['id']}/exec", json={"argv": ["sleep", "10"]})))  # long enough for a busy machine
    running.start()
    deadline, refused = time.monotonic() + 30, None
    while refused is None and running.is_alive():
        answer = carol.post(f"/v1/sandboxes/{first['id']}/exec", json={"argv": ["true"]})
        if answer.status_code == 429:
            refused = answer.json()["error"]["message"]
        assert time.monotonic() < deadline
    running.join(30)
    if refused is None:  # on a busy machine a `true` got there first: the sleep was the second
        sleep = long_one.get("answer")
        assert sleep is not None, "the sleep's request raised (see the thread's output)"
        assert sleep.status_code == 429, sleep.text
        refused = sleep.json()["error"]["message"]
    assert "max_execs" in refused
    assert carol.post(f"/v1/sandboxes/{first['id']}/exec",
                      json={"argv": ["true"]}).json()["exit_code"] == 0

    assert carol.delete(f"/v1/sandboxes/{first['id']}").status_code == 200
    assert made(carol, profile=stub_named)["owner"] == "carol"  # room again


def test_quotas_bind_the_owner_in_the_cli_too(sbx, stub_env):
    """`sbx api-keys create --max-sandboxes`: a create for that owner past it exits 4."""
    key = sbx("api-keys", "create", "--scope", "write", "--owner", "dave",
              "--max-sandboxes", "1", "--max-ttl", "10m", "--json")
    assert key.code == 0, key.err
    assert key.json()["quotas"] == {"max_sandboxes": 1, "max_ttl_s": 600}
    assert sbx("create", "--profile", "stubby", "--owner", "dave", env=stub_env).code == 0
    before = table_rows(sbx.home, "sandboxes")
    for args, quota in ((("--owner", "dave"), "max_sandboxes"),
                        (("--owner", "dave", "--ttl", "1h"), "max_ttl")):
        again = sbx("create", "--profile", "stubby", *args, env=stub_env)
        assert again.code == 4 and again.err.count("\n") == 1 and quota in again.err
    assert table_rows(sbx.home, "sandboxes") == before
    other = sbx("create", "--profile", "stubby", "--owner", "erin", "--ttl", "1h", env=stub_env)
    assert other.code == 0, other.err  # erin has no quota
    assert len(table_rows(sbx.home, "sandboxes")) == len(before) + 1


@pytest.fixture
def stub_env(tmp_path) -> dict[str, str]:
    """The environment of a CLI run with `stubby` (the stub test double) on its path."""
    folder = tmp_path / "cli-profiles"
    folder.mkdir()
    (folder / "stubby.yaml").write_text("backend: stub\nttl: {default: 10m, max: 1h}\n")
    return {"SBX_PROFILE_PATH": str(folder)}


def test_key_creation_and_revocation_are_events_with_the_admin_as_actor(live, tenants):
    admin = tenants["admin"]
    key = admin.post("/v1/api-keys", json={"scope": "read", "owner": "frank"}).json()["key"]
    assert admin.delete(f"/v1/api-keys/{key['id']}").status_code == 200
    events = [e for e in admin.get("/v1/events").json() if e["type"].startswith("apikey.")]
    assert [(e["type"], e["actor"], e["payload"]["key"], e["payload"]["owner"])
            for e in events if e["payload"]["key"] == key["id"]] == [
        ("apikey.created", "ops", key["id"], "frank"),
        ("apikey.revoked", "ops", key["id"], "frank")]
    assert admin.get("/v1/events/verify").json()["intact"] is True
    assert not [e for e in tenants["alice"].get("/v1/events").json()
                if e["type"].startswith("apikey.")]  # not alice's acts


# -- what a key may name ------------------------------------------------------------------


def test_a_profile_is_a_name_never_a_path(live, sbx_home, stub_named, tenants, tmp_path,
                                          monkeypatch):
    """A YAML file the service can read, naming one of its environment variables as a secret
    and a hard deadline years away: no key reaches it by path, by `..` or through
    `extends:`, and no document a key sends names a file of the service's host."""
    monkeypatch.setenv("SERVICE_ONLY_SECRET", "s3cret")
    planted = tmp_path / "planted.yaml"
    planted.write_text("backend: stub\nsecrets: {X: env:SERVICE_ONLY_SECRET}\n"
                       "ttl: {default: 3650d, max: 3650d}\n")
    relative = Path("..") / planted.relative_to(tmp_path)
    alice, admin = tenants["alice"], tenants["admin"]
    before = everything(sbx_home)
    for name in (str(planted.with_suffix("")), str(relative.with_suffix("")),
                 f"../{planted.stem}", "sub/name", "..", "Upper"):
        answer = alice.post("/v1/sandboxes", json={"profile": name})
        assert answer.status_code == 400, (name, answer.text)
        message = answer.json()["error"]["message"]
        assert "never by a path" in message
    for document in ({"extends": str(planted.with_suffix(""))},
                     {"extends": f"../{planted.stem}"},
                     {"backend": "compose", "compose": {"file": str(planted),
                                                        "service": "x"}},
                     {"backend": "ssh", "options": {"inventory": str(planted)}},
                     *({"backend": "compose", "compose": {"service": "app", **compose}}
                       for compose in (
                           {"allow": ["binds"], "project": {"services": {"app": {
                               "image": "sandboxer/base:busybox"}}}},
                           {"project": {"services": {"app": {
                               "image": "sandboxer/base:busybox", "env_file": str(planted)}}}},
                           {"project": {"services": {"app": {
                               "image": "sandboxer/base:busybox",
                               "volumes": [f"{tmp_path}:/host"]}}}}))):
        for who in (tenants["bob-reader"], admin):
            answer = who.post("/v1/profiles/validate", json=document)
            assert answer.status_code == 400, (document, answer.text)
        answer = admin.post("/v1/sandboxes", json={"profile": document})
        assert answer.status_code == 400, (document, answer.text)
    assert alice.get("/v1/profiles/..%2Fplanted").status_code in (400, 404)
    assert everything(sbx_home) == before
    assert made(alice, profile=stub_named)["owner"] == "alice"  # a name still works


# -- names and what a terminal shows ------------------------------------------------------


def test_names_follow_one_rule(live, sbx_home, stub_named, tenants):
    alice = tenants["alice"]
    box = made(alice, profile=stub_named)
    before = everything(sbx_home)
    for name in ("01", box["id"][4:12], "sbx-mine", "ckpt-mine", "red\x1b[31m", "a\x00b",
                 "x" * 64, ""):
        answer = alice.post("/v1/sandboxes", json={"profile": stub_named, "name": name})
        assert answer.status_code in (400, 422), (name, answer.text)
        snap = alice.post(f"/v1/sandboxes/{box['id']}/snapshot", json={"name": name})
        assert snap.status_code in (400, 422), (name, snap.text)
    assert everything(sbx_home) == before
    assert made(alice, profile=stub_named, name="build-42")["name"] == "build-42"


def test_ls_and_show_never_send_a_terminal_escape(sbx, stub_env):
    """An owner or task with a control character is refused at create (exit 2, nothing
    written); one already stored (by an older sbx) is written out by ls and show, not sent."""
    nasty = "\x1b]0;owned\x07\x1b[31m"
    before = table_rows(sbx.home, "sandboxes")
    for option in ("--task", "--owner"):
        refused = sbx("create", "--profile", "stubby", option, f"x{nasty}", env=stub_env)
        assert refused.code == 2 and refused.err.count("\n") == 1, refused
        assert "\x1b" not in refused.err
    long_task = sbx("create", "--profile", "stubby", "--task", "t" * 4097, env=stub_env)
    assert long_task.code == 2 and "4096" in long_task.err
    assert table_rows(sbx.home, "sandboxes") == before
    made_ = sbx("create", "--profile", "stubby", "--task", "fine", "--json", env=stub_env)
    assert made_.code == 0, made_.err
    box = made_.json()
    conn = sqlite3.connect(sbx.home / "sbx.db")
    with conn:
        conn.execute("UPDATE sandboxes SET task = ?, owner = ?, labels_json = ? WHERE id = ?",
                     (f"task{nasty}", f"owner{nasty}", json.dumps({"k": nasty}), box["id"]))
    conn.close()
    for argv in (("ls",), ("ls", "--all"), ("show", box["id"])):
        shown = sbx(*argv, env=stub_env)
        assert shown.code == 0, shown.err
        assert "\x1b" not in shown.out and "\x07" not in shown.out, argv
        assert "\\x1b" in shown.out  # written out, not sent
    shown = sbx("show", box["id"], "--json", env=stub_env).json()
    assert shown["task"] == f"task{nasty}"  # JSON keeps the value, escaped by JSON itself


# -- checkpoints (a real engine) ----------------------------------------------------------


@pytest.fixture
def engine_cleanup(sbx_home):
    yield
    remove_test_containers(sbx_home)
    install = install_id_of(sbx_home)
    if install is None:
        return
    api = docker.APIClient(version="auto")
    try:
        for info in api.images(all=True, filters={"label": [f"sbx.install={install}"]}):
            for ref in [t for t in info.get("RepoTags") or [] if t != "<none>:<none>"] or [
                    info["Id"]]:
                try:
                    api.remove_image(ref, force=True)
                except docker.errors.APIError:
                    pass
    finally:
        api.close()


def test_checkpoints_are_their_tenants(live, sbx_home, tenants, engine_cleanup):
    alice, bob, reader, admin = (tenants[k] for k in ("alice", "bob", "bob-reader", "admin"))
    box = made(alice, profile="default", labels=dict([RUN_LABEL.split("=")]))
    ckpt = alice.post(f"/v1/sandboxes/{box['id']}/snapshot", json={"name": "hers"})
    assert ckpt.status_code == 201, ckpt.text
    ckpt = ckpt.json()
    assert ckpt["owner"] == "alice"
    assert [c["id"] for c in alice.get("/v1/checkpoints").json()] == [ckpt["id"]]
    assert bob.get("/v1/checkpoints").json() == []
    assert [c["id"] for c in admin.get("/v1/checkpoints").json()] == [ckpt["id"]]

    alice_reader = Api(live.url, live.key("read", owner="alice"))
    before = everything(sbx_home)
    for ref in (ckpt["id"], "hers", ckpt["id"][:-6]):
        for method, path, body in (("GET", f"/v1/checkpoints/{ref}", None),
                                   ("DELETE", f"/v1/checkpoints/{ref}", None),
                                   ("POST", f"/v1/checkpoints/{ref}/restore", {}),
                                   ("POST", f"/v1/checkpoints/{ref}/fork", {"n": 2}),
                                   ("GET", f"/v1/checkpoints/{ref}/archive", None)):
            answer = bob.request(method, path, json=body)
            assert answer.status_code == 404, (method, path, answer.text)
            assert answer.json()["error"]["message"] == f"no checkpoint {ref!r}"
    # an export takes write scope on the checkpoint's tenant
    assert alice_reader.get(f"/v1/checkpoints/{ckpt['id']}/archive").status_code == 403
    assert reader.get(f"/v1/checkpoints/{ckpt['id']}").status_code == 404
    assert everything(sbx_home) == before
    restored = alice.post(f"/v1/checkpoints/{ckpt['id']}/restore", json={})
    assert restored.status_code == 201 and restored.json()["owner"] == "alice"
