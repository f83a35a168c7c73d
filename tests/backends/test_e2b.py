"""The E2B backend through the real `e2b` SDK against a local stand-in of E2B (its REST API and
envd's process service, tests/standins/e2b_server.py), mostly through the real `sbx` CLI.

Every test gets its own stand-in on 127.0.0.1 and its own SBX_HOME. At teardown each test
also proves that the stand-in met nothing it does not know (`problems`), and that no API key
value reached any file under SBX_HOME or any output of `sbx`.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from standins.e2b_server import DEFAULT_TIMEOUT_S, E2BStandIn
from support import (
    RUN_LABEL,
    SBX,
    Result,
    SbxRunner,
    alive,
    events_of,
    install_id_of,
    library_terminal,
    query,
    table_rows,
    terminal_until,
    wait_ended,
    write_profile,
)

from sandboxer.adapters.base import CreateRequest, ResourceLimits
from sandboxer.adapters.e2b import DEADLINE_GRACE, E2BAdapter

KEY = f"e2b_sbxtest_{secrets.token_hex(12)}"  # distinctive, so a leak is found by grep
TEAM_B_KEY = f"e2b_sbxtest_b_{secrets.token_hex(12)}"
SECRET = f"s3cr3t_{secrets.token_hex(12)}"
MiB = 1024**2


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture
def standin():
    server = E2BStandIn({KEY: "team-a", TEAM_B_KEY: "team-b"}, metrics_every=0.2).start()
    yield server
    server.stop()
    assert server.problems == [], f"the stand-in met what it does not know: {server.problems}"


@pytest.fixture
def e2b_env(standin, monkeypatch, sbx_home) -> dict[str, str]:
    """The environment that points the SDK at the stand-in (also set in this process), with
    the test's own SBX_HOME, where the adapter keeps its create-slot locks."""
    for name in list(os.environ):
        if name.startswith("E2B_"):
            monkeypatch.delenv(name)
    env = {"E2B_API_URL": standin.url, "E2B_SANDBOX_URL": standin.url, "E2B_API_KEY": KEY,
           "E2B_CONNECTION_RETRIES": "0", "SBX_E2B_RATE_LIMIT_BACKOFF": "0.01"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@dataclass
class E2BRunner:
    """The `sbx` runner with the stand-in's environment; keeps every output for the leak check."""

    sbx: object
    env: dict[str, str]
    outputs: list[str] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.sbx.home

    def __call__(self, *args: str, env: dict[str, str] | None = None,
                 timeout: float = 120) -> Result:
        result = self.sbx(*args, env={**self.env, **(env or {})}, timeout=timeout)
        self.outputs += [result.out, result.err]
        return result

    def create(self, *args: str, env: dict[str, str] | None = None) -> dict:
        if not any(a.startswith("--profile") for a in args):
            args = ("--profile", "e2b", *args)
        result = self("create", "--label", RUN_LABEL, *args, "--json", env=env)
        assert result.code == 0, result.err or result.out
        return result.json()

    def show(self, sandbox_id: str) -> dict:
        result = self("show", sandbox_id, "--json")
        assert result.code == 0, result.err
        return result.json()


@pytest.fixture
def e2b(sbx, e2b_env):
    runner = E2BRunner(sbx, e2b_env)
    yield runner
    for path in runner.home.rglob("*") if runner.home.exists() else []:
        if path.is_file():
            data = path.read_bytes()
            for secret in (KEY, TEAM_B_KEY, SECRET):
                assert secret.encode() not in data, f"a secret value is in {path}"
    for output in runner.outputs:
        for secret in (KEY, TEAM_B_KEY, SECRET):
            assert secret not in output, "a secret value reached sbx's output"


def run(coro):
    return asyncio.run(coro)


def request(sandbox_id: str, install: str = "inst-test", **changes) -> CreateRequest:
    """A create request as the core makes it from the built-in e2b profile."""
    hard = datetime.now(UTC) + timedelta(hours=1)
    fields = dict(sandbox_id=sandbox_id,
                  labels={"sbx.id": sandbox_id, "sbx.install": install,
                          "sbx.hard-deadline": hard.isoformat()},
                  image="base", resources=ResourceLimits(cpu=2), hard_deadline=hard,
                  options={"max_concurrent": 20})
    fields.update(changes)
    return CreateRequest(**fields)


def near(actual: datetime, expected: datetime, within: float = 5) -> bool:
    return abs((actual - expected).total_seconds()) <= within


def parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def wait_until(condition, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


# -- the stand-in itself --------------------------------------------------------------------


def test_stand_in_refuses_and_records_what_it_does_not_know(standin):
    reply = httpx.get(f"{standin.url}/v3/sandboxes", headers={"X-API-KEY": KEY})
    assert reply.status_code == 501
    assert "unknown endpoint" in reply.json()["message"]
    bad = httpx.post(f"{standin.url}/v2/sandboxes", headers={"X-API-KEY": KEY},
                     json={"templateID": "base", "newField": 1})
    assert bad.status_code == 400
    assert standin.problems == ["unknown endpoint GET /v3/sandboxes",
                                "NewSandboxV2: unknown fields ['newField']"]
    standin.problems.clear()  # seen: the fixture checks that nothing else was met


# -- lifecycle through the CLI --------------------------------------------------------------


def test_create_exec_destroy_through_the_cli(e2b, standin, tmp_path):
    path = write_profile(tmp_path, "cloud", (
        "extends: e2b\n"
        "env:\n  GREETING: hello-e2b\n"
        "secrets:\n  TOKEN: env:SBX_TEST_TOKEN\n"
        "labels:\n  team: infra\n"
    ))
    box = e2b.create("--profile-file", str(path), env={"SBX_TEST_TOKEN": SECRET})
    assert (box["state"], box["backend"], box["profile"]) == ("running", "e2b", "cloud")

    remote = standin.sandboxes[box["backend_ref"]]
    assert remote.template_id == "base"
    assert remote.metadata["sbx.id"] == box["id"]
    assert remote.metadata["sbx.install"] == install_id_of(e2b.home)
    assert remote.metadata["sbx.hard-deadline"] == box["hard_deadline"]
    assert remote.metadata["team"] == "infra"
    assert remote.env_vars == {"GREETING": "hello-e2b", "TOKEN": SECRET}
    assert remote.allow_internet_access is False  # network mode none
    # the engine it lives on is the API base, never anything derived from the key
    assert query(e2b.home, "SELECT backend_instance FROM sandboxes")[0] == {
        "backend_instance": standin.url}

    result = e2b("exec", box["id"], "--", "sh", "-c", "echo $GREETING; echo err >&2; exit 7")
    assert (result.code, result.out, result.err) == (7, "hello-e2b\n", "err\n")
    quoted = e2b("exec", box["id"], "--", "printf", "%s|", "two words", "it's")
    assert (quoted.code, quoted.out) == (0, "two words|it's|")

    no_logs = e2b("logs", box["id"])  # E2B has no log stream of a main process
    assert no_logs.code == 4 and "no logs" in no_logs.err

    done = e2b("destroy", box["id"])
    assert done.code == 0, done.err
    assert box["backend_ref"] not in standin.sandboxes
    assert e2b.show(box["id"])["state"] == "destroyed"
    types = [e["type"] for e in events_of(e2b.sbx, box["id"])]
    assert types[-2:] == ["sandbox.destroying", "sandbox.destroyed"]
    assert [e for e in events_of(e2b.sbx, box["id"]) if e["type"] == "sandbox.exec"]


def test_exec_timeout_kills_the_command_and_the_sandbox_stays_usable(e2b, standin):
    box = e2b.create()
    started = time.monotonic()
    result = e2b("exec", box["id"], "--timeout", "1s", "--", "sleep", "30")
    assert result.code == 124, result.err
    assert time.monotonic() - started < 15
    pid = standin.started_pids[0]  # the command (the next: the kill by its mark)
    wait_until(lambda: not standin.sandboxes[box["backend_ref"]].processes)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the command itself is gone, not just forgotten
    after = e2b("exec", box["id"], "--", "echo", "alive")
    assert (after.code, after.out) == (0, "alive\n")


def test_snapshot_restore_pause_resume_through_the_cli(e2b, standin):
    box = e2b.create()
    wrote = e2b("exec", box["id"], "--", "sh", "-c", "echo kept-bytes > data.txt")
    assert wrote.code == 0, wrote.err

    made = e2b("snapshot", box["id"], "--json")
    assert made.code == 0, made.err
    ckpt = made.json()
    (snap,) = standin.snapshots.values()
    assert snap.name == f"sbx_{install_id_of(e2b.home)}_{ckpt['id']}"
    assert snap.source == box["backend_ref"]

    restored = e2b("restore", ckpt["id"], "--json")
    assert restored.code == 0, restored.err
    copy = restored.json()
    assert standin.sandboxes[copy["backend_ref"]].template_id == snap.template_id
    read = e2b("exec", copy["id"], "--", "cat", "data.txt")
    assert (read.code, read.out) == (0, "kept-bytes\n")

    assert e2b("pause", box["id"]).code == 0
    assert standin.sandboxes[box["backend_ref"]].state == "paused"
    assert e2b.show(box["id"])["state"] == "paused"
    refused = e2b("exec", box["id"], "--", "true")
    assert refused.code == 4, refused.err
    resumed = e2b("resume", box["id"])
    assert resumed.code == 0, resumed.err
    remote = standin.sandboxes[box["backend_ref"]]
    assert remote.state == "running"
    # resumed, E2B's clock runs again until the sandbox's deadline (plus the grace)
    assert near(remote.end_at, parse(box["deadline"]) + DEADLINE_GRACE)
    again = e2b("exec", box["id"], "--", "cat", "data.txt")
    assert (again.code, again.out) == (0, "kept-bytes\n")

    exported = e2b("checkpoint", "export", ckpt["id"], "-o", "ckpt.tar.gz")
    assert exported.code == 4 and "cannot export" in exported.err  # E2B snapshots stay there

    removed = e2b("checkpoint", "rm", ckpt["id"])
    assert removed.code == 0, removed.err
    assert standin.snapshots == {}


def test_extend_moves_the_timeout_e2b_holds(e2b, standin):
    box = e2b.create("--ttl", "10m")
    remote = standin.sandboxes[box["backend_ref"]]
    # at create E2B's timeout is the sandbox's deadline plus the grace, not the hard deadline
    assert near(remote.end_at, parse(box["deadline"]) + DEADLINE_GRACE)
    assert not near(remote.end_at, parse(box["hard_deadline"]) + DEADLINE_GRACE)

    extended = e2b("extend", box["id"], "20m", "--json")
    assert extended.code == 0, extended.err
    deadline = parse(extended.json()["deadline"])
    assert near(deadline, parse(box["deadline"]) + timedelta(minutes=20), within=1)
    assert near(remote.end_at, deadline + DEADLINE_GRACE)
    assert standin.count("timeout", 204) == 1


def test_metrics_come_from_e2b_metrics_endpoint(e2b, standin):
    box = e2b.create()
    result = e2b("metrics", box["id"], "--json")
    assert result.code == 0, result.err
    sample = result.json()
    remote = standin.sandboxes[box["backend_ref"]]
    reading = remote.metrics[-1]
    # E2B reports the share of the whole VM; sbx counts one core as 100 %
    assert sample["cpu_pct"] == pytest.approx(reading.cpu_used_pct * remote.cpu_count)
    assert sample["memory_limit"] == 512 * MiB
    assert sample["memory_bytes"] == reading.mem_used
    assert standin.count("metrics", 200) >= 1


def test_doctor_reports_e2b_health(e2b, standin):
    good = e2b("doctor", "--json")
    (report,) = [b for b in good.json()["backends"] if b["name"] == "e2b"]
    assert (report["reachable"], report["credentials"]) == (True, True)
    assert report["capabilities"] == ["exec", "files", "metrics", "pause", "ports", "pty",
                                      "set-deadline", "snapshot", "volumes"]
    bad = e2b("doctor", "--json", env={"E2B_API_KEY": "wrong-key"})
    (report,) = [b for b in bad.json()["backends"] if b["name"] == "e2b"]
    assert (report["reachable"], report["credentials"]) == (True, False)
    assert "E2B_API_KEY" in report["detail"]
    unset = e2b("doctor", "--json", env={"E2B_API_KEY": ""})
    (report,) = [b for b in unset.json()["backends"] if b["name"] == "e2b"]
    assert report["credentials"] is False and "E2B_API_KEY is not set" in report["detail"]


# -- credentials ----------------------------------------------------------------------------


@pytest.mark.parametrize("key, says", [("wrong-key", "refused the API key in E2B_API_KEY"),
                                       ("", "set E2B_API_KEY")])
def test_bad_or_missing_key_exits_5_naming_the_variable_and_writes_nothing(
        e2b, standin, key, says):
    result = e2b("create", "--profile", "e2b", "--label", RUN_LABEL,
                 env={"E2B_API_KEY": key})
    assert result.code == 5, (result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], result.err
    assert result.out == ""
    as_json = e2b("create", "--profile", "e2b", "--json", env={"E2B_API_KEY": key})
    assert as_json.code == 5
    assert as_json.json()["error"]["code"] == 5
    assert table_rows(e2b.home, "sandboxes") == []
    assert table_rows(e2b.home, "events") == []
    assert standin.sandboxes == {}
    assert standin.count("create") == 0


def test_per_profile_key_reaches_its_own_team_and_names_only_the_variable(
        e2b, standin, tmp_path):
    path = write_profile(tmp_path, "team-b", (
        "extends: e2b\noptions:\n  api_key: env:E2B_API_KEY_TEAM_B\n"))
    env = {"E2B_API_KEY_TEAM_B": TEAM_B_KEY}
    box = e2b.create("--profile-file", str(path), env=env)
    sandbox_id, _, variable = box["backend_ref"].partition("@")
    assert variable == "E2B_API_KEY_TEAM_B"
    assert standin.sandboxes[sandbox_id].team == "team-b"

    # the reaper has no profile: the variable named in the reference leads it to the key
    checked = e2b("reconcile", "--json", env=env)
    assert checked.code == 0, checked.err
    assert e2b.show(box["id"])["state"] == "running"
    ran = e2b("exec", box["id"], "--", "echo", "b", env=env)
    assert (ran.code, ran.out) == (0, "b\n")
    without = e2b("exec", box["id"], "--", "echo", "b")
    assert without.code == 5 and "E2B_API_KEY_TEAM_B" in without.err
    assert e2b("destroy", box["id"], env=env).code == 0
    assert sandbox_id not in standin.sandboxes

    bad = write_profile(tmp_path, "bad-key", "extends: e2b\noptions:\n  api_key: env:MY_KEY\n")
    refused = e2b("create", "--profile-file", str(bad), env={"MY_KEY": TEAM_B_KEY})
    assert refused.code == 4 and "E2B_API_KEY_<NAME>" in refused.err
    unset = e2b("create", "--profile-file", str(path))
    assert unset.code == 5 and "E2B_API_KEY_TEAM_B" in unset.err
    assert len(table_rows(e2b.home, "sandboxes")) == 1  # the refused creates wrote nothing


# -- failures and recovery ------------------------------------------------------------------


def test_destroy_of_a_sandbox_e2b_no_longer_has_is_success(e2b, standin):
    box = e2b.create()
    run(E2BAdapter().destroy(box["backend_ref"]))  # killed out of band
    result = e2b("destroy", box["id"])
    assert result.code == 0, result.err
    assert standin.count("kill", 404) == 1
    assert e2b.show(box["id"])["state"] == "destroyed"


def test_rate_limits_are_retried_then_fail_with_a_clear_error(e2b, standin):
    standin.rate_limit(2, "create")
    box = e2b.create()
    assert box["state"] == "running"
    assert standin.count("create", 429) == 2 and standin.count("create", 201) == 1

    standin.rate_limit(100, "create")
    result = e2b("create", "--profile", "e2b", "--label", RUN_LABEL,
                 env={"SBX_E2B_RATE_LIMIT_RETRIES": "2"})
    assert result.code == 1, result.err
    assert "E2B kept refusing to create a sandbox" in result.err
    assert "3 attempts" in result.err and "429" in result.err
    assert standin.count("create", 429) == 2 + 3
    assert len(standin.sandboxes) == 1


def test_a_sandbox_e2b_expires_on_its_own_is_lost_after_reconcile(e2b, standin):
    box = e2b.create()
    kept = e2b.create()
    standin.sandboxes[kept["backend_ref"]].end_at += timedelta(hours=3)
    standin.advance(2 * 3600)  # past E2B's timeout for `box`: the stand-in ends it
    wait_until(lambda: box["backend_ref"] in standin.expired)
    result = e2b("reconcile", "--json")
    assert result.code == 0, result.err
    assert e2b.show(box["id"])["state"] == "lost"
    assert e2b.show(kept["id"])["state"] == "running"
    again = e2b("reconcile", "--json")
    assert again.json()["reconciled"] == []


@pytest.mark.parametrize("hard_in, outcome", [(timedelta(hours=1), "adopted"),
                                              (timedelta(hours=-1), "destroyed")])
def test_an_e2b_sandbox_of_ours_without_a_row_is_adopted_or_destroyed(
        e2b, standin, hard_in, outcome):
    assert e2b("reconcile").code == 0  # makes this installation's id
    install = install_id_of(e2b.home)
    hard = datetime.now(UTC) + hard_in
    orphan_id = "sbx-01jorphan0000000000000000"
    obj = run(E2BAdapter().create(request(orphan_id, install, labels={
        "sbx.id": orphan_id, "sbx.install": install,
        "sbx.hard-deadline": hard.isoformat().replace("+00:00", "Z")})))
    standin.sandboxes[obj.ref].started_at -= timedelta(minutes=5)  # older than the grace
    stranger = run(E2BAdapter().create(request("sbx-01jstranger00000000000000", "inst-other")))
    standin.sandboxes[stranger.ref].started_at -= timedelta(minutes=5)

    result = e2b("reconcile", "--json")
    assert result.code == 0, result.err
    if outcome == "adopted":
        row = e2b.show(orphan_id)
        assert (row["state"], row["backend_ref"], row["profile"]) == (
            "running", obj.ref, "(adopted)")
        assert obj.ref in standin.sandboxes
    else:
        assert obj.ref not in standin.sandboxes
        assert obj.ref in standin.killed
    assert stranger.ref in standin.sandboxes  # another installation's: never touched


def test_reap_destroys_an_expired_sandbox_and_sweeps_orphan_snapshots(e2b, standin):
    box = e2b.create("--ttl", "5m")
    made = e2b("snapshot", box["id"], "--json")
    assert made.code == 0, made.err
    # a snapshot of this installation that no row claims (its row is gone)
    install = install_id_of(e2b.home)
    run(E2BAdapter().snapshot(box["backend_ref"], {"sbx.install": install,
                                                  "sbx.checkpoint": "ckpt-01jlost00000000"}))
    assert len(standin.snapshots) == 2
    result = e2b("reap", "--json", env={"SBX_CLOCK_OFFSET": "6m"})
    assert result.code == 0, result.err
    assert result.json()["destroyed"] == [box["id"]]
    assert box["backend_ref"] not in standin.sandboxes
    assert [s.name for s in standin.snapshots.values()] == [
        f"sbx_{install}_{made.json()['id']}"]


# -- validation: refuse what E2B cannot enforce, before anything is written ----------------


@pytest.mark.parametrize("body, code, says", [
    ("resources:\n  pids: 64\n", 4, "resources.pids"),
    ("resources:\n  disk: 1GiB\n", 4, "resources.disk"),
    ('command: ["sleep", "1"]\n', 4, "command"),
    ("network:\n  mode: egress\n  allow: [\"example.com:443\"]\n", 4, "example.com:443"),
    ("options:\n  shape: large\n", 4, "no option shape"),
    ("options:\n  max_concurrent: 0\n", 4, "max_concurrent"),
    ("ttl:\n  max: 25h\n", 4, "at most 24 hours"),
])
def test_what_e2b_cannot_enforce_is_refused_and_nothing_is_written(
        e2b, standin, tmp_path, body, code, says):
    path = write_profile(tmp_path, "asks-too-much", "extends: e2b\n" + body)
    result = e2b("create", "--profile-file", str(path))
    assert result.code == code, result.err
    assert says in result.err
    assert table_rows(e2b.home, "sandboxes") == []
    assert standin.count("create") == 0


def test_a_template_larger_than_the_profile_allows_is_refused_and_not_leaked(
        e2b, standin, tmp_path):
    path = write_profile(tmp_path, "one-cpu", "extends: e2b\nresources:\n  cpu: 1\n")
    result = e2b("create", "--profile-file", str(path), "--json")
    assert result.code == 4
    assert "2 vCPU, more than resources.cpu 1" in result.json()["error"]["message"]
    assert standin.sandboxes == {} and len(standin.killed) == 1
    (row,) = table_rows(e2b.home, "sandboxes")
    assert "failed" in row


def test_network_modes_map_to_e2b_create(e2b, standin, tmp_path):
    egress = write_profile(tmp_path, "egress", (
        "extends: e2b\nnetwork:\n  mode: egress\n  allow: [\"pypi.org\", \"1.1.1.1\", "
        "\"10.0.0.0/8\"]\n"))
    box = e2b.create("--profile-file", str(egress))
    remote = standin.sandboxes[box["backend_ref"]]
    assert remote.network == {"allowOut": ["pypi.org", "1.1.1.1", "10.0.0.0/8"],
                              "denyOut": ["0.0.0.0/0"]}
    full = write_profile(tmp_path, "full", "extends: e2b\nnetwork:\n  mode: full\n")
    box = e2b.create("--profile-file", str(full))
    assert standin.sandboxes[box["backend_ref"]].allow_internet_access is True


# -- the adapter directly ------------------------------------------------------------------


def test_list_reads_every_page_and_filters_by_metadata(e2b_env, standin):
    standin.page_size = 2
    adapter = E2BAdapter()

    async def scenario():
        mine = [await adapter.create(request(f"sbx-01jmine{i:018d}", "inst-mine"))
                for i in range(5)]
        theirs = [await adapter.create(request(f"sbx-01jtheirs{i:016d}", "inst-theirs"))
                  for i in range(2)]
        await adapter.pause(mine[0].ref)
        listed = await adapter.list({"sbx.install": "inst-mine"})
        one = await adapter.list({"sbx.install": "inst-mine", "sbx.id": mine[3].labels["sbx.id"]})
        return mine, theirs, listed, one

    pages_before = standin.count("list")
    mine, theirs, listed, one = run(scenario())
    assert sorted(o.ref for o in listed) == sorted(o.ref for o in mine)
    assert {o.ref: o.status for o in listed}[mine[0].ref] == "paused"
    assert [o.ref for o in one] == [mine[3].ref]
    assert standin.count("list") - pages_before >= 3 + 1  # 5 sandboxes, 2 a page


def test_get_pause_set_deadline_and_destroy_are_idempotent(e2b_env, standin):
    adapter = E2BAdapter()

    async def scenario():
        obj = await adapter.create(request("sbx-01jidem000000000000000000"))
        await adapter.pause(obj.ref)
        await adapter.pause(obj.ref)  # paused already: fine
        paused = await adapter.get(obj.ref)
        # paused: E2B has no clock running for it; resume will set one
        await adapter.set_deadline(obj.ref, datetime.now(UTC) + timedelta(minutes=5))
        await adapter.resume(obj.ref)
        await adapter.set_deadline(obj.ref, datetime.now(UTC) + timedelta(minutes=5))
        end_at = standin.sandboxes[obj.ref].end_at
        await adapter.destroy(obj.ref)
        await adapter.destroy(obj.ref)
        return obj, paused, end_at, await adapter.get(obj.ref)

    obj, paused, end_at, gone = run(scenario())
    assert (paused.status, paused.running) == ("paused", False)
    assert near(end_at, datetime.now(UTC) + timedelta(minutes=5) + DEADLINE_GRACE)
    assert gone is None
    assert standin.count("pause", 409) == 1 and standin.count("kill", 404) == 1


def test_concurrent_creates_never_exceed_max_concurrent(e2b_env, standin):
    standin.create_delay = 0.3
    adapter = E2BAdapter()

    async def burst():
        return await asyncio.gather(*(
            adapter.create(request(f"sbx-01jburst{i:017d}", options={"max_concurrent": 2}))
            for i in range(6)))

    made = run(burst())
    assert len({o.ref for o in made}) == 6
    assert standin.max_creates_in_flight == 2


def test_concurrent_sbx_processes_share_the_limit(e2b, standin, tmp_path):
    """Six `sbx create` processes at once, max_concurrent 2: E2B never sees more than two."""
    standin.create_delay = 1.0
    path = write_profile(tmp_path, "two-at-a-time",
                         "extends: e2b\noptions:\n  max_concurrent: 2\n")
    procs = [subprocess.Popen([*SBX, "create", "--profile-file", str(path), "--label",
                               RUN_LABEL, "--json"], cwd=e2b.sbx.cwd,
                              env=e2b.sbx.env(e2b.env), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(6)]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        e2b.outputs += [out, err]
        assert proc.returncode == 0, err
    assert len(standin.sandboxes) == 6
    assert standin.max_creates_in_flight == 2


def test_create_slot_locks_live_in_the_state_folder_not_in_a_shared_tmp(e2b, standin,
                                                                         tmp_path):
    """The create-slot lock files once lived in /tmp/sbx-e2b-slots-UID, a name any local user
    could take first (and hold the locks, or plant links). Now they live in the state folder,
    which sbx checks: a folder someone made in the temp folder is never used."""
    shared_tmp = tmp_path / "shared-tmp"
    squatted = shared_tmp / f"sbx-e2b-slots-{os.getuid()}"
    squatted.mkdir(parents=True)
    squatted.chmod(0o777)
    if os.geteuid() == 0:
        os.chown(squatted, 65534, 65534)  # another user's, as it would be
    e2b.create(env={"TMPDIR": str(shared_tmp)})
    assert list(squatted.iterdir()) == []
    locks = list((e2b.home / "e2b-slots").iterdir())
    assert locks and all(p.suffix == ".lock" for p in locks)
    assert {p.stat().st_mode & 0o777 for p in locks} == {0o600}


def test_sandbox_default_timeout_is_never_what_sbx_relies_on(e2b_env, standin):
    """A create always sends E2B a timeout of its own (E2B's default is 5 minutes)."""
    run(E2BAdapter().create(request("sbx-01jtimeout000000000000000")))
    (remote,) = standin.sandboxes.values()
    assert remote.timeouts[0] != DEFAULT_TIMEOUT_S
    assert remote.timeouts[0] >= 3600


def test_reconcile_without_a_profiles_key_variable_does_not_judge_its_sandboxes(
        e2b, standin, tmp_path):
    path = write_profile(tmp_path, "team-b", (
        "extends: e2b\noptions:\n  api_key: env:E2B_API_KEY_TEAM_B\n"))
    box = e2b.create("--profile-file", str(path), env={"E2B_API_KEY_TEAM_B": TEAM_B_KEY})
    result = e2b("reconcile", "--json")  # E2B_API_KEY_TEAM_B is not set here
    assert result.code == 0, result.err
    assert e2b.show(box["id"])["state"] == "running"  # not judged lost by a blind listing
    assert any("not checked" in s["error"] for s in result.json()["skipped"])


# -- fleets: one inventory, several hosts -------------------------------------------------


@pytest.mark.docker
def test_in_a_fleet_any_host_reaps_an_expired_e2b_sandbox_but_not_anothers_docker_one(
        e2b, standin, docker_api, tmp_path):
    """Two installations share one inventory. Host B's reaper ends host A's expired E2B
    sandbox (E2B is a shared backend both reach) but leaves A's expired Docker sandbox to A:
    a Docker engine belongs to its host."""
    shared = {"SBX_DATABASE_URL": f"sqlite:///{tmp_path / 'fleet.db'}"}
    box = e2b.create("--ttl", "5m", env={**shared, "SBX_HOST_NAME": "host-a"})
    local = e2b("create", "--label", RUN_LABEL, "--ttl", "5m", "--json",
                env={**shared, "SBX_HOST_NAME": "host-a"})
    assert local.code == 0, local.err
    local = local.json()
    host_b = E2BRunner(SbxRunner(tmp_path / "home-b", tmp_path), e2b.env)
    reaped = host_b("reap", "--json",
                    env={**shared, "SBX_HOST_NAME": "host-b", "SBX_CLOCK_OFFSET": "6m"})
    assert reaped.code == 0, reaped.err
    assert reaped.json()["destroyed"] == [box["id"]]
    assert box["backend_ref"] not in standin.sandboxes
    assert e2b("show", box["id"], "--json", env=shared).json()["state"] == "destroyed"
    assert e2b("show", local["id"], "--json", env=shared).json()["state"] == "running"
    assert docker_api.inspect_container(local["backend_ref"])["State"]["Running"]
    # its own host's reaper does end it
    mine = e2b("reap", "--json", env={**shared, "SBX_CLOCK_OFFSET": "6m"})
    assert mine.code == 0 and mine.json()["destroyed"] == [local["id"]]


def test_a_terminal_runs_on_envds_pty_resizes_and_close_ends_what_it_started(e2b_env, standin):
    """open_pty through the SDK: envd's Start with a pty of the size asked, keystrokes as pty
    input, Update's new size reaching the program as SIGWINCH, and close() killing the
    program and what it started in the background."""
    adapter = E2BAdapter()

    async def scenario():
        obj = await adapter.create(request("sbx-01jpty00000000000000000000"))
        term = await adapter.open_pty(obj.ref, ["sh"], cols=132, rows=50)
        try:
            await term.write(b"PS1='P''S> '; trap 'echo winch-seen' WINCH; sleep 300 & "
                             b"echo \"bg=$! me=$$ end\"; stty size\n")
            seen = await terminal_until(term, b"50 132")
            # the shell has the terminal back (its prompt): the signal of a resize is its
            await terminal_until(term, b"PS> ", seen=seen.split(b"50 132")[-1])
            bg = int(seen.split(b"bg=")[-1].split()[0])
            me = int(seen.split(b"me=")[-1].split()[0])
            await term.resize(100, 30)
            await term.write(b"stty size\n")
            seen = await terminal_until(term, b"30 100")
            seen = await terminal_until(term, b"winch-seen", seen=seen)
            assert alive(bg) and alive(me)
        finally:
            await term.close()
        await term.close()
        left = wait_ended([bg, me])
        await adapter.destroy(obj.ref)
        return left

    left = run(scenario())
    assert left == [], "close() left the terminal's processes running"
    paths = [path for _, path, _ in standin.calls]
    assert "/process.Process/Update" in paths and "/process.Process/SendInput" in paths


def test_a_terminal_through_the_library_on_e2b(e2b_env, standin, sbx_home):
    """box.pty() with the built-in e2b profile: the core's login shell on envd's pty, the
    size asked for, a resize, and its exit code."""
    seen, code = run(library_terminal(sbx_home, "e2b-test", "e2b"))
    assert b"20 90" in seen and code == 4
