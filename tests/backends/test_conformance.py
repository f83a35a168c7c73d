"""The conformance kit (adapters/testing) run against every built-in adapter: docker and
compose (the real Docker Compose) against the real engine, ssh against a real OpenSSH server
on 127.0.0.1, e2b and modal (their real SDKs) against the local stand-ins of tests/standins,
and the stub (the test double, so the kit itself is checked against a backend whose every
call is known).

A new backend joins with one class here: an `adapter` fixture, a `lose` fixture and, when it
needs one, a `create_request` fixture (see adapters/testing/conformance.py).
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from sshd import sshd_server  # noqa: F401 (a fixture)
from support import RUN_ID

from sandboxer.adapters.base import CreateRequest
from sandboxer.adapters.testing import AdapterConformance

pytestmark = [pytest.mark.docker, pytest.mark.sshd]

# -- the stub: checks the kit against a backend that does exactly what it says --------------


class TestStubConformance(AdapterConformance):
    @pytest.fixture
    def adapter(self):
        from sandboxer.adapters.stub import StubAdapter

        StubAdapter.reset()
        yield StubAdapter()
        StubAdapter.reset()

    @pytest.fixture
    def lose(self):
        from sandboxer.adapters.stub import StubAdapter

        return StubAdapter.lose

    # the stub understands `echo`, `true`, `false`, `exit N`, `sleep S`, `pwd`, `cat` and
    # `printenv` only: no shell, so nothing prints and then waits
    def argv_exit(self, code: int) -> list[str]:
        return ["exit", str(code)]

    def argv_stderr(self, text: str) -> None:
        return None

    def argv_print_env(self, name: str) -> list[str]:
        return ["printenv", name]

    def argv_echo_then_sleep(self, text: str, seconds: float) -> None:
        return None


# -- docker: the real engine --------------------------------------------------------------


@pytest.mark.docker
class TestDockerConformance(AdapterConformance):
    extra_labels = {"sbx-test-run": RUN_ID}

    @pytest.fixture
    def adapter(self, docker_api):
        from sandboxer.adapters.docker import DockerAdapter

        return DockerAdapter()

    @pytest.fixture
    def lose(self, docker_api):
        return lambda ref: docker_api.remove_container(ref, force=True)


# -- docker under gVisor: the same kit, every sandbox under the engine's runsc runtime --------
# (make test-setup registers it; tests/gvisor shows it is gVisor and checks what the user is
# told where gVisor differs: docs/security.md, "Isolation levels").


@pytest.mark.docker
class TestDockerGvisorConformance(TestDockerConformance):
    @pytest.fixture
    def create_request(self):
        return lambda sandbox_id, labels: CreateRequest(sandbox_id=sandbox_id, labels=labels,
                                                        isolation="gvisor")


# -- compose: the real Docker Compose on the real engine, a project of two services ---------

COMPOSE_KIT_PROJECT = {
    "services": {
        "app": {"image": "sandboxer/base:busybox",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $$!; done"]},
        "web": {"image": "sandboxer/base:busybox", "init": True,
                "command": ["sh", "-c", "mkdir -p /www && echo web > /www/index.html "
                            "&& exec httpd -f -p 8080 -h /www"]},
    },
}


@pytest.mark.docker
class TestComposeConformance(AdapterConformance):
    extra_labels = {"sbx-test-run": RUN_ID}

    @pytest.fixture
    def adapter(self, docker_api, sbx_home):
        from sandboxer.adapters.compose import ComposeAdapter

        return ComposeAdapter()

    @pytest.fixture
    def create_request(self):
        compose = {"project": COMPOSE_KIT_PROJECT, "service": "app", "allow": []}
        return lambda sandbox_id, labels: CreateRequest(sandbox_id=sandbox_id, labels=labels,
                                                        compose=compose)

    @pytest.fixture
    def lose(self, docker_api):
        """Its containers, networks and volumes removed out of band (`docker rm -f`, ...)."""
        def lose(ref: str) -> None:
            by_ref = {"label": [f"sbx.compose={ref}"]}
            for info in docker_api.containers(all=True, filters=by_ref):
                docker_api.remove_container(info["Id"], force=True, v=True)
            for info in docker_api.networks(filters=by_ref):
                docker_api.remove_network(info["Id"])
            for info in docker_api.volumes(filters=by_ref).get("Volumes") or []:
                docker_api.remove_volume(info["Name"], force=True)
        return lose


# -- ssh: a real sshd on 127.0.0.1, listed as three hosts (one per port it listens on) ------


@pytest.fixture
def ssh_inventory(sshd_server, tmp_path) -> Path:  # noqa: F811
    path = tmp_path / "hosts.yaml"
    hosts = [sshd_server.inventory_entry(f"host-{i}", port, {"pool": "kit"})
             for i, port in enumerate(sshd_server.ports, 1)]
    path.write_text(yaml.safe_dump({"hosts": hosts}))
    return path


class TestSSHConformance(AdapterConformance):
    @pytest.fixture
    def adapter(self, sbx_home, ssh_inventory, monkeypatch):
        from sandboxer.adapters.ssh import INVENTORY_ENV, SSHAdapter

        monkeypatch.setenv(INVENTORY_ENV, str(ssh_inventory))  # where volumes are kept
        return SSHAdapter()

    @pytest.fixture
    def create_request(self, ssh_inventory):
        options = {"inventory": str(ssh_inventory), "match": {"pool": "kit"},
                   "connect_timeout": 5}
        return lambda sandbox_id, labels: CreateRequest(
            sandbox_id=sandbox_id, labels=labels, network="full", options=options)

    @pytest.fixture
    def lose(self, sbx_home):
        """The lease record vanishes (its file was edited or restored from an old copy)."""
        def lose(ref: str) -> None:
            with sqlite3.connect(sbx_home / "ssh-leases.db") as conn:
                conn.execute("DELETE FROM ssh_leases WHERE ref = ?", (ref,))
        return lose



# -- e2b and modal: the real SDKs against the local stand-ins in tests/standins --------------

E2B_KEY = "e2b_" + secrets.token_hex(20)
MODAL_TOKEN_ID = f"ak-sbxkit{secrets.token_hex(6)}"
MODAL_TOKEN_SECRET = f"as-sbxkit{secrets.token_hex(12)}"


@pytest.fixture
def e2b_standin():
    from standins.e2b_server import E2BStandIn

    server = E2BStandIn({E2B_KEY: "team-kit"}, metrics_every=0.2).start()
    yield server
    server.stop()
    assert server.problems == [], f"the stand-in met what it does not know: {server.problems}"


class TestE2BConformance(AdapterConformance):
    # E2B's volume mounts are read-write only, and its volume content API makes no links
    volume_read_only = False
    volume_links = False

    @pytest.fixture
    def adapter(self, e2b_standin, sbx_home, monkeypatch):
        from sandboxer.adapters.e2b import E2BAdapter

        for name in [n for n in os.environ if n.startswith("E2B_")]:
            monkeypatch.delenv(name)
        for name, value in {"E2B_API_URL": e2b_standin.url, "E2B_SANDBOX_URL": e2b_standin.url,
                            "E2B_API_KEY": E2B_KEY, "E2B_CONNECTION_RETRIES": "0",
                            "SBX_E2B_RATE_LIMIT_BACKOFF": "0.01"}.items():
            monkeypatch.setenv(name, value)
        return E2BAdapter()

    @pytest.fixture
    def lose(self, e2b_standin):
        """Another client of the same team kills it through E2B's API."""
        def lose(ref: str) -> None:
            request = urllib.request.Request(f"{e2b_standin.url}/sandboxes/{ref.split('@')[0]}",
                                             method="DELETE", headers={"X-API-KEY": E2B_KEY})
            urllib.request.urlopen(request, timeout=10).close()
        return lose


@pytest.fixture(scope="module")
def modal_standin(tmp_path_factory):
    from standins.modal_server import ModalStandin

    server = ModalStandin(tmp_path_factory.mktemp("modal-standin"), MODAL_TOKEN_ID,
                          MODAL_TOKEN_SECRET)
    server.start()
    yield server
    server.stop()
    assert server.unimplemented == [], "the SDK called RPCs the stand-in lacks"


class TestModalConformance(AdapterConformance):
    # Modal's volume API uploads files (batch_upload): no links (docs/volumes.md)
    volume_links = False

    @pytest.fixture
    def adapter(self, modal_standin, sbx_home, monkeypatch, tmp_path):
        from sandboxer.adapters.modal import ModalAdapter

        monkeypatch.setenv("MODAL_SERVER_URL", modal_standin.url)
        monkeypatch.setenv("MODAL_TOKEN_ID", MODAL_TOKEN_ID)
        monkeypatch.setenv("MODAL_TOKEN_SECRET", MODAL_TOKEN_SECRET)
        monkeypatch.setenv("MODAL_CONFIG_PATH", str(tmp_path / "modal.toml"))
        for name in ("MODAL_PROFILE", "MODAL_ENVIRONMENT", "MODAL_SANDBOX_V2"):
            monkeypatch.delenv(name, raising=False)
        return ModalAdapter()

    @pytest.fixture
    def create_request(self, modal_standin):
        image = modal_standin.add_image({"hello.txt": "hello\n"})
        return lambda sandbox_id, labels: CreateRequest(sandbox_id, labels, image=image)

    @pytest.fixture
    def lose(self, modal_standin):
        return modal_standin.forget  # Modal no longer knows it at all


# -- the kit itself: it fails an adapter that breaks the contract ---------------------------

SLOPPY_ADAPTER = '''
from sandboxer.adapters.base import AdapterError, Capability
from sandboxer.adapters.stub import StubAdapter
from sandboxer.adapters.testing import AdapterConformance
import pytest


class SloppyAdapter(StubAdapter):
    # declares pause, which it cannot do; does not declare logs, which it does not refuse;
    # declares run-as-user, and runs everything as root; and is written to the older contract:
    # its exec takes no env, its destroy no services
    capabilities = frozenset({Capability.EXEC, Capability.PAUSE, Capability.RUN_AS_USER})

    async def destroy(self, ref):
        if ref not in self.objects:
            raise AdapterError(f"no such sandbox {ref}")  # already gone must be success
        await super().destroy(ref)

    async def list(self, labels):  # any label instead of every label
        want = dict(labels).items()
        return [o for o in self.objects.values() if want & dict(o.labels).items()]

    async def exec(self, ref, argv, timeout_s=None):
        result = await super().exec(ref, argv, timeout_s)
        return type(result)(min(result.exit_code, 1), result.stdout, result.stderr,
                            result.duration_s)  # every failure comes back as exit 1


@pytest.fixture
def adapter():
    SloppyAdapter.reset()
    return SloppyAdapter()


class TestSloppy(AdapterConformance):
    check_entry_point = False

    @pytest.fixture
    def lose(self):
        return SloppyAdapter.lose

    def argv_exit(self, code):
        return ["exit", str(code)]

    def argv_stderr(self, text):
        return None

    def argv_sleep(self, seconds):
        return None

    def argv_echo_then_sleep(self, text, seconds):
        return None

    def argv_uid(self):
        return ["echo", "0"]  # what `id -u` says in its sandboxes
'''


def test_the_kit_fails_an_adapter_that_breaks_the_contract(tmp_path):
    """Each contract breach of the sloppy adapter above fails exactly the test that checks
    that rule; everything it does right passes."""
    (tmp_path / "test_sloppy.py").write_text(SLOPPY_ADAPTER)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
         str(tmp_path / "test_sloppy.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    failed = sorted(line.split("::")[-1].split(" ")[0] for line in result.stdout.splitlines()
                    if line.startswith(("FAILED", "ERROR")))
    assert failed == sorted([
        "test_destroy_is_idempotent",             # destroy of a gone object raises
        "test_after_the_backend_loses_a_sandbox",  # the same, after the backend lost it
        "test_list_filters_by_every_label",        # list matches any label
        "test_exec_exit_codes_and_output",         # exit 3 came back as 1
        "test_capability[pause]",                  # declared, not done
        "test_capability[logs]",                   # not declared, not refused
        "test_capability[run-as-user]",            # declared, the user not applied
        "test_exec_environment",                   # exec takes no env
        "test_exec_options",                       # nor cwd, user or stdin
        "test_destroy_takes_the_services_hint",    # destroy takes no services
        "test_capability[files]",                  # not declared, not refused (the stub's)
    ]), result.stdout[-4000:]
    assert "18 passed" in result.stdout.splitlines()[-1], result.stdout[-1000:]  # the rest, shell, pty, ports, isolation-gvisor and volumes (not declared, refused) among them
