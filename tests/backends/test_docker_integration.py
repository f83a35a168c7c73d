"""The Docker backend against the real engine, driven through the real `sbx` CLI.

Every container here is made by `sbx` in the test's own SBX_HOME (so it carries that
installation's `sbx.install` label and the run label), and the `sbx` fixture removes exactly
those containers, by id, at teardown.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import time
import uuid
from pathlib import Path

import certifi
import docker
import pytest
from docker_proxy import EngineProxy
from support import (
    RUN_ID,
    containers_of,
    events_of,
    install_id_of,
    show,
    table_rows,
    write_profile,
)

from sandboxer.adapters.docker import DockerAdapter

pytestmark = pytest.mark.docker

MiB = 1024**2


# -- helpers --------------------------------------------------------------------------------


def cgroup_value(sbx, sandbox_id: str, *paths: str) -> str | None:
    """The first readable cgroup file among `paths` inside the sandbox (v2 or v1), or None."""
    script = "; ".join(f"cat {p} 2>/dev/null && exit 0" for p in paths) + "; exit 1"
    result = sbx("exec", sandbox_id, "--", "sh", "-c", script)
    return result.out.strip() if result.code == 0 else None


# -- create: labels and hardening -----------------------------------------------------------


def test_create_default_profile_labels_and_hardening(sbx, docker_api):
    box = sbx.create("--label", "team=infra", "--label", "purpose=ci")
    assert box["state"] == "running"
    assert box["backend"] == "docker"

    info = docker_api.inspect_container(box["backend_ref"])
    assert info["State"]["Running"] is True

    labels = info["Config"]["Labels"]
    assert labels["sbx.id"] == box["id"]
    assert labels["sbx.install"] == (sbx.home / "install-id").read_text().strip()
    assert labels["sbx.hard-deadline"] == box["hard_deadline"]
    assert labels["team"] == "infra"
    assert labels["purpose"] == "ci"
    assert labels["sbx-test-run"] == RUN_ID

    host = info["HostConfig"]
    assert host["CapDrop"] == ["ALL"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["NetworkMode"] == "none"
    assert host["Memory"] == 512 * MiB
    assert host["MemorySwap"] == host["Memory"]
    assert host["NanoCpus"] == 1_000_000_000
    assert host["PidsLimit"] == 256


def test_create_from_profile_file_applies_its_limits(sbx, docker_api, tmp_path):
    path = write_profile(tmp_path, "small", (
        "backend: docker\n"
        "image: sandboxer/base:busybox\n"
        "resources:\n  cpu: 0.5\n  memory: 256MiB\n  pids: 64\n"
    ))
    box = sbx.create("--profile-file", str(path))
    assert box["state"] == "running"
    assert box["profile"] == "small"

    host = docker_api.inspect_container(box["backend_ref"])["HostConfig"]
    assert host["NanoCpus"] == 500_000_000
    assert host["Memory"] == 256 * MiB
    assert host["MemorySwap"] == 256 * MiB
    assert host["PidsLimit"] == 64
    assert host["CapDrop"] == ["ALL"]
    assert host["NetworkMode"] == "none"


# -- exec -----------------------------------------------------------------------------------


def test_exec_passes_stdout_stderr_and_exit_code_through(sbx):
    box = sbx.create()
    result = sbx("exec", box["id"], "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert result.code == 7
    assert result.out == "out\n"
    assert result.err == "err\n"

    ok = sbx("exec", box["id"], "--", "sh", "-c", "echo fine")
    assert (ok.code, ok.out) == (0, "fine\n")


def processes_in(sbx, sandbox_id: str) -> list[str]:
    """The command lines of the sandbox's processes (busybox `ps`), the `ps` itself left out."""
    listed = sbx("exec", sandbox_id, "--", "ps", "-o", "args")
    assert listed.code == 0, listed.err
    return [line.strip() for line in listed.out.splitlines()[1:] if line.strip() != "ps -o args"]


def test_exec_timeout_kills_the_command_with_124(sbx):
    box = sbx.create()
    started = time.monotonic()
    result = sbx("exec", box["id"], "--timeout", "1s", "--", "sleep", "97", timeout=60)
    elapsed = time.monotonic() - started
    assert result.code == 124
    assert "may still run" not in result.err, result.err
    assert elapsed < 15, f"exec --timeout 1s took {elapsed:.1f}s"
    assert "sleep 97" not in processes_in(sbx, box["id"])  # the command is gone

    # The sandbox is still usable afterwards.
    after = sbx("exec", box["id"], "--", "sh", "-c", "echo alive")
    assert (after.code, after.out) == (0, "alive\n")


def test_exec_timeout_never_kills_a_host_process_the_engine_names(sbx):
    """An engine in a VM, rootless or behind a forwarded socket reports pids of its own pid
    namespace: here the engine names a process of this host that is not in the container
    (the test's own `sleep`). It lives on, and the command still ends, killed inside the
    container through the engine."""
    box = sbx.create()
    bystander = subprocess.Popen(["sleep", "300"])
    adapter = DockerAdapter()
    api = adapter._client()
    real_inspect = api.exec_inspect
    api.exec_inspect = lambda exec_id: {**real_inspect(exec_id), "Pid": bystander.pid}

    async def timed_out():
        try:
            return await adapter.exec(box["backend_ref"], ["sleep", "97"], timeout_s=1)
        finally:
            await adapter.close()

    try:
        result = asyncio.run(timed_out())
        assert result.exit_code == 124 and result.timed_out
        assert bystander.poll() is None, "sbx killed a process that is not the sandbox's"
        assert b"may still run" not in result.stderr, result.stderr
        assert "sleep 97" not in processes_in(sbx, box["id"])
    finally:
        bystander.kill()
        bystander.wait()


def test_exec_is_recorded_as_an_event_with_digests_not_output(sbx):
    box = sbx.create()
    argv = ["sh", "-c", "echo out; echo err >&2; exit 7"]
    assert sbx("exec", box["id"], "--", *argv).code == 7

    execs = [e for e in events_of(sbx, box["id"]) if e["type"] == "sandbox.exec"]
    assert len(execs) == 1
    payload = execs[0]["payload"]
    assert payload["argv"] == argv
    assert payload["exit_code"] == 7
    assert payload["stdout"]["sha256"] == hashlib.sha256(b"out\n").hexdigest()
    assert payload["stderr"]["sha256"] == hashlib.sha256(b"err\n").hexdigest()
    for stream in ("stdout", "stderr"):
        assert set(payload[stream]) <= {"sha256", "bytes"}, payload[stream]


def test_exec_output_content_never_reaches_the_event_log(sbx):
    box = sbx.create()
    # The output (abc-def-4711) does not appear in the argv, so any trace of it in the
    # event log could only come from the output itself.
    argv = ["sh", "-c", "printf '%s-%s-%s\\n' abc def 4711; printf '%s_%s\\n' err only >&2"]
    result = sbx("exec", box["id"], "--", *argv)
    assert (result.code, result.out, result.err) == (0, "abc-def-4711\n", "err_only\n")

    event = [e for e in events_of(sbx, box["id"]) if e["type"] == "sandbox.exec"][-1]
    assert event["payload"]["stdout"]["sha256"] == hashlib.sha256(b"abc-def-4711\n").hexdigest()
    raw = json.dumps(table_rows(sbx.home, "events"))
    assert "abc-def-4711" not in raw
    assert "err_only" not in raw


# -- logs -----------------------------------------------------------------------------------


def wait_for_logs(sbx, sandbox_id: str, needle: str, *args: str, within: float = 10) -> str:
    deadline = time.monotonic() + within
    while True:
        result = sbx("logs", sandbox_id, *args)
        assert result.code == 0, result.err
        if needle in result.out or time.monotonic() > deadline:
            return result.out
        time.sleep(0.2)


def test_logs_show_the_main_process_output(sbx, tmp_path):
    path = write_profile(tmp_path, "talker", (
        "extends: default\n"
        "command: [\"sh\", \"-c\", \"echo hello-from-sbx; exec sleep 3600\"]\n"
    ))
    box = sbx.create("--profile-file", str(path))
    out = wait_for_logs(sbx, box["id"], "hello-from-sbx")
    assert "hello-from-sbx" in out


def test_logs_tail_gives_only_the_last_lines(sbx, tmp_path):
    path = write_profile(tmp_path, "chatty", (
        "extends: default\n"
        "command: [\"sh\", \"-c\", \"echo line-one; echo line-two; echo line-three; "
        "exec sleep 3600\"]\n"
    ))
    box = sbx.create("--profile-file", str(path))
    full = wait_for_logs(sbx, box["id"], "line-three")
    assert full.splitlines() == ["line-one", "line-two", "line-three"]

    tail1 = sbx("logs", box["id"], "--tail", "1")
    assert tail1.code == 0, tail1.err
    assert tail1.out.splitlines() == ["line-three"]
    tail2 = sbx("logs", box["id"], "--tail", "2")
    assert tail2.out.splitlines() == ["line-two", "line-three"]


# -- destroy --------------------------------------------------------------------------------


def test_destroy_removes_the_container_and_records_events(sbx, docker_api):
    box = sbx.create()
    result = sbx("destroy", box["id"])
    assert result.code == 0, result.err
    with pytest.raises(docker.errors.NotFound):
        docker_api.inspect_container(box["backend_ref"])

    assert show(sbx, box["id"])["state"] == "destroyed"
    types = [e["type"] for e in events_of(sbx, box["id"])]
    assert types[-2:] == ["sandbox.destroying", "sandbox.destroyed"]


def test_destroy_after_out_of_band_removal_succeeds(sbx, docker_api):
    box = sbx.create()
    docker_api.remove_container(box["backend_ref"], force=True)

    result = sbx("destroy", box["id"])
    assert result.code == 0, result.err
    assert show(sbx, box["id"])["state"] == "destroyed"
    types = [e["type"] for e in events_of(sbx, box["id"])]
    assert types[-2:] == ["sandbox.destroying", "sandbox.destroyed"]


def test_destroy_twice_is_fine(sbx):
    box = sbx.create()
    first = sbx("destroy", box["id"])
    assert first.code == 0, first.err
    second = sbx("destroy", box["id"])
    assert second.code == 0, second.err
    assert "already destroyed" in second.out
    # no second pair of destroy events
    types = [e["type"] for e in events_of(sbx, box["id"])]
    assert types.count("sandbox.destroyed") == 1


# -- the engine unreachable ----------------------------------------------------------------


def test_engine_unreachable_exits_5_and_writes_nothing(sbx, docker_api):
    socket = f"/tmp/sbx-no-engine-{uuid.uuid4().hex}.sock"
    assert not Path(socket).exists()
    result = sbx("create", "--label", f"sbx-test-run={RUN_ID}",
                 env={"DOCKER_HOST": f"unix://{socket}"})
    assert result.code == 5, (result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert "dockerd" in lines[0] or "DOCKER_HOST" in lines[0]
    assert result.out == ""

    assert table_rows(sbx.home, "sandboxes") == []
    assert table_rows(sbx.home, "events") == []
    listed = sbx("ls", "--all", "--json")
    assert listed.code == 0
    assert listed.json() == []
    install = install_id_of(sbx.home)
    if install is not None:
        assert containers_of(docker_api, install) == []


def test_an_exec_on_another_engine_is_refused_not_judged_gone(sbx):
    """The engine's identity is asked when a command fails (docs/reliability.md, 5): a
    container that this engine does not know, of a sandbox recorded on another
    engine, is exit 5 naming DOCKER_HOST, and the sandbox stays running with no exec recorded.
    A command that ran found the container where the sandbox lives: it is kept."""
    import sqlite3

    box = sbx.create()
    db = sqlite3.connect(sbx.home / "sbx.db")
    try:
        with db:
            db.execute("UPDATE sandboxes SET backend_instance = 'ANOTHER:ENGINE' WHERE id = ?",
                       (box["id"],))
        ran = sbx("exec", box["id"], "--", "true")  # its container is here (an engine id renewed)
        assert ran.code == 0, ran.err
        with db:
            db.execute("UPDATE sandboxes SET backend_ref = ? WHERE id = ?",
                       ("f" * 64, box["id"]))  # another engine's container
    finally:
        db.close()
    execs = [e for e in events_of(sbx, box["id"]) if e["type"] == "sandbox.exec"]
    refused = sbx("exec", box["id"], "--", "true")
    assert refused.code == 5, (refused.out, refused.err)
    lines = refused.err.strip().splitlines()
    assert len(lines) == 1 and "another docker engine" in lines[0] and "DOCKER_HOST" in lines[0]
    assert show(sbx, box["id"])["state"] == "running"
    assert [e for e in events_of(sbx, box["id"]) if e["type"] == "sandbox.exec"] == execs
    assert len(execs) == 1


# -- limits really hold ---------------------------------------------------------------------


@pytest.fixture
def small_box(sbx, tmp_path):
    path = write_profile(tmp_path, "tight", (
        "extends: default\n"
        "resources:\n  cpu: 0.5\n  memory: 256MiB\n  pids: 64\n"
    ))
    return sbx.create("--profile-file", str(path))


def test_pids_limit_stops_a_fork_bomb(sbx, small_box):
    result = sbx("exec", small_box["id"], "--timeout", "25s", "--", "sh", "-c",
                 "for i in $(seq 100); do sleep 30 & done; wait", timeout=60)
    assert result.code != 124, "the fork loop was not stopped by the pids limit"
    assert result.code != 0 or "can't fork" in result.err, (result.code, result.err)


def test_memory_and_pids_limits_are_visible_in_the_cgroup(sbx, small_box, docker_api):
    host = docker_api.inspect_container(small_box["backend_ref"])["HostConfig"]
    assert host["Memory"] == 256 * MiB
    memory = cgroup_value(sbx, small_box["id"], "/sys/fs/cgroup/memory.max",
                          "/sys/fs/cgroup/memory/memory.limit_in_bytes")
    if memory is not None and memory.isdigit():
        assert int(memory) == 256 * MiB
    pids = cgroup_value(sbx, small_box["id"], "/sys/fs/cgroup/pids.max",
                        "/sys/fs/cgroup/pids/pids.max")
    if pids is not None and pids.isdigit():
        assert int(pids) == 64


# -- hardening a profile asks for: read_only, user, network full on sbx's own bridge --------


def test_read_only_gives_a_read_only_root_and_a_writable_tmp(sbx, docker_api, tmp_path):
    path = write_profile(tmp_path, "sealed", "extends: default\nread_only: true\n")
    box = sbx.create("--profile-file", str(path))
    for target in ("/probe", "/work/probe", "/etc/passwd"):
        wrote = sbx("exec", box["id"], "--", "sh", "-c", f"echo x >> {target}")
        assert wrote.code != 0 and "Read-only file system" in wrote.err, (target, wrote.err)
    tmp = sbx("exec", box["id"], "--", "sh", "-c", "echo written > /tmp/probe && cat /tmp/probe")
    assert (tmp.code, tmp.out) == (0, "written\n"), tmp.err
    host = docker_api.inspect_container(box["backend_ref"])["HostConfig"]
    assert host["ReadonlyRootfs"] is True and "/tmp" in host["Tmpfs"]
    assert show(sbx, box["id"])["profile_resolved"]["read_only"] is True


def test_without_read_only_the_root_stays_writable(sbx):
    box = sbx.create()
    wrote = sbx("exec", box["id"], "--", "sh", "-c", "echo x > /probe && cat /probe")
    assert (wrote.code, wrote.out) == (0, "x\n"), wrote.err


@pytest.mark.parametrize("user, uid, gid", [
    ("'4242:4243'", "4242", "4243"),
    ("4242", "4242", "0"),  # a bare uid in YAML; no group: root's group, as Docker does
    ("nobody", "65534", "65534"),  # a name, from the image's /etc/passwd
])
def test_user_runs_the_sandbox_and_its_commands_as_that_user(sbx, docker_api, tmp_path,
                                                             user, uid, gid):
    path = write_profile(tmp_path, "unprivileged", f"extends: default\nuser: {user}\n")
    box = sbx.create("--profile-file", str(path))
    ids = sbx("exec", box["id"], "--", "sh", "-c",
              "id -u; id -g; awk '/^Uid:/ {print $2}' /proc/1/status")
    assert ids.code == 0, ids.err
    assert ids.out.split() == [uid, gid, uid]  # every exec, and the main process
    assert docker_api.inspect_container(box["backend_ref"])["Config"]["User"] == user.strip("'")


def test_network_full_is_the_installations_own_bridge_without_inter_container_traffic(
        sbx, docker_api, tmp_path):
    """Checked through the engine's own record of the network; no traffic is sent."""
    path = write_profile(tmp_path, "online", "extends: default\nnetwork: {mode: full}\n")
    boxes = [sbx.create("--profile-file", str(path)) for _ in range(2)]
    install = install_id_of(sbx.home)
    name = f"sbx-{install}"
    network = docker_api.inspect_network(name)
    assert network["Driver"] == "bridge"
    assert network["Options"]["com.docker.network.bridge.enable_icc"] == "false"
    assert network["Labels"]["sbx.install"] == install
    assert set(network["Containers"]) == {box["backend_ref"] for box in boxes}
    for box in boxes:
        info = docker_api.inspect_container(box["backend_ref"])
        assert info["HostConfig"]["NetworkMode"] == name
        assert set(info["NetworkSettings"]["Networks"]) == {name}  # not Docker's default bridge
    mine = docker_api.networks(filters={"label": [f"sbx.install={install}"]})
    assert [n["Id"] for n in mine] == [network["Id"]]  # one for the installation
    for box in boxes:
        assert sbx("destroy", box["id"], "--yes").code == 0
    assert docker_api.inspect_network(name)["Containers"] == {}  # kept, empty


def test_a_network_of_that_name_that_sbx_did_not_make_is_refused(sbx, docker_api, tmp_path):
    assert sbx("ls").code == 0  # the installation and its id
    install = install_id_of(sbx.home)
    # inter-container traffic left on; the label lets teardown remove it
    docker_api.create_network(f"sbx-{install}", driver="bridge", labels={"sbx.install": install})
    path = write_profile(tmp_path, "online", "extends: default\nnetwork: {mode: full}\n")
    result = sbx("create", "--label", f"sbx-test-run={RUN_ID}", "--profile-file", str(path))
    assert result.code == 1, result.err
    assert f"docker network rm sbx-{install}" in result.err and "enable_icc=false" in result.err
    assert len(result.err.strip().splitlines()) == 1, result.err
    assert containers_of(docker_api, install) == []


# -- engines over TCP -----------------------------------------------------------------------


@pytest.fixture
def tls_engine(tmp_path):
    """The local engine behind TLS on 127.0.0.1, with a CA, server and client certificates
    made for this test; it requires the client's certificate."""
    proxy = EngineProxy(tmp_path / "tls-engine", tls=True)
    yield proxy
    proxy.close()


@pytest.fixture
def plain_engine(tmp_path):
    """The local engine behind a clear-text TCP port of 127.0.0.1."""
    proxy = EngineProxy(tmp_path / "plain-engine", tls=False)
    yield proxy
    proxy.close()


def test_a_tcp_engine_is_reached_over_tls_from_docker_tls_verify_and_cert_path(
        sbx, docker_api, tls_engine):
    # DOCKER_HOST=tcp://..., DOCKER_TLS_VERIFY=1, DOCKER_CERT_PATH; a CA bundle for other
    # programs (as many shells set) does not replace the engine's own CA
    env = {**tls_engine.env(), "REQUESTS_CA_BUNDLE": certifi.where()}
    box = sbx.create(env=env)
    assert box["state"] == "running"
    served = tls_engine.served
    assert served > 0  # the create went through the TLS proxy, with the client certificate
    assert docker_api.inspect_container(box["backend_ref"])["State"]["Running"]
    ran = sbx("exec", box["id"], "--", "echo", "over tls", env=env)
    assert (ran.code, ran.out) == (0, "over tls\n"), ran.err
    # the engine's identity is asked over TCP too (no socket file to remember it by), and
    # it is the same engine: reconcile through it sees the sandbox, not a lost one
    assert sbx("reconcile", "--json", env=env).code == 0
    assert show(sbx, box["id"])["state"] == "running"
    gone = sbx("destroy", box["id"], "--yes", env=env)
    assert gone.code == 0, gone.err
    assert tls_engine.served > served
    assert containers_of(docker_api, install_id_of(sbx.home)) == []


def test_a_tcp_engine_with_missing_certificates_is_refused_naming_the_folder(
        sbx, docker_api, tls_engine, tmp_path):
    empty = tmp_path / "no-certs"
    empty.mkdir()
    result = sbx("create", env={**tls_engine.env(), "DOCKER_CERT_PATH": str(empty)})
    assert result.code == 2, result.err
    assert str(empty) in result.err and "ca.pem" in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert table_rows(sbx.home, "sandboxes") == [] and table_rows(sbx.home, "events") == []
    assert tls_engine.served == 0


def test_a_tcp_engine_without_tls_is_refused_unless_the_user_accepts_it(
        sbx, docker_api, plain_engine, tls_engine):
    refused = sbx("create", "--label", f"sbx-test-run={RUN_ID}", env=plain_engine.env())
    assert refused.code == 2, refused.err
    [line] = refused.err.strip().splitlines()
    assert plain_engine.url in line and "without TLS" in line
    assert "DOCKER_TLS_VERIFY" in line and "SBX_DOCKER_ALLOW_PLAINTEXT=1" in line
    assert plain_engine.served == 0  # not a byte was sent
    assert table_rows(sbx.home, "sandboxes") == [] and table_rows(sbx.home, "events") == []
    install = install_id_of(sbx.home)
    assert install is None or containers_of(docker_api, install) == []

    # TLS that does not check the engine's certificate (DOCKER_CERT_PATH alone) is no better
    unverified = {"DOCKER_HOST": tls_engine.url, "DOCKER_CERT_PATH": str(tls_engine.cert_path)}
    half = sbx("create", env=unverified)
    assert half.code == 2 and "does not verify" in half.err, half.err
    assert tls_engine.served == 0

    accepted = {**plain_engine.env(), "SBX_DOCKER_ALLOW_PLAINTEXT": "1"}
    box = sbx.create(env=accepted)
    assert box["state"] == "running" and plain_engine.served > 0
    assert sbx("destroy", box["id"], "--yes", env=accepted).code == 0
    assert containers_of(docker_api, install_id_of(sbx.home)) == []
