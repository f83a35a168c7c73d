"""The service's container image (Dockerfile): built as `make service-image` builds it, started
with the host engine's socket mounted, a volume as its SBX_HOME and its port published on
127.0.0.1 only, and driven from the host through the HTTP API. The sandboxes it makes are
containers on the host's engine, next to its own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from support import ROOT, RUN_ID, RUN_LABEL

pytestmark = [pytest.mark.slow, pytest.mark.docker]

IMAGE = "sandboxer/service:latest"
ENGINE_SOCKET = "/var/run/docker.sock"
RUN_KEY, RUN_VALUE = RUN_LABEL.split("=", 1)


@pytest.fixture(scope="module")
def service_image() -> str:
    """The image from the current source. The build script keeps the Python base, the wheels
    and the dependency layer between runs, so after the first run only the source is copied."""
    proc = subprocess.run(
        [str(ROOT / "scripts" / "build-service-image.sh")],
        env={**os.environ, "PYTHON": sys.executable, "SERVICE_IMAGE": IMAGE},
        capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"the image did not build:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    return IMAGE


@dataclass
class ServiceContainer:
    id: str
    url: str
    token: str


def run_to_end(api, image: str, volume: str, *command: str) -> str:
    """A one-off container of the image running `sbx COMMAND...` on the volume, without a
    network; its stdout once it has exited 0. Removed by id."""
    made = api.create_container(
        image, entrypoint=["sbx"], command=list(command), labels={RUN_KEY: RUN_VALUE},
        host_config=api.create_host_config(network_mode="none",
                                           binds={volume: {"bind": "/var/lib/sbx", "mode": "rw"}}))
    try:
        api.start(made["Id"])
        status = api.wait(made["Id"], timeout=120)["StatusCode"]
        out = api.logs(made["Id"], stdout=True, stderr=False).decode()
        err = api.logs(made["Id"], stdout=False, stderr=True).decode()
        assert status == 0, f"sbx {' '.join(command)} exited {status}: {err or out}"
        return out
    finally:
        api.remove_container(made["Id"], force=True)


def wait_healthy(api, container_id: str, url: str) -> None:
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        state = api.inspect_container(container_id)["State"]
        if not state["Running"]:
            logs = api.logs(container_id).decode()
            pytest.fail(f"the service's container exited {state['ExitCode']}: {logs}")
        if time.monotonic() > deadline:
            pytest.fail(f"the service did not answer within 90s: {api.logs(container_id).decode()}")
        time.sleep(0.2)


@pytest.fixture
def service(docker_api, service_image: str) -> Iterator[ServiceContainer]:
    """The image as docs/service.md runs it: the engine's socket mounted, the socket's group
    added to the non-root user, a volume as SBX_HOME, on a bridge network of the test's own,
    the port published on 127.0.0.1. Teardown removes, by id, every container carrying the
    run's label (the service and the sandboxes it made), then the network and the volume."""
    api = docker_api
    volume = f"sbx-test-{RUN_ID}-home"
    network = None
    try:
        api.create_volume(name=volume, labels={RUN_KEY: RUN_VALUE})
        created = run_to_end(api, service_image, volume,
                             "api-keys", "create", "--scope", "write", "--owner", "container-test")
        token = created.split()[-1]
        network = api.create_network(f"sbx-test-{RUN_ID}-service", driver="bridge",
                                     labels={RUN_KEY: RUN_VALUE})["Id"]
        made = api.create_container(
            service_image, ports=[8765], labels={RUN_KEY: RUN_VALUE},
            host_config=api.create_host_config(
                network_mode=network,
                port_bindings={8765: ("127.0.0.1", None)},
                group_add=[str(os.stat(ENGINE_SOCKET).st_gid)],
                binds={ENGINE_SOCKET: {"bind": ENGINE_SOCKET, "mode": "rw"},
                       volume: {"bind": "/var/lib/sbx", "mode": "rw"}}))
        api.start(made["Id"])
        port = api.port(made["Id"], 8765)[0]["HostPort"]
        url = f"http://127.0.0.1:{port}"
        wait_healthy(api, made["Id"], url)
        yield ServiceContainer(made["Id"], url, token)
    finally:
        for info in api.containers(all=True, filters={"label": [RUN_LABEL]}):
            api.remove_container(info["Id"], force=True, v=True)
        if network is not None:
            api.remove_network(network)
        if any(v["Name"] == volume for v in api.volumes(filters={"name": volume})["Volumes"] or []):
            api.remove_volume(volume)


def test_the_container_serves_create_exec_destroy_on_the_host_engine(docker_api, service):
    api = docker_api
    config = api.inspect_container(service.id)["Config"]
    assert config["User"] == "sbx", "the service runs as its own user, not root"

    with httpx.Client(base_url=service.url, timeout=120) as anonymous:
        # beyond loopback inside its container, so every request needs a key
        assert anonymous.get("/v1/sandboxes").status_code == 401

    with httpx.Client(base_url=service.url, timeout=120,
                      headers={"Authorization": f"Bearer {service.token}"}) as http:
        made = http.post("/v1/sandboxes", json={"profile": "default", "ttl": "10m",
                                                "labels": {RUN_KEY: RUN_VALUE}})
        assert made.status_code == 201, made.text
        record = made.json()
        assert record["backend"] == "docker" and record["state"] == "running"
        assert record["owner"] == "container-test"  # the key's owner
        assert record["host"] == service.id[:12]  # made by the service in its container

        # the sandbox is a container on the host's engine, beside the service's own
        box = api.inspect_container(record["backend_ref"])
        assert box["State"]["Running"]
        assert box["Config"]["Labels"]["sbx.id"] == record["id"]
        assert box["Config"]["Labels"][RUN_KEY] == RUN_VALUE
        assert box["Id"] != service.id

        ran = http.post(f"/v1/sandboxes/{record['id']}/exec",
                        json={"argv": ["sh", "-c", "echo hello from $(hostname)"]})
        assert ran.status_code == 200, ran.text
        result = ran.json()
        assert result["exit_code"] == 0
        assert result["stdout"] == f"hello from {box['Id'][:12]}\n"  # it ran in the sandbox

        gone = http.delete(f"/v1/sandboxes/{record['id']}")
        assert gone.status_code == 200, gone.text
        assert gone.json()["state"] == "destroyed"
        assert api.containers(all=True, filters={"id": record["backend_ref"]}) == []
        assert http.get(f"/v1/sandboxes/{record['id']}").json()["state"] == "destroyed"
