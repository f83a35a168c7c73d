"""`isolation: gvisor` (docs/security.md, "Isolation levels"): the sandbox runs under gVisor's
runsc on the real engine (make test-setup registers it, scripts/ensure-gvisor.sh), and it
shows: a kernel of its own, the engine's Runtime, the record, the events, the evidence. An
engine without runsc refuses (no fallback to runc) and a backend without gVisor refuses at
validation; neither leaves anything behind."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support import (
    RUN_LABEL,
    SbxRunner,
    containers_of,
    events_of,
    install_id_of,
    one_json,
    remove_test_containers,
    show,
    table_rows,
    write_profile,
)

pytestmark = pytest.mark.docker

HOST_KERNEL = Path("/proc/version").read_text().strip()


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> SbxRunner:
    folder = tmp_path_factory.mktemp("gvisor")
    runner = SbxRunner(folder / "sbx-home", folder)
    yield runner
    remove_test_containers(runner.home)


@pytest.fixture(scope="module")
def boxes(runner: SbxRunner) -> dict[str, dict]:
    """One sandbox under gVisor and one plain container beside it, shared by the module."""
    made = {}
    for isolation in ("gvisor", "container"):
        profile = write_profile(runner.cwd, isolation, f"backend: docker\nisolation: {isolation}\n")
        made[isolation] = runner.create("--profile-file", str(profile))
    return made


def test_a_gvisor_sandbox_runs_on_a_kernel_of_its_own(runner, boxes, docker_api):
    gvisor, plain = boxes["gvisor"], boxes["container"]
    said = runner("exec", gvisor["id"], "--", "sh", "-c", "cat /proc/version; dmesg")
    assert said.code == 0, said.err
    version, *kernel_log = said.out.splitlines()
    assert version != HOST_KERNEL, "under gVisor the sandbox must not see the host's kernel"
    assert any("gVisor" in line for line in kernel_log), said.out
    # the plain container beside it does see the host's kernel: the check can tell them apart
    same = runner("exec", plain["id"], "--", "cat", "/proc/version")
    assert same.out.strip() == HOST_KERNEL
    assert docker_api.inspect_container(gvisor["backend_ref"])["HostConfig"]["Runtime"] == "runsc"
    assert docker_api.inspect_container(plain["backend_ref"])["HostConfig"]["Runtime"] == "runc"


def test_the_record_events_and_evidence_state_the_isolation(runner, boxes):
    for isolation, box in boxes.items():
        assert box["isolation"] == isolation  # create --json
        assert show(runner, box["id"])["isolation"] == isolation
        human = runner("show", box["id"]).out
        assert f"isolation         {isolation}" in human, human
        created = [e for e in events_of(runner, box["id"]) if e["type"] == "sandbox.created"]
        assert created[0]["payload"]["isolation"] == isolation
        bundle = runner.cwd / f"evidence-{isolation}.json"
        exported = runner("evidence", box["id"], "--output", str(bundle))
        assert exported.code == 0, exported.err
        doc = json.loads(bundle.read_text())
        assert doc["summary"]["isolation"] == isolation
        assert doc["sandbox"]["isolation"] == isolation


def test_metrics_under_gvisor_say_what_they_cannot_read(runner, boxes):
    box = boxes["gvisor"]["id"]
    human = runner("metrics", box)
    assert human.code == 0, human.err
    assert "under gVisor: pids is not read" in human.err
    sample = one_json(runner("metrics", box, "--json").out)
    assert sample["pids"] is None  # the engine's count is gVisor's threads: not shown
    assert sample["memory_bytes"] and sample["memory_bytes"] > 0


def test_doctor_says_gvisor_is_available_on_this_engine(runner):
    doc = one_json(runner("doctor", "--json").out)
    backends = {b["name"]: b for b in doc["backends"]}
    for name in ("docker", "compose"):
        assert backends[name]["isolation"]["gvisor"] == {"available": True, "detail": "ok"}
    assert backends["ssh"]["isolation"]["gvisor"]["available"] is False
    assert "isolation: container ok; gvisor ok" in runner("doctor").out


def test_an_engine_without_runsc_refuses_gvisor_and_makes_nothing(sbx, tmp_path):
    """A real engine of the test's own, whose daemon.json registers no runsc: create fails
    with the way out (exit 5) before anything is written, and makes no container."""
    from tests.reliability.test_hard_faults import PrivateEngine

    engine = PrivateEngine()
    try:
        engine.start()
        there = {"DOCKER_HOST": engine.url}
        profile = write_profile(tmp_path, "gv", "backend: docker\nisolation: gvisor\n")
        result = sbx("create", "--label", RUN_LABEL, "--profile-file", str(profile), env=there)
        assert result.code == 5, result.err
        assert len(result.err.strip().splitlines()) == 1, result.err
        assert "no runsc runtime" in result.err and "make gvisor" in result.err, result.err
        assert "never falls back to runc" in result.err
        assert table_rows(sbx.home, "sandboxes") == []
        assert table_rows(sbx.home, "events") == []
        with engine.client() as api:
            assert api.containers(all=True) == []
        doctor = one_json(sbx("doctor", "--json", env=there).out)
        docker = next(b for b in doctor["backends"] if b["name"] == "docker")
        assert docker["isolation"]["gvisor"]["available"] is False
        assert "make gvisor" in docker["isolation"]["gvisor"]["detail"]
    finally:
        engine.close(install_id_of(sbx.home))


@pytest.mark.parametrize("backend", ["stub", "ssh"])
def test_a_backend_without_gvisor_refuses_it_at_validation(sbx, docker_api, tmp_path, backend):
    sbx.create()  # something there, to show it is left as it was
    before = (table_rows(sbx.home, "sandboxes"), table_rows(sbx.home, "events"),
              [c["Id"] for c in containers_of(docker_api, install_id_of(sbx.home))])
    profile = write_profile(tmp_path, "cannot", f"backend: {backend}\nisolation: gvisor\n")
    for argv in (["create", "--profile-file", str(profile)],
                 ["profiles", "validate", str(profile)]):
        result = sbx(*argv)
        assert result.code == 2, (argv, result.err)
        assert len(result.err.strip().splitlines()) == 1, result.err
        assert "isolation: gvisor" in result.err and f"the {backend} backend" in result.err
    after = (table_rows(sbx.home, "sandboxes"), table_rows(sbx.home, "events"),
             [c["Id"] for c in containers_of(docker_api, install_id_of(sbx.home))])
    assert after == before


def test_an_unknown_isolation_is_refused_naming_the_field(sbx, tmp_path):
    profile = write_profile(tmp_path, "odd", "backend: docker\nisolation: kata\n")
    result = sbx("create", "--profile-file", str(profile))
    assert result.code == 2, result.err
    assert "isolation" in result.err and "gvisor" in result.err, result.err
    assert table_rows(sbx.home, "sandboxes") == []


COMPOSE_PROJECT = """\
backend: compose
isolation: gvisor
compose:
  service: app
  project:
    services:
      app:
        image: sandboxer/base:busybox
        command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $$!; done"]
      side:
        image: sandboxer/base:busybox
        command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $$!; done"]
"""


def test_a_compose_project_runs_every_service_under_gvisor(sbx, docker_api, tmp_path):
    box = sbx.create("--profile-file", str(write_profile(tmp_path, "pod", COMPOSE_PROJECT)))
    try:
        assert box["isolation"] == "gvisor"
        members = docker_api.containers(filters={"label": [f"sbx.compose={box['backend_ref']}"]})
        assert len(members) == 2
        for member in members:
            assert docker_api.inspect_container(member["Id"])["HostConfig"]["Runtime"] == "runsc"
        said = sbx("exec", box["id"], "--", "dmesg")
        assert "gVisor" in said.out, said.out
    finally:
        assert sbx("destroy", box["id"]).code == 0


def test_files_and_background_processes_work_under_gvisor(runner, boxes, tmp_path):
    """The files API goes through the sandbox under gVisor (its /tmp is gVisor's own): what
    sbx cp puts there, a command in the sandbox reads, and the other way round."""
    box = boxes["gvisor"]["id"]
    (tmp_path / "in.txt").write_text("from the host\n")
    for where in ("/tmp/in.txt", "/in.txt"):
        assert runner("cp", str(tmp_path / "in.txt"), f"{box}:{where}").code == 0
        assert runner("exec", box, "--", "cat", where).out == "from the host\n"
    made = runner("exec", box, "--", "sh", "-c", "echo made inside > /tmp/out.txt")
    assert made.code == 0, made.err
    assert runner("cp", f"{box}:/tmp/out.txt", str(tmp_path / "out.txt")).code == 0
    assert (tmp_path / "out.txt").read_text() == "made inside\n"
    started = runner("exec", "--detach", box, "--", "sh", "-c", "echo tick; exit 7")
    assert started.code == 0, started.err
    attached = runner("attach", box, started.out.strip())
    assert (attached.code, attached.out) == (7, "tick\n"), attached.err


WEB = ("backend: docker\nisolation: gvisor\nnetwork: {mode: full}\nports: [8080]\n"
       "command: [sh, -c, \"mkdir -p /www && echo served > /www/index.html "
       "&& exec httpd -f -p 8080 -h /www\"]\n")


def test_ports_and_reap_work_under_gvisor(sbx, docker_api, tmp_path):
    import urllib.error
    import urllib.request

    box = sbx.create("--profile-file", str(write_profile(tmp_path, "web", WEB)), "--ttl", "5m")
    url = sbx("port", box["id"], "8080").out.strip()
    assert url.startswith("http://127.0.0.1:"), url
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    give_up = time.monotonic() + 30
    while True:  # until httpd in the sandbox answers
        try:
            with opener.open(url + "/index.html", timeout=5) as reply:
                assert reply.read() == b"served\n"
                break
        except (urllib.error.URLError, ConnectionError):
            assert time.monotonic() < give_up, f"nothing answered at {url} within 30 s"
            time.sleep(0.1)
    reaped = sbx("reap", env={"SBX_CLOCK_OFFSET": "10m"})  # its deadline has passed
    assert reaped.code == 0, reaped.err
    assert show(sbx, box["id"])["state"] == "destroyed", reaped.out
    assert containers_of(docker_api, install_id_of(sbx.home)) == []


def test_a_snapshot_under_gvisor_keeps_the_root_not_tmp_and_says_so(runner, boxes):
    box = boxes["gvisor"]["id"]
    wrote = runner("exec", box, "--", "sh", "-c", "echo kept > /kept; echo gone > /tmp/gone")
    assert wrote.code == 0, wrote.err
    snapped = runner("snapshot", box, "--json")
    assert snapped.code == 0, snapped.err
    assert "under gVisor: /tmp is gVisor's own memory, not in the checkpoint" in snapped.err
    checkpoint = one_json(snapped.out)["id"]
    restored = runner("restore", checkpoint, "--label", RUN_LABEL, "--json")
    assert restored.code == 0, restored.err
    again = one_json(restored.out)
    assert again["isolation"] == "gvisor"
    said = runner("exec", again["id"], "--", "sh", "-c", "cat /kept; test -e /tmp/gone || echo no")
    assert said.out == "kept\nno\n", said.err
    assert runner("destroy", again["id"]).code == 0
    removed = runner("checkpoint", "rm", checkpoint)  # its image, by the checkpoint's id
    assert removed.code == 0, removed.err
