"""The Modal backend through the real `modal` SDK, against a local stand-in of Modal's API.

The stand-in (tests/standins/modal_server.py) serves Modal's control plane and task command
router with grpclib on 127.0.0.1; the SDK reaches it through MODAL_SERVER_URL. Commands in its
sandboxes run for real as local processes. Where a user would notice, the test drives the real
`sbx` CLI (the `sbx` fixture); the adapter is called directly where that is clearer (paging,
orphans made behind sbx's back). Every RPC the stand-in does not implement fails the test.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from modal_proto import api_pb2
from standins.modal_server import ModalStandin
from support import (
    RUN_LABEL,
    alive,
    events_of,
    install_id_of,
    library_terminal,
    modal_sdk_env,
    show,
    table_rows,
    terminal_until,
    wait_ended,
    write_profile,
)

from sandboxer.adapters.base import (
    LABEL_CHECKPOINT,
    LABEL_HARD_DEADLINE,
    LABEL_ID,
    LABEL_INSTALL,
    CreateRequest,
)
from sandboxer.adapters.modal import ModalAdapter

TOKEN_ID = f"ak-sbxtest{secrets.token_hex(6)}"
TOKEN_SECRET = f"as-sbxtest{secrets.token_hex(12)}"
BLOCKED = api_pb2.NetworkAccess.NetworkAccessType.BLOCKED
ALLOWLIST = api_pb2.NetworkAccess.NetworkAccessType.ALLOWLIST
TIMEOUT = api_pb2.GenericResult.GENERIC_STATUS_TIMEOUT
TERMINATED = api_pb2.GenericResult.GENERIC_STATUS_TERMINATED
# What the SDK was seen to call for sbx's operations (docs/modal.md lists which for what).
MEASURED_RPCS = {
    # control plane
    "ClientHello", "AuthTokenGet", "AppGetOrCreate", "EnvironmentGetOrCreate", "ImageFromId",
    "ImageGetOrCreate", "ImageDelete", "SecretGetOrCreate",
    "DictGetOrCreate", "DictUpdate", "DictPop", "DictContents",
    "SandboxCreateV2", "SandboxWaitV2", "SandboxTerminateV2", "SandboxListV2",
    "SandboxTagsGetV2", "SandboxGetTaskIdV2", "SandboxGetCommandRouterAccess",
    # the V1 calls the SDK makes for a GPU sandbox
    "SandboxCreate", "SandboxWait", "SandboxTerminate", "SandboxTagsGet", "SandboxGetTaskId",
    "TaskGetCommandRouterAccess",
    # the task command router
    "TaskExecStart", "TaskExecStdioRead", "TaskExecWait", "TaskSnapshotFilesystem",
    "TaskExecStdinWrite",  # every exec: its stdin, or at least its end (EOF)
}


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> ModalStandin:
    server = ModalStandin(tmp_path_factory.mktemp("modal-standin"), TOKEN_ID, TOKEN_SECRET)
    server.start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def modal_env(standin, monkeypatch, tmp_path):
    """The SDK pointed at the stand-in with a good token; never at ~/.modal.toml. Afterwards:
    the SDK called nothing the stand-in does not implement, and nothing beyond what was
    measured (a new SDK version that calls something else shows up here)."""
    modal_sdk_env(monkeypatch, standin.url, TOKEN_ID, TOKEN_SECRET, tmp_path / "modal.toml")
    seen, calls = len(standin.unimplemented), len(standin.calls)
    yield
    assert standin.unimplemented[seen:] == [], "the SDK called RPCs the stand-in lacks"
    assert {c.method for c in standin.calls[calls:]} <= MEASURED_RPCS


@pytest.fixture(scope="module")
def image(standin) -> str:
    """A Modal image the account has, holding one file."""
    return standin.add_image({"hello.txt": "hello from the image\n"})


def profile(folder: Path, image: str, body: str = "", name: str = "mdl") -> str:
    """A modal profile file in `folder`; its path."""
    return str(write_profile(folder, name, f"extends: modal\nimage: {image}\n{body}"))


def created(standin: ModalStandin, box: dict):
    """The create request the stand-in received for the sbx sandbox `box`."""
    return standin.create_of(box["id"])


def sbx_json(result):
    assert result.code == 0, (result.code, result.out, result.err)
    return json.loads(result.out)


def no_token_anywhere(home: Path, *outputs: str) -> None:
    """The token's values appear in no file under SBX_HOME and in none of `outputs`."""
    for value in (TOKEN_ID, TOKEN_SECRET):
        for path in home.rglob("*"):
            if path.is_file():
                assert value.encode() not in path.read_bytes(), f"{value[:6]}... in {path}"
        for text in outputs:
            assert value not in text


def run(coro):
    return asyncio.run(coro)


async def with_adapter(fn):
    adapter = ModalAdapter()
    try:
        return await fn(adapter)
    finally:
        await adapter.close()


# -- the lifecycle, through the CLI ---------------------------------------------------------


def test_create_exec_destroy_through_the_cli(sbx, standin, image, tmp_path):
    box = sbx.create("--profile-file", profile(tmp_path, image), "--label", "team=infra")
    assert (box["state"], box["backend"]) == ("running", "modal")
    modal_id = box["backend_ref"]
    assert modal_id.startswith("sb-") and modal_id in standin.sandboxes
    tags = standin.sandboxes[modal_id].tags
    assert tags[LABEL_ID] == box["id"]
    assert tags[LABEL_INSTALL] == install_id_of(sbx.home)
    assert tags[LABEL_HARD_DEADLINE] == box["hard_deadline"]
    assert tags["team"] == "infra"

    result = sbx("exec", box["id"], "--", "sh", "-c", "cat hello.txt; echo err >&2; exit 7")
    assert (result.code, result.out, result.err) == (7, "hello from the image\n", "err\n")
    execs = [e for e in events_of(sbx, box["id"]) if e["type"] == "sandbox.exec"]
    assert execs[-1]["payload"]["exit_code"] == 7
    assert execs[-1]["payload"]["stdout"]["sha256"] == hashlib.sha256(
        b"hello from the image\n").hexdigest()

    started = time.monotonic()
    slow = sbx("exec", box["id"], "--timeout", "1s", "--", "sleep", "30")
    assert slow.code == 124 and "timed out" in slow.err
    assert time.monotonic() - started < 15
    assert sbx("exec", box["id"], "--", "sh", "-c", "echo alive").out == "alive\n"

    done = sbx("destroy", box["id"], "--json")
    assert done.code == 0, done.err
    assert show(sbx, box["id"])["state"] == "destroyed"
    assert standin.sandboxes[modal_id].result.status == TERMINATED
    assert standin.running_processes() == 0
    types = [e["type"] for e in events_of(sbx, box["id"])]
    assert types[0] == "sandbox.creating" and types[-1] == "sandbox.destroyed"
    no_token_anywhere(sbx.home, json.dumps(box), result.out, result.err, done.out, done.err)


def test_snapshot_destroy_restore_gives_back_the_files(sbx, standin, image, tmp_path):
    box = sbx.create("--profile-file", profile(tmp_path, image))
    written = sbx("exec", box["id"], "--", "sh", "-c",
                  "head -c 2048 /dev/urandom > blob && sha256sum blob")
    assert written.code == 0, written.err
    digest = written.out.split()[0]

    ckpt = sbx_json(sbx("snapshot", box["id"], "--name", "blob", "--json"))
    assert (ckpt["state"], ckpt["kind"]) == ("ready", "filesystem")
    assert ckpt["backend_ref"].startswith("im-") and ckpt["backend_ref"] in standin.images

    assert sbx("destroy", box["id"]).code == 0
    again = sbx_json(sbx("restore", ckpt["id"], "--label", RUN_LABEL, "--json"))
    assert again["state"] == "running" and again["id"] != box["id"]
    assert created(standin, again).definition.image_id == ckpt["backend_ref"]
    check = sbx("exec", again["id"], "--", "sha256sum", "blob")
    assert (check.code, check.out.split()[0]) == (0, digest)

    second = sbx_json(sbx("snapshot", again["id"], "--json"))
    assert second["parent_id"] == ckpt["id"]
    removed = sbx("checkpoint", "rm", second["id"])
    assert removed.code == 0, removed.err
    assert second["backend_ref"] in standin.deleted_images  # Modal deleted the image

    del standin.images[ckpt["backend_ref"]]  # Modal's 30-day expiry of snapshot images
    late = sbx("restore", ckpt["id"], "--label", RUN_LABEL)
    assert late.code == 1 and ckpt["backend_ref"] in late.err
    assert sbx("checkpoint", "rm", ckpt["id"]).code == 0  # an image already gone is fine
    assert sbx("destroy", again["id"]).code == 0


def test_gpu_sandbox_goes_through_modals_gpu_path(sbx, standin, image, tmp_path):
    """A GPU makes the SDK use Modal's V1 sandbox calls; the same lifecycle works there."""
    box = sbx.create("--profile-file", profile(tmp_path, image, (
        "resources: {gpu: T4}\nenv: {GREETING: hi}\n")))
    request = created(standin, box)
    assert isinstance(request, api_pb2.SandboxCreateRequest)
    assert request.definition.resources.gpu_config.gpu_type == "T4"
    result = sbx("exec", box["id"], "--", "sh", "-c", 'cat hello.txt; echo "$GREETING"')
    assert (result.code, result.out) == (0, "hello from the image\nhi\n")
    assert sbx("destroy", box["id"]).code == 0
    assert standin.sandboxes[box["backend_ref"]].result.status == TERMINATED


# -- what reaches Modal is what the profile says --------------------------------------------


def test_parameters_that_reach_modal_match_the_profile(sbx, standin, image, tmp_path, monkeypatch):
    monkeypatch.setenv("MODALTEST_API_KEY", "k-" + secrets.token_hex(8))
    path = profile(tmp_path, image, (
        "resources: {cpu: 0.5, memory: 256MiB}\n"
        "network: {mode: egress, allow: [10.0.0.0/8, 192.0.2.7, example.com, '*.pypi.org']}\n"
        "env: {GREETING: hi}\n"
        "secrets: {API_KEY: env:MODALTEST_API_KEY}\n"
        "ttl: {default: 10m, max: 2h, idle: 5m}\n"
        "options: {app: sbx-tests}\n"))
    box = sbx.create("--profile-file", path)
    request = created(standin, box)
    definition = request.definition
    # Modal's idle clock: sbx's idle limit plus a grace, so sbx's reaper ends it first
    assert definition.idle_timeout_secs == 5 * 60 + 60
    before = standin.sandboxes[box["backend_ref"]].last_activity
    touched = sbx("touch", box["id"])
    assert touched.code == 0, touched.err
    assert standin.sandboxes[box["backend_ref"]].last_activity > before  # Modal saw activity
    resources = definition.resources
    assert (resources.milli_cpu, resources.milli_cpu_max) == (500, 500)
    assert (resources.memory_mb, resources.memory_mb_max) == (256, 256)
    hard = datetime.fromisoformat(box["hard_deadline"].replace("Z", "+00:00"))
    made = datetime.fromisoformat(box["created_at"].replace("Z", "+00:00"))
    assert abs(definition.timeout_secs - (hard - made).total_seconds()) <= 5
    assert 7190 <= definition.timeout_secs <= 7200
    network = definition.network_access
    assert network.network_access_type == ALLOWLIST
    assert list(network.allowed_cidrs) == ["10.0.0.0/8", "192.0.2.7/32"]
    assert list(network.allowed_domains) == ["example.com", "*.pypi.org"]
    assert definition.image_id == image
    app_names = [c.request.app_name for c in standin.calls if c.method == "AppGetOrCreate"]
    assert "sbx-tests" in app_names
    assert request.app_id == standin.apps["sbx-tests"]

    # env and the secret reach the sandbox; the secret's value is written nowhere
    result = sbx("exec", box["id"], "--", "sh", "-c",
                 'echo "$GREETING"; printf %s "$API_KEY" | sha256sum')
    assert result.code == 0, result.err
    greeting, digest = result.out.splitlines()
    assert greeting == "hi"
    secret = os.environ["MODALTEST_API_KEY"]
    assert digest.split()[0] == hashlib.sha256(secret.encode()).hexdigest()
    for file in sbx.home.rglob("*"):
        if file.is_file():
            assert secret.encode() not in file.read_bytes(), file



def test_the_builtin_modal_profile_pulls_its_registry_image_with_no_network(sbx, standin):
    box = sbx.create("--profile", "modal")
    request = created(standin, box)
    definition = request.definition
    assert standin.registry_images[definition.image_id][0] == "FROM python:3.12-slim"
    assert definition.network_access.network_access_type == BLOCKED
    assert (definition.resources.milli_cpu, definition.resources.memory_mb_max) == (1000, 1024)
    assert request.app_id == standin.apps["sandboxer"]
    assert 4 * 3600 - 10 <= definition.timeout_secs <= 4 * 3600
    assert sbx("destroy", box["id"]).code == 0


def test_an_unreachable_modal_exits_5_and_writes_nothing(sbx, image, tmp_path, monkeypatch):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    monkeypatch.setenv("MODAL_SERVER_URL", f"http://127.0.0.1:{closed}")
    result = sbx("create", "--profile-file", profile(tmp_path, image))
    assert result.code == 5
    assert "Modal unreachable" in result.err and str(closed) in result.err
    assert table_rows(sbx.home, "sandboxes") == []


def test_what_modal_cannot_enforce_is_refused_before_anything_is_written(
        sbx, standin, image, tmp_path):
    before = len(standin.calls)
    cases = {
        "pids": ("resources: {pids: 64}\n", "resources.pids"),
        "disk": ("resources: {disk: 1GiB}\n", "resources.disk"),
        "port": ("network: {mode: egress, allow: ['example.com:443']}\n", "example.com:443"),
        "option": ("options: {region: eu}\n", "region"),
        "lifetime": ("ttl: {default: 1h, max: 25h}\n", "ttl.max"),
    }
    for name, (body, named) in cases.items():
        result = sbx("create", "--profile-file", profile(tmp_path, image, body, name=name))
        assert result.code == 4, (name, result.err)
        assert named in result.err and len(result.err.strip().splitlines()) == 1, result.err
    assert table_rows(sbx.home, "sandboxes") == [] and table_rows(sbx.home, "events") == []
    assert standin.calls[before:] == []


def test_extend_stops_at_the_hard_deadline_modal_enforces(sbx, standin, image, tmp_path):
    box = sbx.create("--profile-file", profile(tmp_path, image, "ttl: {default: 10m, max: 20m}\n"))
    assert 1190 <= created(standin, box).definition.timeout_secs <= 1200
    before = len(standin.calls)
    extended = sbx("extend", box["id"], "1h")
    assert extended.code == 0, extended.err
    assert "capped at the hard deadline" in extended.err
    assert show(sbx, box["id"])["deadline"] == box["hard_deadline"]
    assert sbx_json(sbx("extend", box["id"], "5m", "--json"))["capped"] is True
    # Modal cannot move its timeout: extend asks nothing of it
    assert [c.method for c in standin.calls[before:]
            if c.method.startswith("Sandbox")] == []


# -- tokens ---------------------------------------------------------------------------------


def test_missing_token_exits_5_naming_both_variables_and_writes_nothing(
        sbx, standin, image, tmp_path, monkeypatch):
    monkeypatch.delenv("MODAL_TOKEN_ID")
    before = len(standin.calls)
    result = sbx("create", "--profile-file", profile(tmp_path, image))
    assert result.code == 5
    assert "MODAL_TOKEN_ID" in result.err and "MODAL_TOKEN_SECRET" in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert table_rows(sbx.home, "sandboxes") == [] and table_rows(sbx.home, "events") == []
    assert standin.calls[before:] == []

    as_json = sbx("create", "--profile-file", profile(tmp_path, image), "--json")
    assert as_json.code == 5 and as_json.json()["error"]["code"] == 5


def test_bad_token_exits_5_with_a_clear_message_and_writes_nothing(
        sbx, standin, image, tmp_path, monkeypatch):
    wrong = "as-wrong" + secrets.token_hex(8)
    monkeypatch.setenv("MODAL_TOKEN_SECRET", wrong)
    refused = standin.rejected_tokens
    result = sbx("create", "--profile-file", profile(tmp_path, image))
    assert result.code == 5
    assert "refused the token" in result.err and "MODAL_TOKEN_SECRET" in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert wrong not in result.err + result.out
    assert standin.rejected_tokens > refused
    assert table_rows(sbx.home, "sandboxes") == []

    doctor = sbx("doctor", "--json")
    modal = next(b for b in doctor.json()["backends"] if b["name"] == "modal")
    assert (modal["reachable"], modal["credentials"]) == (True, False)
    assert wrong not in doctor.out
    for file in sbx.home.rglob("*"):
        if file.is_file():
            assert wrong.encode() not in file.read_bytes()


def test_doctor_reports_modal_and_no_token_value(sbx, standin):
    doctor = sbx("doctor", "--json")
    modal = next(b for b in doctor.json()["backends"] if b["name"] == "modal")
    assert (modal["loaded"], modal["reachable"], modal["credentials"]) == (True, True, True)
    assert modal["capabilities"] == ["exec", "files", "ports", "pty", "snapshot", "volumes"]
    no_token_anywhere(sbx.home, doctor.out, doctor.err)


def test_a_profile_may_name_its_own_token_variables(sbx, standin, image, tmp_path, monkeypatch):
    monkeypatch.delenv("MODAL_TOKEN_ID")
    monkeypatch.delenv("MODAL_TOKEN_SECRET")
    odd = sbx("create", "--profile-file", profile(tmp_path, image, (
        "options: {token_id: env:WORK_ID, token_secret: env:WORK_SECRET}\n"), name="odd"))
    assert odd.code == 4 and "MODAL_TOKEN_ID_<NAME>" in odd.err

    path = profile(tmp_path, image, (
        "options: {token_id: env:MODAL_TOKEN_ID_WORK, token_secret: env:MODAL_TOKEN_SECRET_WORK}\n"))
    missing = sbx("create", "--profile-file", path)
    assert missing.code == 5
    assert "MODAL_TOKEN_ID_WORK" in missing.err and "MODAL_TOKEN_SECRET_WORK" in missing.err
    assert table_rows(sbx.home, "sandboxes") == []

    monkeypatch.setenv("MODAL_TOKEN_ID_WORK", TOKEN_ID)
    monkeypatch.setenv("MODAL_TOKEN_SECRET_WORK", "as-wrong" + secrets.token_hex(8))
    refused = sbx("create", "--profile-file", path)
    assert refused.code == 5 and "refused the token in $MODAL_TOKEN_ID_WORK" in refused.err
    assert table_rows(sbx.home, "sandboxes") == []

    monkeypatch.setenv("MODAL_TOKEN_SECRET_WORK", TOKEN_SECRET)
    box = sbx.create("--profile-file", path)
    # only the variables' names travel with the sandbox, so the reaper can reach it
    assert box["backend_ref"].endswith(
        "?token_id=MODAL_TOKEN_ID_WORK&token_secret=MODAL_TOKEN_SECRET_WORK")
    assert sbx("exec", box["id"], "--", "true").code == 0
    # the reaper, which has no profile, lists under every MODAL_TOKEN_*_<NAME> pair set
    report = sbx_json(sbx("reconcile", "--json"))
    assert (report["reconciled"], report["failed"]) == ([], [])
    assert show(sbx, box["id"])["state"] == "running"
    assert sbx("destroy", box["id"]).code == 0
    modal_id = box["backend_ref"].partition("?")[0]
    assert standin.sandboxes[modal_id].result.status == TERMINATED
    no_token_anywhere(sbx.home, json.dumps(box))


def test_a_sandbox_on_another_modal_server_is_never_judged_from_this_one(
        sbx, standin, image, tmp_path, monkeypatch):
    box = sbx.create("--profile-file", profile(tmp_path, image))
    other = ModalStandin(tmp_path / "other-modal", TOKEN_ID, TOKEN_SECRET).start()
    try:
        monkeypatch.setenv("MODAL_SERVER_URL", other.url)
        report = sbx("reconcile", "--json")
        assert report.code == 5 and report.json()["reconciled"] == []
        destroy = sbx("destroy", box["id"])
        assert destroy.code == 5 and "another modal engine" in destroy.err
        assert show(sbx, box["id"])["state"] == "running"
        assert other.creates == [] and "SandboxTerminateV2" not in other.methods()
    finally:
        other.stop()
    assert standin.sandboxes[box["backend_ref"]].running


# -- gone, timed out, orphaned --------------------------------------------------------------


def test_destroying_a_sandbox_modal_no_longer_has_succeeds(sbx, standin, image, tmp_path):
    path = profile(tmp_path, image)
    ended, forgotten = sbx.create("--profile-file", path), sbx.create("--profile-file", path)
    standin.terminate_out_of_band(ended["backend_ref"])
    standin.forget(forgotten["backend_ref"])
    for box in (ended, forgotten):
        result = sbx("destroy", box["id"])
        assert result.code == 0, result.err
        assert show(sbx, box["id"])["state"] == "destroyed"
    run(with_adapter(lambda a: a.destroy("sb-v2-neverexisted")))  # no error


def test_a_sandbox_that_times_out_on_modal_is_lost_after_reconcile(sbx, standin, image, tmp_path):
    box = sbx.create("--profile-file", profile(tmp_path, image, "ttl: {default: 3s, max: 3s}\n"))
    sandbox = standin.sandboxes[box["backend_ref"]]
    assert 1 <= sandbox.definition.timeout_secs <= 3
    deadline = time.monotonic() + 60  # Modal ends it after 3 s; the limit is for a busy machine
    while sandbox.running and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sandbox.result.status == TIMEOUT  # Modal ended it by itself

    gone = sbx("exec", box["id"], "--", "true")
    assert gone.code == 4 and "ended" in gone.err
    report = sbx_json(sbx("reconcile", "--json"))
    assert any(r["id"] == box["id"] and r["state"] == "lost" for r in report["reconciled"])
    assert show(sbx, box["id"])["state"] == "lost"
    again = sbx_json(sbx("reconcile", "--json"))
    assert again["reconciled"] == []


def test_tagged_sandboxes_without_a_row_are_adopted_or_destroyed(sbx, standin, image):
    from sandboxer.core.rules.clock import to_iso
    from sandboxer.core.rules.ids import new_sandbox_id

    assert sbx("ls").code == 0
    install = install_id_of(sbx.home)
    now = datetime.now(UTC)

    def request(hard: datetime) -> CreateRequest:
        """Made behind sbx's back (its row lost), labelled with hard deadline `hard`; Modal's
        own timeout is an hour, so the object is still there when reconcile looks."""
        sandbox_id = new_sandbox_id()
        return CreateRequest(sandbox_id=sandbox_id, image=image,
                             hard_deadline=now + timedelta(hours=1), labels={
                                 LABEL_ID: sandbox_id, LABEL_INSTALL: install,
                                 LABEL_HARD_DEADLINE: to_iso(hard)})

    live, expired = request(now + timedelta(hours=1)), request(now - timedelta(minutes=1))

    async def make(adapter):
        return [await adapter.create(r) for r in (live, expired)]

    live_obj, expired_obj = run(with_adapter(make))
    report = sbx_json(sbx("reconcile", "--json"))
    assert expired.sandbox_id in report["orphans"]
    assert standin.sandboxes[expired_obj.ref].result.status == TERMINATED
    adopted = show(sbx, live.sandbox_id)
    assert (adopted["state"], adopted["backend"], adopted["backend_ref"]) == (
        "running", "modal", live_obj.ref)
    assert standin.sandboxes[live_obj.ref].running
    assert sbx("destroy", live.sandbox_id).code == 0


# -- the adapter directly -------------------------------------------------------------------


def test_list_reads_every_page_and_only_the_asked_tags(standin, image):
    install, other = f"inst-{secrets.token_hex(4)}", f"inst-{secrets.token_hex(4)}"
    hard = datetime.now(UTC) + timedelta(minutes=10)

    def request(tag: str, n: int) -> CreateRequest:
        return CreateRequest(sandbox_id=f"sbx-list{n}", image=image, hard_deadline=hard,
                             labels={LABEL_INSTALL: tag, LABEL_ID: f"sbx-list{n}"})

    async def scenario(adapter):
        mine = [await adapter.create(request(install, n)) for n in range(7)]
        theirs = [await adapter.create(request(other, n)) for n in range(7, 9)]
        pages_before = standin.methods().count("SandboxListV2")
        listed = await adapter.list({LABEL_INSTALL: install})
        pages = standin.methods().count("SandboxListV2") - pages_before
        await adapter.destroy(mine[0].ref)
        after = await adapter.list({LABEL_INSTALL: install})
        got = await adapter.get(mine[1].ref), await adapter.get(mine[0].ref)
        for obj in mine[1:] + theirs:
            await adapter.destroy(obj.ref)
        return mine, listed, pages, after, got

    mine, listed, pages, after, (running, ended) = run(with_adapter(scenario))
    assert standin.page_size == 3 and pages == 4  # 3 + 3 + 1, then an empty page
    assert sorted(o.ref for o in listed) == sorted(o.ref for o in mine)
    assert all(o.labels[LABEL_INSTALL] == install and o.running for o in listed)
    assert {o.labels[LABEL_ID] for o in listed} == {f"sbx-list{n}" for n in range(7)}
    assert len(after) == 6 and mine[0].ref not in {o.ref for o in after}
    assert running.running and running.labels[LABEL_ID] == "sbx-list1"
    assert ended is None  # Modal keeps only the record of an ended sandbox


def test_reconcile_removes_a_snapshot_image_of_ours_that_no_checkpoint_claims(
        sbx, standin, image, tmp_path):
    box = sbx.create("--profile-file", profile(tmp_path, image))
    install = install_id_of(sbx.home)
    stray_labels = {LABEL_CHECKPOINT: "ckpt-01stray0000000000000000000", LABEL_INSTALL: install,
                    LABEL_ID: box["id"]}
    others = {LABEL_CHECKPOINT: "ckpt-01other0000000000000000000", LABEL_INSTALL: "inst-other"}

    async def snapshots(adapter):  # made behind sbx's back: no checkpoint row claims them
        return (await adapter.snapshot(box["backend_ref"], stray_labels),
                await adapter.snapshot(box["backend_ref"], others))

    stray, foreign = run(with_adapter(snapshots))
    report = sbx_json(sbx("reconcile", "--json"))
    assert any(r.get("checkpoint") == stray_labels[LABEL_CHECKPOINT] for r in report["reconciled"])
    assert stray.ref in standin.deleted_images and stray.ref not in standin.images
    assert foreign.ref in standin.images  # another installation's: untouched
    listed = run(with_adapter(lambda a: a.list_artifacts({LABEL_INSTALL: install})))
    assert listed == []


# -- a terminal (Capability.PTY) ------------------------------------------------------------


def test_a_terminal_is_sized_in_the_sandbox_resized_with_sigwinch_and_closed(standin, image):
    """exec with pty=True (the stand-in runs it on a real pseudo-terminal): the size asked
    for before the program starts, a resize by a second exec reaching the shell as SIGWINCH
    (Modal has no resize call), the exit code from wait, and close() of a running terminal
    killing its program and its background job."""
    from sandboxer.adapters.testing import new_sandbox_id

    async def scenario(adapter):
        sandbox_id = new_sandbox_id()
        obj = await adapter.create(CreateRequest(
            sandbox_id=sandbox_id, image=image, hard_deadline=datetime.now(UTC) +
            timedelta(hours=1), labels={LABEL_ID: sandbox_id, LABEL_INSTALL: "inst-pty"}))
        try:
            term = await adapter.open_pty(obj.ref, ["sh"], cols=132, rows=50)
            try:
                await term.write(b"PS1='P''S> '; trap 'echo winch-seen' WINCH; sleep 300 & "
                                 b"echo \"bg=$! me=$$ end\"; stty size\n")
                seen = await terminal_until(term, b"50 132")
                pids = [int(seen.split(f"{n}=".encode())[-1].split()[0]) for n in ("bg", "me")]
                await terminal_until(term, b"PS> ", seen=seen.split(b"50 132")[-1])
                await term.resize(100, 30)
                await term.write(b"stty size\n")
                seen = await terminal_until(term, b"30 100")
                await terminal_until(term, b"winch-seen", seen=seen)
                assert all(alive(p) for p in pids)
            finally:
                await term.close()
            await term.close()
            left = wait_ended(pids)

            ended = await adapter.open_pty(obj.ref, ["sh", "-c", "read line; exit 7"])
            await ended.write(b"go\n")
            while await ended.read():
                pass
            await ended.close()
            return left, ended.exit_code
        finally:
            await adapter.destroy(obj.ref)

    left, code = run(with_adapter(scenario))
    assert left == [], "close() left the terminal's processes running"
    assert code == 7


def test_a_terminal_through_the_library_on_modal(image, sbx_home):
    """box.pty() on a modal profile: the core's login shell on the exec's terminal, the size
    asked for, a resize, and its exit code."""
    profile = {"name": "mdl-pty", "extends": "modal", "image": image}
    seen, code = run(library_terminal(sbx_home, "modal-test", profile))
    assert b"20 90" in seen and code == 4
