"""The Docker backend on an engine reached over SSH (`DOCKER_HOST=ssh://...`, a real OpenSSH
server on 127.0.0.1 in front of the local engine), and sandboxes with `services:` (containers
beside the main one in its network namespace, as in a pod)."""

from __future__ import annotations

import signal
import time

import pytest
from sshd import sshd_server  # noqa: F401 (a fixture)
from support import (
    RUN_LABEL,
    containers_of,
    events_of,
    install_id_of,
    show,
    table_rows,
    write_profile,
)

pytestmark = [pytest.mark.docker, pytest.mark.sshd]

POD_PROFILE = """\
backend: docker
services:
  greeter:
    image: sandboxer/base:busybox
    command: ["sh", "-c", "while :; do echo \\"hello from $WHO\\" | nc -l -p 8080; done"]
    environment: {WHO: the-service}
"""


@pytest.fixture(params=["local", "ssh"])
def engine(request) -> dict[str, str]:
    """How sbx reaches the engine: its local socket, or ssh:// through a real sshd."""
    if request.param == "local":
        return {}
    server = request.getfixturevalue("sshd_server")
    return {"DOCKER_HOST": server.url(server.port), "HOME": str(server.client_home)}


def _profiles(sbx, tmp_path):
    folder = tmp_path / "profiles"
    folder.mkdir(exist_ok=True)
    write_profile(folder, "pod", POD_PROFILE)
    return {"SBX_PROFILE_PATH": str(folder)}


def test_docker_over_ssh_creates_execs_and_destroys(sbx, docker_api, sshd_server):  # noqa: F811
    # paramiko (docker-py's ssh transport) reads ~/.ssh/config and known_hosts from $HOME
    env = {"DOCKER_HOST": sshd_server.url(sshd_server.port), "HOME": str(sshd_server.client_home)}
    box = sbx.create("--ttl", "10m", env=env)
    assert box["state"] == "running"
    ran = sbx("exec", box["id"], "--", "sh", "-c", "echo over-ssh; exit 7", env=env)
    assert (ran.code, ran.out) == (7, "over-ssh\n"), ran.err
    # the same engine answers locally: the container is there, hardened, labelled
    info = docker_api.inspect_container(box["backend_ref"])
    assert info["Config"]["Labels"]["sbx.id"] == box["id"]
    assert info["HostConfig"]["NetworkMode"] == "none"
    doctor = sbx("doctor", "--json", env=env).json()
    docker_row = next(b for b in doctor["backends"] if b["name"] == "docker")
    assert docker_row["reachable"] and "ssh://" in docker_row["detail"]
    gone = sbx("destroy", "--yes", box["id"], env=env)
    assert gone.code == 0, gone.err
    assert containers_of(docker_api, install_id_of(sbx.home)) == []


def test_a_service_is_reached_on_localhost_and_the_pod_has_no_network(
        sbx, docker_api, tmp_path, engine):
    env = {**_profiles(sbx, tmp_path), **engine}
    box = sbx.create("--profile", "pod", "--ttl", "10m", env=env)
    install = install_id_of(sbx.home)
    containers = containers_of(docker_api, install)
    assert len(containers) == 2
    service = next(c for c in containers if c["Id"] != box["backend_ref"])
    assert service["Labels"]["sbx.service"] == "greeter"
    assert service["Labels"]["sbx.id"] == box["id"]
    assert (docker_api.inspect_container(service["Id"])["HostConfig"]["NetworkMode"]
            == f"container:{box['backend_ref']}")
    # the main container reaches the service on localhost...
    for _ in range(50):
        got = sbx("exec", box["id"], "--", "sh", "-c", "nc 127.0.0.1 8080 </dev/null", env=env)
        if got.out:
            break
        time.sleep(0.1)
    assert got.out == "hello from the-service\n", (got.code, got.out, got.err)
    # ...while the pod as a whole has no network but loopback
    ifaces = sbx("exec", box["id"], "--", "sh", "-c",
                 "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '", env=env)
    assert ifaces.out.split() == ["lo"]
    # `sbx ls` shows one sandbox, not two
    assert [s["id"] for s in sbx("ls", "--json", env=env).json()] == [box["id"]]
    # pause freezes the whole pod, resume thaws it
    assert sbx("pause", box["id"], env=env).code == 0
    assert docker_api.inspect_container(service["Id"])["State"]["Paused"] is True
    assert sbx("resume", box["id"], env=env).code == 0
    assert docker_api.inspect_container(service["Id"])["State"]["Paused"] is False
    # destroy removes both containers
    assert sbx("destroy", "--yes", box["id"], env=env).code == 0
    assert containers_of(docker_api, install) == []


def test_kill_9_mid_create_of_a_pod_leaves_nothing_after_reap(sbx, docker_api, tmp_path, engine):
    env = {**_profiles(sbx, tmp_path), **engine}
    sbx("ls")  # the database exists before the crash
    crashed = sbx("create", "--profile", "pod", "--ttl", "10m",
                  env={**env, "SBX_FAILPOINT": "create.after-backend", "SBX_LEASE_TTL": "1s"})
    assert crashed.code == -signal.SIGKILL
    install = install_id_of(sbx.home)
    assert len(containers_of(docker_api, install)) == 2  # main and service, row says creating
    time.sleep(1.2)
    reaped = sbx("reap", "--json", env={**env, "SBX_CLOCK_OFFSET": "11m",
                                        "SBX_RECONCILE_GRACE": "1s"})
    assert reaped.code == 0, reaped.err
    assert containers_of(docker_api, install) == []


def test_a_service_left_without_its_sandbox_is_not_leaked(sbx, docker_api, tmp_path):
    env = _profiles(sbx, tmp_path)
    box = sbx.create("--profile", "pod", "--ttl", "10m", env=env)
    docker_api.remove_container(box["backend_ref"], force=True)  # out of band: main only
    install = install_id_of(sbx.home)
    assert len(containers_of(docker_api, install)) == 1
    time.sleep(1.2)  # past the reconcile grace for young objects (1s below)
    assert sbx("reconcile", env={"SBX_RECONCILE_GRACE": "1s"}).code == 0
    assert show(sbx, box["id"])["state"] == "lost"
    assert sbx("reap", env={"SBX_CLOCK_OFFSET": "11m"}).code == 0
    assert containers_of(docker_api, install) == []


def test_a_service_without_an_image_is_refused_and_nothing_is_written(sbx, docker_api, tmp_path):
    folder = tmp_path / "profiles"
    folder.mkdir()
    write_profile(folder, "broken", "backend: docker\nservices:\n  db:\n    command: [sleep, '1']\n")
    result = sbx("create", "--profile", "broken", env={"SBX_PROFILE_PATH": str(folder)})
    assert result.code == 2
    assert len(result.err.strip().splitlines()) == 1
    assert "services.db.image" in result.err and "broken.yaml" in result.err
    assert table_rows(sbx.home, "sandboxes") == []
    install = install_id_of(sbx.home)
    assert install is None or containers_of(docker_api, install) == []


def test_services_on_a_backend_without_them_are_refused(sbx, tmp_path):
    folder = tmp_path / "profiles"
    folder.mkdir()
    write_profile(folder, "stubpod", "backend: stub\nservices:\n  db: {image: x}\n")
    result = sbx("create", "--profile", "stubpod", env={"SBX_PROFILE_PATH": str(folder)})
    assert result.code == 4 and "cannot run services" in result.err
    assert table_rows(sbx.home, "sandboxes") == []


def test_profile_setup_runs_in_the_new_sandbox_and_a_failing_one_destroys_it(
        sbx, docker_api, tmp_path):
    folder = tmp_path / "profiles"
    folder.mkdir()
    write_profile(folder, "prepared", "backend: docker\n"
                  "setup: ['echo ready > /tmp/marker', 'mkdir -p /tmp/work']\n")
    write_profile(folder, "doomed", "backend: docker\n"
                  "setup: ['echo first', 'echo broken >&2; exit 3', 'echo never']\n")
    env = {"SBX_PROFILE_PATH": str(folder)}
    box = sbx.create("--profile", "prepared", env=env)
    marker = sbx("exec", box["id"], "--", "cat", "/tmp/marker")
    assert (marker.code, marker.out) == (0, "ready\n")
    execs = [e for e in events_of(sbx, box["id"]) if e["type"] == "sandbox.exec"]
    assert [e["payload"]["argv"][-1] for e in execs][:2] == [
        "echo ready > /tmp/marker", "mkdir -p /tmp/work"]
    failed = sbx("create", "--profile", "doomed", "--label", RUN_LABEL, env=env)
    assert failed.code == 1
    assert "setup command 'echo broken >&2; exit 3' exited 3 (broken)" in failed.err
    doomed = [s for s in sbx("ls", "--all", "--json").json() if s["profile"] == "doomed"]
    assert [s["state"] for s in doomed] == ["destroyed"]
    record = sbx("show", doomed[0]["id"], "--json").json()  # it says why it ended
    assert "setup command 'echo broken >&2; exit 3' exited 3 (broken)" in record["error"]
    assert [c["Id"] for c in containers_of(docker_api, install_id_of(sbx.home))] == [
        box["backend_ref"]]


def test_a_setup_whose_output_holds_a_nul_still_ends_its_sandbox_and_says_why(
        sbx, docker_api, tmp_path):
    """What sbx keeps of a command's words is storable whatever they hold: a NUL in a failed
    setup's output (refused in text by PostgreSQL, so by both stores) neither strands the
    sandbox mid-destroy nor turns the failure into bad input."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    write_profile(folder, "nul", "backend: docker\n"
                  "setup: [\"printf 'bad\\\\000byte' >&2; exit 3\"]\n")
    failed = sbx("create", "--profile", "nul", "--label", RUN_LABEL,
                 env={"SBX_PROFILE_PATH": str(folder)})
    assert failed.code == 1, failed.err
    assert "exited 3" in failed.err and "bad input" not in failed.err
    (record,) = sbx("ls", "--all", "--json").json()
    assert record["state"] == "destroyed"
    assert "exited 3 (bad\ufffdbyte)" in sbx("show", record["id"], "--json").json()["error"]
    assert containers_of(docker_api, install_id_of(sbx.home)) == []
