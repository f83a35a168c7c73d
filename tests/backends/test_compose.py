"""The compose backend through the real `sbx` CLI: the real Docker Compose on the real engine,
locally and through a real OpenSSH server on 127.0.0.1 (`DOCKER_HOST=ssh://...`, as
tests/backends/test_docker_pods.py does). The project's traffic stays on its own internal network;
nothing is sent from the host to a container. (The conformance kit runs on the same adapter
in tests/backends/test_conformance.py.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import yaml
from sshd import sshd_server  # noqa: F401 (a fixture)
from support import RUN_LABEL, SbxRunner, install_id_of, show, table_rows

pytestmark = pytest.mark.docker

KEEPALIVE = "trap 'exit 0' TERM; while :; do sleep 3600 & wait $$!; done"
TWO_SERVICES = {
    "services": {
        "app": {"image": "sandboxer/base:busybox",
                "command": ["sh", "-c", f"echo app started; {KEEPALIVE}"],
                "volumes": ["data:/data"]},
        "web": {"image": "sandboxer/base:busybox", "init": True,
                "command": ["sh", "-c", "mkdir -p /www && echo hello from web > /www/index.html"
                            " && exec httpd -f -p 8080 -h /www"]},
    },
    "volumes": {"data": {}},
}


def stack(folder: Path, project: dict | None = None, *, name: str = "stack",
          compose: dict | None = None, extra: str = "") -> dict[str, str]:
    """A profile `name` whose compose file lives beside it, in `stack/compose.yaml` (named
    relative to the profile file); the environment that finds the profile."""
    folder.mkdir(exist_ok=True)
    (folder / "stack").mkdir(exist_ok=True)
    (folder / "stack" / f"{name}.compose.yaml").write_text(
        yaml.safe_dump(project or TWO_SERVICES, sort_keys=False))
    spec = {"file": f"stack/{name}.compose.yaml", "service": "app", **(compose or {})}
    (folder / f"{name}.yaml").write_text(
        "backend: compose\n" + yaml.safe_dump({"compose": spec}) + extra)
    return {"SBX_PROFILE_PATH": str(folder)}


def objects(docker_api, home: Path) -> dict[str, list]:
    """Every container, network and volume of the installation (by its label), by name."""
    install = install_id_of(home)
    if install is None:
        return {"containers": [], "networks": [], "volumes": []}
    by_install = {"label": [f"sbx.install={install}"]}
    return {
        "containers": sorted(c["Names"][0] for c in docker_api.containers(all=True,
                                                                          filters=by_install)),
        "networks": sorted(n["Name"] for n in docker_api.networks(filters=by_install)),
        "volumes": sorted(v["Name"] for v in docker_api.volumes(filters=by_install)
                          .get("Volumes") or []),
    }


def nothing_left(docker_api, home: Path) -> bool:
    return objects(docker_api, home) == {"containers": [], "networks": [], "volumes": []}


def home_files(home: Path) -> list[str]:
    """The files in SBX_HOME (SQLite's -wal and -shm, which any reader may make, left out)."""
    if not home.exists():
        return []
    return sorted(str(p.relative_to(home)) for p in home.rglob("*")
                  if not p.name.endswith(("-wal", "-shm")))


@pytest.fixture(autouse=True)
def _remove_volumes_and_images(sbx, docker_api):
    """What the `sbx` fixture's teardown leaves: this installation's volumes and checkpoint
    images (containers and networks it removes itself)."""
    yield
    install = install_id_of(sbx.home)
    if install is None:
        return
    by_install = {"label": [f"sbx.install={install}"]}
    for info in docker_api.containers(all=True, filters=by_install):
        docker_api.remove_container(info["Id"], force=True, v=True)
    for info in docker_api.networks(filters=by_install):
        docker_api.remove_network(info["Id"])
    for info in docker_api.volumes(filters=by_install).get("Volumes") or []:
        docker_api.remove_volume(info["Name"], force=True)
    for info in docker_api.images(filters=by_install):
        docker_api.remove_image(info["Id"], force=True)


@pytest.fixture(params=["local", "ssh"])
def engine(request) -> dict[str, str]:
    """How sbx reaches the engine: its local socket, or ssh:// through a real sshd. Compose
    runs the system ssh client (the sshd's `client_bin` wrapper, first on PATH); docker-py
    runs paramiko, which reads `$HOME/.ssh`."""
    if request.param == "local":
        return {}
    server = request.getfixturevalue("sshd_server")
    return {"DOCKER_HOST": server.url(server.port), "HOME": str(server.client_home),
            "PATH": f"{server.client_bin}:{os.environ['PATH']}"}


def in_container(docker_api, container: str, *argv: str) -> bytes:
    run = docker_api.exec_create(container, list(argv))
    return docker_api.exec_start(run["Id"])


# -- the lifecycle --------------------------------------------------------------------------


def test_two_services_reach_each_other_by_name_and_destroy_removes_the_project(
        sbx, docker_api, tmp_path, engine):
    env = {**stack(tmp_path / "profiles"), **engine}
    box = sbx.create("--profile", "stack", "--ttl", "10m", "--label", "team=infra",
                     "--label", "price=$5 a ${month}", env=env)
    assert (box["backend"], box["state"]) == ("compose", "running")
    assert box["backend_ref"] == f"{box['id']}/app"
    found = objects(docker_api, sbx.home)
    # one project named after the sandbox: two containers, its network and its volume, each
    # carrying sbx's labels
    assert len(found["containers"]) == 2
    assert all(name.startswith(f"/{box['id']}") for name in found["containers"])
    assert found["networks"] == [f"{box['id']}_default"]
    assert found["volumes"] == [f"{box['id']}_data"]
    install = install_id_of(sbx.home)
    for kind, listing, key in (("container", docker_api.containers(all=True), "Labels"),
                               ("network", docker_api.networks(), "Labels"),
                               ("volume", docker_api.volumes()["Volumes"], "Labels")):
        mine = [o for o in listing if (o.get(key) or {}).get("sbx.id") == box["id"]]
        assert mine, kind
        for obj in mine:
            labels = obj[key]
            assert labels["sbx.install"] == install and labels["team"] == "infra", (kind, labels)
            assert labels["price"] == "$5 a ${month}", (kind, labels)  # as given, not expanded
            assert labels["sbx-test-run"] == RUN_LABEL.split("=")[1], (kind, labels)
            assert labels["sbx.compose"] == box["backend_ref"], (kind, labels)
    # network: none (the default) keeps the project's network internal: the engine lets
    # nothing out of it
    assert docker_api.inspect_network(found["networks"][0])["Internal"] is True
    # exec runs in the named service, which reaches the other by its service name
    got = ""
    for _ in range(50):
        got = sbx("exec", box["id"], "--", "wget", "-qO-", "http://web:8080/", env=env).out
        if got:
            break
        time.sleep(0.2)
    assert got == "hello from web\n"
    assert sbx("exec", box["id"], "--", "sh", "-c", "exit 7", env=env).code == 7
    # logs are the named service's
    logs = sbx("logs", box["id"], env=env)
    assert (logs.code, logs.out) == (0, "app started\n"), logs
    # pause and resume act on the whole project
    containers = docker_api.containers(filters={"label": [f"sbx.id={box['id']}"]})
    assert sbx("pause", box["id"], env=env).code == 0
    assert show(sbx, box["id"])["state"] == "paused"
    assert all(docker_api.inspect_container(c["Id"])["State"]["Paused"] for c in containers)
    assert sbx("resume", box["id"], env=env).code == 0
    assert not any(docker_api.inspect_container(c["Id"])["State"]["Paused"] for c in containers)
    # metrics add up the project's containers
    metrics = sbx("metrics", box["id"], "--json", env=env)
    assert metrics.code == 0, metrics.err
    each = [docker_api.stats(c["Id"], stream=False)["pids_stats"]["current"] for c in containers]
    assert metrics.json()["pids"] == sum(each) and min(each) > 0
    # destroy is `compose down`: nothing of the project stays
    gone = sbx("destroy", "--yes", box["id"], env=env)
    assert gone.code == 0, gone.err
    assert nothing_left(docker_api, sbx.home), objects(docker_api, sbx.home)
    assert not (sbx.home / "compose" / box["id"]).exists()


def test_env_secrets_and_command_reach_the_named_service_and_no_file(sbx, docker_api, tmp_path):
    command = ["sh", "-c", "echo from the profile; trap 'exit 0' TERM; "
               "while :; do sleep 3600 & wait $!; done"]  # `$!` reaches sh as written
    env = stack(tmp_path / "profiles", extra="env: {GREETING: hi}\n"
                "secrets: {TOKEN: env:COMPOSE_TEST_TOKEN}\n" + yaml.safe_dump({"command": command}))
    secret = "s3cret-" + os.urandom(6).hex()
    box = sbx.create("--profile", "stack", env={**env, "COMPOSE_TEST_TOKEN": secret})
    said = sbx("exec", box["id"], "--", "sh", "-c", 'echo "$GREETING $TOKEN"')
    assert said.out == f"hi {secret}\n"
    assert sbx("logs", box["id"]).out == "from the profile\n"
    [app] = docker_api.containers(filters={"label": [f"sbx.id={box['id']}", "sbx.service=app"]})
    assert docker_api.inspect_container(app["Id"])["Config"]["Cmd"] == command
    for path in sbx.home.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"the secret is in {path}"


def test_kill_9_right_after_up_leaves_nothing_after_reap(sbx, docker_api, tmp_path):
    env = stack(tmp_path / "profiles")
    sbx("ls")  # the database exists before the crash
    crashed = sbx("create", "--profile", "stack", "--ttl", "10m", "--label", RUN_LABEL,
                  env={**env, "SBX_FAILPOINT": "compose.after-up", "SBX_LEASE_TTL": "1s"})
    assert crashed.code == -signal.SIGKILL, crashed.err
    found = objects(docker_api, sbx.home)
    assert (len(found["containers"]), len(found["networks"]), len(found["volumes"])) == (2, 1, 1)
    [row] = sbx("ls", "--all", "--json").json()
    assert (row["state"], row["backend_ref"]) == ("creating", None)
    time.sleep(1.2)  # past the lease and the reconcile grace below
    reaped = sbx("reap", "--json", env={**env, "SBX_CLOCK_OFFSET": "11m",
                                        "SBX_RECONCILE_GRACE": "1s"})
    assert reaped.code == 0, reaped.err
    assert nothing_left(docker_api, sbx.home), objects(docker_api, sbx.home)
    assert show(sbx, row["id"])["state"] == "destroyed"


def test_a_named_service_that_does_not_keep_running_fails_the_create(sbx, docker_api, tmp_path):
    project = {"services": {"app": {"image": "sandboxer/base:busybox", "command": ["true"]},
                            "web": TWO_SERVICES["services"]["web"]}}
    failed = sbx("create", "--profile", "stack", "--label", RUN_LABEL,
                 env=stack(tmp_path / "profiles", project))
    assert failed.code == 1, failed.err
    assert "service 'app'" in failed.err and "must keep running" in failed.err
    assert len(failed.err.strip().splitlines()) == 1, failed.err
    assert [s["state"] for s in sbx("ls", "--all", "--json").json()] == ["failed"]
    assert nothing_left(docker_api, sbx.home), objects(docker_api, sbx.home)


def test_reap_orphans_finds_a_project_by_its_labels_alone(sbx, docker_api, tmp_path):
    """Without the database and without the state folder (another SBX_HOME holding only the
    installation's id): the project's labels are all there is, and enough."""
    box = sbx.create("--profile", "stack", "--ttl", "10m", env=stack(tmp_path / "profiles"))
    assert len(objects(docker_api, sbx.home)["containers"]) == 2
    bare = tmp_path / "bare-home"
    bare.mkdir(mode=0o700)
    shutil.copy(sbx.home / "install-id", bare / "install-id")
    other = SbxRunner(bare, tmp_path)
    early = other("reap", "--orphans", "--json")  # before the hard deadline: kept
    assert early.code == 0 and early.json()["orphans"] == [], early.out
    assert len(objects(docker_api, sbx.home)["containers"]) == 2
    reaped = other("reap", "--orphans", "--json", env={"SBX_CLOCK_OFFSET": "5h"})
    assert reaped.code == 0, reaped.err
    assert reaped.json()["orphans"] == [box["id"]]
    assert nothing_left(docker_api, sbx.home), objects(docker_api, sbx.home)


def test_reconcile_leaves_a_compose_project_and_its_checkpoint_to_the_compose_backend(
        sbx, docker_api, tmp_path):
    """The docker backend lists the same engine by the same installation label: it must not
    take a project's containers for sandboxes of its own (to adopt), nor its images for
    checkpoints of its own (orphans to remove)."""
    box = sbx.create("--profile", "stack", env=stack(tmp_path / "profiles"))
    ckpt = sbx("snapshot", box["id"], "--json")
    assert ckpt.code == 0, ckpt.err
    time.sleep(1.2)
    plan = sbx("reconcile", "--dry-run", "--json", env={"SBX_RECONCILE_GRACE": "1s"})
    assert plan.code == 0, plan.err
    assert plan.json().get("planned", []) == []  # nothing to do, on any backend
    done = sbx("reconcile", "--json", env={"SBX_RECONCILE_GRACE": "1s"})
    assert done.code == 0, done.err
    assert done.json()["reconciled"] == [] and done.json()["failed"] == []
    assert [(s["id"], s["state"]) for s in sbx("ls", "--json").json()] == [(box["id"], "running")]
    assert len(docker_api.images(name="sandboxer/compose-checkpoint",
                                 filters={"label": [f"sbx.checkpoint={ckpt.json()['id']}"]})) == 2
    assert sbx("checkpoints", "--json").json()[0]["state"] == "ready"


def test_a_snapshot_saves_every_service_and_restores_them_together(sbx, docker_api, tmp_path):
    box = sbx.create("--profile", "stack", env=stack(tmp_path / "profiles"))
    assert sbx("exec", box["id"], "--", "sh", "-c", "echo app-state > /root/marker").code == 0
    [web] = docker_api.containers(filters={"label": [f"sbx.id={box['id']}",
                                                     "sbx.service=web"]})
    in_container(docker_api, web["Id"], "sh", "-c", "echo web-state > /www/extra.html")
    made = sbx("snapshot", box["id"], "--json")
    assert made.code == 0, made.err
    ckpt = made.json()["id"]
    tags = sorted(t for i in docker_api.images(name="sandboxer/compose-checkpoint")
                  for t in i["RepoTags"] if ckpt in t)
    assert tags == [f"sandboxer/compose-checkpoint:{ckpt}.app",
                    f"sandboxer/compose-checkpoint:{ckpt}.web"]
    restored = sbx("restore", ckpt, "--json")
    assert restored.code == 0, restored.err
    again = restored.json()["id"]
    assert again != box["id"]
    marker = sbx("exec", again, "--", "cat", "/root/marker")
    assert marker.out == "app-state\n"
    served = ""
    for _ in range(50):
        served = sbx("exec", again, "--", "wget", "-qO-", "http://web:8080/extra.html").out
        if served:
            break
        time.sleep(0.2)
    assert served == "web-state\n"  # the web service came back from its own image
    assert sbx("destroy", "--yes", box["id"], again).code == 0
    assert nothing_left(docker_api, sbx.home), objects(docker_api, sbx.home)
    assert sbx("checkpoint", "rm", ckpt).code == 0
    assert [t for i in docker_api.images(name="sandboxer/compose-checkpoint")
            for t in i["RepoTags"] if ckpt in t] == []


# -- bad input: exit 2, one line, nothing written ------------------------------------------


def _refused(sbx, docker_api, env: dict[str, str], profile: str = "stack"):
    before = home_files(sbx.home)
    result = sbx("create", "--profile", profile, "--label", RUN_LABEL, env=env)
    assert result.code == 2, (result.code, result.err)
    assert len(result.err.strip().splitlines()) == 1, result.err
    assert table_rows(sbx.home, "sandboxes") == [] and table_rows(sbx.home, "events") == []
    assert home_files(sbx.home) == before
    assert nothing_left(docker_api, sbx.home)
    return result.err


def test_a_bad_compose_file_is_exit_2_with_composes_own_message(sbx, docker_api, tmp_path):
    sbx("ls")
    bogus = {"services": {"app": {"image": "sandboxer/base:busybox", "bogus": 1}}}
    err = _refused(sbx, docker_api, stack(tmp_path / "p1", bogus))
    assert "stack.compose.yaml" in err
    assert "Unsupported config option for services.app: 'bogus'" in err
    folder = tmp_path / "p2"
    stack(folder)
    (folder / "stack" / "stack.compose.yaml").write_text("services:\n  app: [\n")
    err = _refused(sbx, docker_api, {"SBX_PROFILE_PATH": str(folder)})
    assert "stack.compose.yaml" in err and "while parsing" in err
    no_such = {"services": {"web": TWO_SERVICES["services"]["web"]}}
    err = _refused(sbx, docker_api, stack(tmp_path / "p3", no_such))
    assert "compose.service 'app' is not one of its services (web)" in err
    folder = tmp_path / "p4"
    stack(folder)
    (folder / "stack" / "stack.compose.yaml").unlink()
    err = _refused(sbx, docker_api, {"SBX_PROFILE_PATH": str(folder)})
    assert f"compose.file: {folder / 'stack' / 'stack.compose.yaml'} does not exist" in err


WEB = {"image": "sandboxer/base:busybox", "command": ["httpd", "-f", "-p", "8080"]}
ASKS = [
    ("binds", "volumes", {"volumes": ["/etc:/host-etc:ro"]}, "a bind mount of the host's /etc"),
    ("privileged", "privileged", {"privileged": True}, "privileged: true"),
    ("host-network", "network_mode", {"network_mode": "host"}, "network_mode: host"),
    ("host-namespaces", "pid", {"pid": "host"}, "pid: host"),
    ("cap-add", "cap_add", {"cap_add": ["SYS_ADMIN"]}, "cap_add: ['SYS_ADMIN']"),
    ("devices", "devices", {"devices": ["/dev/kmsg:/dev/kmsg"]}, "devices: "),
    ("ports", "ports", {"ports": ["8080:8080"]}, "ports published on the host"),
]


@pytest.mark.parametrize(("allowance", "field", "asks", "said"), ASKS,
                         ids=[a[0] for a in ASKS])
def test_what_reaches_the_host_is_refused_naming_the_service_and_field(
        sbx, docker_api, tmp_path, allowance, field, asks, said):
    sbx("ls")
    project = {"services": {"app": TWO_SERVICES["services"]["app"], "web": {**WEB, **asks}},
               "volumes": {"data": {}}}
    err = _refused(sbx, docker_api, stack(tmp_path / "profiles", project))
    assert f"service 'web': {field}: {said}" in err, err
    assert f"compose: {{allow: [{allowance}]}}" in err, err


# keys the allow-list does not have (or values it does not take), each refused by its path
UNLISTED = [
    ("build-network-host", {"build": {"context": ".", "network": "host"},
                            "image": "sbx-test-build:refused"},
     "services.web.build.network: host (accepted: default, none) is refused"),
    ("gpu-reservation", {"deploy": {"resources": {"reservations": {
        "devices": [{"capabilities": ["gpu"], "count": 1}]}}}},
     "services.web.deploy.resources.reservations.devices: this key is refused"),
    ("runtime", {"runtime": "runc"}, "services.web.runtime: this key is refused"),
    ("cgroup-parent", {"cgroup_parent": "/sbx-test"},
     "services.web.cgroup_parent: this key is refused"),
    ("unknown-key", {"oom_kill_disable": True},
     "services.web.oom_kill_disable: this key is refused"),
    ("logging-driver", {"logging": {"driver": "syslog",
                                    "options": {"syslog-address": "udp://127.0.0.1:9"}}},
     "services.web.logging.driver: syslog (accepted: json-file, local, none) is refused"),
]


@pytest.mark.parametrize(("asks", "said"), [u[1:] for u in UNLISTED], ids=[u[0] for u in UNLISTED])
def test_a_key_the_allow_list_does_not_have_is_refused_by_its_path(
        sbx, docker_api, tmp_path, asks, said):
    """`compose.allow: [everything it offers]` does not unlock these: nothing does."""
    sbx("ls")
    project = {"services": {"app": TWO_SERVICES["services"]["app"], "web": {**WEB, **asks}},
               "volumes": {"data": {}}}
    allow = {"allow": ["binds", "privileged", "host-network", "host-namespaces", "cap-add",
                       "devices", "security-opt", "ports", "external"]}
    folder = tmp_path / "profiles"
    env = stack(folder, project, compose=allow)
    (folder / "stack" / "Dockerfile").write_text("FROM sandboxer/base:busybox\n")
    err = _refused(sbx, docker_api, env)
    assert said in err, err
    assert "docs/adapters.md" in err, err


def test_a_top_level_key_the_allow_list_does_not_have_is_refused(sbx, docker_api, tmp_path):
    sbx("ls")
    project = {**TWO_SERVICES, "networks": {"default": {"ipam": {
        "config": [{"subnet": "10.213.0.0/24"}]}}}}
    err = _refused(sbx, docker_api, stack(tmp_path / "profiles", project))
    assert "networks.default.ipam: this key is refused" in err, err


def test_a_key_that_needs_an_allowance_names_it(sbx, docker_api, tmp_path):
    sbx("ls")
    project = {"services": {"app": {**TWO_SERVICES["services"]["app"],
                                    "external_links": ["elsewhere"]}},
               "volumes": {"data": {}}}
    err = _refused(sbx, docker_api, stack(tmp_path / "profiles", project))
    assert "services.app.external_links: links to containers outside the project" in err, err
    assert "compose: {allow: [external]}" in err, err


def test_a_build_from_context_dockerfile_and_args_still_works(sbx, docker_api, tmp_path):
    """A build of the file's own context (the keys the allow-list keeps for builds), with an
    extension key Compose ignores."""
    image = f"sbx-test-build:{os.urandom(4).hex()}"
    project = {"services": {"app": {
        "build": {"context": "ctx", "dockerfile": "Dockerfile", "args": {"GREETING": "built"}},
        "image": image, "command": ["sh", "-c", KEEPALIVE], "x-note": "ignored by Compose"}}}
    folder = tmp_path / "profiles"
    env = stack(folder, project)
    (folder / "stack" / "ctx").mkdir()
    (folder / "stack" / "ctx" / "Dockerfile").write_text(
        "FROM sandboxer/base:busybox\nARG GREETING\nRUN echo \"$GREETING\" > /greeting\n")
    try:
        box = sbx.create("--profile", "stack", env=env)
        assert sbx("exec", box["id"], "--", "cat", "/greeting").out == "built\n"
        assert sbx("destroy", "--yes", box["id"]).code == 0
        assert nothing_left(docker_api, sbx.home), objects(docker_api, sbx.home)
    finally:
        if docker_api.images(name=image):
            docker_api.remove_image(image, force=True)


def test_a_bind_is_accepted_once_the_profile_allows_it(sbx, docker_api, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "note").write_text("from the host\n")
    project = {"services": {"app": {**TWO_SERVICES["services"]["app"],
                                    "volumes": [f"{shared}:/shared:ro"]}}}
    env = stack(tmp_path / "profiles", project, compose={"allow": ["binds"]})
    box = sbx.create("--profile", "stack", env=env)
    assert sbx("exec", box["id"], "--", "cat", "/shared/note").out == "from the host\n"


@pytest.mark.parametrize(("body", "said"), [
    ("backend: docker\ncompose: {file: c.yaml, service: app}\n",
     "compose: applies only to backend: compose"),
    ("backend: compose\n", "backend: compose needs compose: {file: PATH, service: NAME}"),
    ("backend: compose\ncompose: {file: c.yaml, project: {services: {}}, service: app}\n",
     "give the compose file as file: PATH or inline as project:"),
    ("backend: compose\ncompose: {file: c.yaml}\n", "compose.service: required, not given"),
    ("backend: compose\ncompose: {file: c.yaml, service: app, allow: [everything]}\n",
     "compose.allow[0]: should be 'binds', 'privileged'"),
])
def test_the_profile_schema_checks_compose(sbx, tmp_path, body, said):
    (tmp_path / "bad.yaml").write_text(body)
    result = sbx("profiles", "validate", "bad.yaml")
    assert result.code == 2 and said in result.err, result.err


def test_a_compose_file_is_relative_to_its_profile(sbx, tmp_path):
    env = stack(tmp_path / "profiles")
    shown = sbx("profiles", "show", "stack", "--json", env=env)
    assert shown.code == 0, shown.err
    text = shown.out
    assert str(tmp_path / "profiles" / "stack" / "stack.compose.yaml") in text
    assert json.loads(text)


# -- work inside: the named service is the sandbox -------------------------------------------


def test_files_exec_options_and_a_background_process_reach_the_named_service(
        sbx, docker_api, tmp_path):
    """What an agent does in a compose sandbox goes to the named service's container: a tree
    copied in, a command run there with env, a folder and stdin, the artefact copied out, a
    background process followed to its end; `-u` is refused naming the backend."""
    env = stack(tmp_path / "profiles")
    box = sbx.create("--profile", "stack", env=env)
    [app] = docker_api.containers(filters={"label": [f"sbx.id={box['id']}", "sbx.service=app"]})
    src = tmp_path / "proj"
    src.mkdir()
    (src / "in.txt").write_text("hello compose\n")
    assert sbx("cp", str(src), f"{box['id']}:/srv/proj", env=env).code == 0
    assert in_container(docker_api, app["Id"], "cat", "/srv/proj/in.txt") == b"hello compose\n"
    ran = sbx("exec", "-i", "-w", "/srv/proj", "-e", "SUFFIX=!", box["id"], "--", "sh", "-c",
              'tr a-z A-Z < in.txt > out.txt; cat; echo "$SUFFIX"', input="piped\n", env=env)
    assert (ran.code, ran.out) == (0, "piped\n!\n"), ran.err
    out = tmp_path / "out.txt"
    assert sbx("cp", f"{box['id']}:/srv/proj/out.txt", str(out), env=env).code == 0
    assert out.read_text() == "HELLO COMPOSE\n"
    pid = sbx("exec", "--detach", box["id"], "--", "sh", "-c", "echo one; echo two",
              env=env).out.strip()
    attached = sbx("attach", box["id"], pid, env=env)
    assert (attached.code, attached.out) == (0, "one\ntwo\n"), attached.err
    refused = sbx("exec", "-u", "nobody", box["id"], "--", "true", env=env)
    assert refused.code == 4 and "compose" in refused.err, refused.err


def test_a_terminal_opens_in_the_named_service(sbx, docker_api, tmp_path):
    """`sbx shell` on a compose sandbox runs in the named service's container (an exec with
    a TTY through the docker backend), not in the other service's, and exits with the
    program's code."""
    env = stack(tmp_path / "profiles")
    box = sbx.create("--profile", "stack", env=env)
    [app] = docker_api.containers(filters={"label": [f"sbx.id={box['id']}", "sbx.service=app"]})
    in_container(docker_api, app["Id"], "sh", "-c", "echo in-app > /tmp/where")
    shell = sbx("shell", box["id"], "--", "sh", input='cat /tmp/where; [ -t 0 ] && '
                'echo "on-a-"tty; exit 5\n', env=env)
    assert shell.code == 5, shell.err
    assert "in-app" in shell.out and "on-a-tty" in shell.out, shell.out
