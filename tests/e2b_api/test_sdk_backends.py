"""The unmodified `e2b` SDK (sync classes) against one `sbx serve` whose profiles use other
backends than Docker (docs/e2b-api.md, "Backends"): the ssh backend on the real sshd of
tests/sshd.py, and the compose backend on the real Docker Compose. The facade maps onto the
library's exec, files and processes, so the same flow runs on each; what a backend lacks
(ssh: pause, metrics, snapshots) is a 501 naming the feature and the backend, never a hang
or a 500, and it changes nothing."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from sshd import sshd_server  # noqa: F401 (a fixture)
from standins.e2b_server import E2BStandIn
from standins.modal_server import ModalStandin
from support import RUN_LABEL, install_id_of, modal_sdk_env, write_profile

from tests.service.live import LiveService

pytestmark = [pytest.mark.docker, pytest.mark.sshd]

LABEL_KEY, LABEL_VALUE = RUN_LABEL.split("=")
KEEPALIVE = "trap 'exit 0' TERM; while :; do sleep 3600 & wait $$!; done"
BACKENDS = ["ssh", "compose", "modal", "e2b"]
WITH_PROCESSES = ["ssh", "compose"]  # modal's and e2b's commands are execs (docs/e2b-api.md)
E2B_KEY = "e2b_sbxtest_" + secrets.token_hex(12)  # the e2b backend's key, to its stand-in
MODAL_TOKEN = ("ak-e2bapi" + secrets.token_hex(6), "as-e2bapi" + secrets.token_hex(12))


def _profiles(folder: Path, server, modal_image: str) -> None:
    """`on-ssh`: the sshd as one host; `on-compose`: a one-service project on busybox;
    `on-modal`: an image of the Modal stand-in."""
    folder.mkdir()
    hosts = folder / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": [server.inventory_entry(
        "only", server.ports[0], {"pool": "e2b-api"})]}))
    write_profile(folder, "on-ssh", "backend: ssh\nnetwork: {mode: full}\n"
                  "resources: {memory: null, pids: null}\n" + yaml.safe_dump(
                      {"options": {"inventory": str(hosts), "connect_timeout": 5}}))
    (folder / "stack").mkdir()
    (folder / "stack" / "compose.yaml").write_text(yaml.safe_dump({"services": {"app": {
        "image": "sandboxer/base:busybox", "command": ["sh", "-c", KEEPALIVE]}}}))
    write_profile(folder, "on-compose", "backend: compose\n" + yaml.safe_dump(
        {"compose": {"file": "stack/compose.yaml", "service": "app"}}))
    write_profile(folder, "on-modal", f"extends: modal\nimage: {modal_image}\n")
    write_profile(folder, "on-e2b", "extends: e2b\n")


def _remove_compose_objects(home: Path) -> None:
    """What this module's installation left on the engine (by its label, by id)."""
    import docker

    install = install_id_of(home)
    if install is None:
        return
    api = docker.APIClient(version="auto")
    try:
        mine = {"label": [f"sbx.install={install}"]}
        for info in api.containers(all=True, filters=mine):
            api.remove_container(info["Id"], force=True, v=True)
        for info in api.networks(filters=mine):
            api.remove_network(info["Id"])
        for info in api.volumes(filters=mine).get("Volumes") or []:
            api.remove_volume(info["Name"], force=True)
    finally:
        api.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory, sshd_server) -> Iterator[dict[str, str]]:  # noqa: F811
    """One `sbx serve` for the module with its profiles on each backend; the SDK's options
    that point it there with a write key of owner `writer`. The environment's E2B_* point
    at the E2B stand-in, for the service's e2b backend (which reads them too): the SDK the
    tests drive is given the facade's URLs and key as options instead."""
    folder = tmp_path_factory.mktemp("e2b-backends")
    home = folder / "sbx-home"
    modal = ModalStandin(folder / "modal-standin", *MODAL_TOKEN).start()
    e2b_cloud = E2BStandIn({E2B_KEY: "team-a"}).start()
    _profiles(folder / "profiles", sshd_server, modal.add_image())
    with pytest.MonkeyPatch.context() as patch:
        modal_sdk_env(patch, modal.url, *MODAL_TOKEN, folder / "modal.toml")
        for name in [n for n in os.environ if n.startswith("E2B_")]:
            patch.delenv(name)
        for name, value in {"E2B_API_URL": e2b_cloud.url, "E2B_SANDBOX_URL": e2b_cloud.url,
                            "E2B_API_KEY": E2B_KEY, "E2B_CONNECTION_RETRIES": "0"}.items():
            patch.setenv(name, value)
        patch.setenv("SBX_HOME", str(home))
        patch.setenv("SBX_PROFILE_PATH", str(folder / "profiles"))
        patch.setenv("XDG_CONFIG_HOME", str(folder / "xdg-config"))
        for name in ("SBX_DATABASE_URL", "SBX_CLOCK_OFFSET"):
            patch.delenv(name, raising=False)
        patch.chdir(folder)
        service = LiveService(home).start()
        try:
            yield {"api_url": f"{service.url}/e2b", "sandbox_url": f"{service.url}/e2b",
                   "api_key": service.key("write", owner="writer")}
        finally:
            service.stop()
            _remove_compose_objects(home)
            modal.stop()
            e2b_cloud.stop()
    assert modal.unimplemented == [], "the modal SDK called RPCs the stand-in lacks"
    assert e2b_cloud.problems == [], f"the E2B stand-in met what it does not know: " \
        f"{e2b_cloud.problems}"


@pytest.fixture(scope="module", params=BACKENDS)
def box(request, served):
    """One sandbox of the backend, shared by the module's tests of that backend."""
    from e2b import Sandbox

    sandbox = Sandbox.create(f"on-{request.param}", timeout=300,
                             metadata={LABEL_KEY: LABEL_VALUE, "backend": request.param},
                             **served)
    yield sandbox
    sandbox.kill()


def test_commands_run_with_envs_cwd_and_exit_codes(box):
    from e2b import CommandExitException

    result = box.commands.run("echo $GREETING; pwd; echo oops >&2", envs={
        "GREETING": "hello"}, cwd="/tmp")
    assert (result.stdout, result.stderr, result.exit_code) == ("hello\n/tmp\n", "oops\n", 0)
    with pytest.raises(CommandExitException) as failed:
        box.commands.run("echo bad >&2; exit 3")
    assert failed.value.exit_code == 3 and failed.value.stderr == "bad\n"


@pytest.mark.parametrize("box", WITH_PROCESSES, indirect=True)
def test_a_background_command_is_listed_fed_waited_for_and_killed(box):
    from e2b import CommandExitException

    handle = box.commands.run("read line; echo got $line", background=True, stdin=True)
    assert handle.pid in [p.pid for p in box.commands.list()]
    box.commands.send_stdin(handle.pid, "ping\n")
    assert handle.wait().stdout == "got ping\n"
    sleeper = box.commands.run("sleep 300", background=True)
    assert sleeper.kill() is True
    with pytest.raises(CommandExitException) as killed:
        sleeper.wait()
    assert killed.value.exit_code == 137
    assert sleeper.pid not in [p.pid for p in box.commands.list()]


def test_files_are_written_read_listed_and_removed(box):
    folder = f"/tmp/e2b-{box.sandbox_id}"
    assert box.files.write(f"{folder}/a.txt", "alpha").path == f"{folder}/a.txt"
    assert box.files.read(f"{folder}/a.txt") == "alpha"
    assert box.files.read(f"{folder}/a.txt", format="bytes") == b"alpha"
    assert box.files.make_dir(f"{folder}/sub") is True
    assert {e.name: e.type.value for e in box.files.list(folder)} == {
        "a.txt": "file", "sub": "dir"}
    assert box.files.exists(f"{folder}/a.txt") and not box.files.exists(f"{folder}/nope")
    assert box.commands.run(f"cat {folder}/a.txt").stdout == "alpha"  # the same sandbox
    box.files.remove(folder)
    assert not box.files.exists(folder)
    assert box.commands.run(f"ls {folder} || echo gone").stdout.endswith("gone\n")


def test_set_timeout_moves_the_deadline_later_only(box):
    before = box.get_info().end_at
    box.set_timeout(900)
    after = box.get_info().end_at
    assert after - before > timedelta(seconds=300)
    assert after - datetime.now(UTC) <= timedelta(seconds=901)
    box.set_timeout(10)  # sbx never moves a deadline earlier (docs/e2b-api.md)
    assert box.get_info().end_at == after


@pytest.mark.parametrize("box", ["ssh", "modal"], indirect=True)
def test_what_a_backend_lacks_is_a_501_naming_it_and_changes_nothing(box):
    """ssh has exec, files, processes and terminals, not pause, metrics or snapshots; modal
    has snapshots, not pause or metrics."""
    from e2b import SandboxException

    backend = box.get_info().metadata["backend"]
    lacks = [(box.pause, "pausing"), (box.get_metrics, "metrics")]
    if backend == "ssh":
        lacks += [(box.create_snapshot, "snapshots"),
                  (box.fork, r"forks \(a snapshot restored\)")]
    for call, feature in lacks:
        with pytest.raises(SandboxException, match=rf"{feature} on the {backend} backend is "
                                                   r"not implemented"):
            call()
    assert box.is_running()
    assert box.list_snapshots().next_items() == []
    assert box.commands.run("echo still").stdout == "still\n"


@pytest.mark.parametrize("box", ["modal", "e2b"], indirect=True)
def test_without_processes_a_command_is_an_exec_and_what_it_cannot_do_is_a_501(box):
    """Modal and e2b have no background processes: a command (foreground or background)
    runs as the library's exec, its output streamed; stdin, kill and listing it are refused
    by name."""
    from e2b import SandboxException

    backend = box.get_info().metadata["backend"]
    handle = box.commands.run("echo started; sleep 1; echo done", background=True)
    with pytest.raises(SandboxException, match=f"killing a command on the {backend} backend"):
        handle.kill()
    assert handle.wait().stdout == "started\ndone\n"  # it ran to its end all the same
    assert box.commands.list() == []
    with pytest.raises(SandboxException, match=rf"stdin=True\) on the {backend} backend"):
        box.commands.run("cat", background=True, stdin=True)
    assert box.commands.run("echo still").stdout == "still\n"


def test_kill_ends_the_sandbox_on_its_backend(box, served):
    """Last of the module: it kills the shared sandbox (the fixture's kill is then False)."""
    from e2b import Sandbox

    assert box.kill() is True
    assert Sandbox.kill(box.sandbox_id, **served) is False
    assert not box.is_running()
