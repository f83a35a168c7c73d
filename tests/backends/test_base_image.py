"""The offline base image is built from the host's busybox, with no registry, and works."""

import pytest
from support import RUN_ID

from sandboxer.adapters.docker import KEEPALIVE, build_base_image

pytestmark = pytest.mark.docker


def test_base_image_builds_offline_and_runs_a_shell(docker_api):
    tag = f"sandboxer/base-test:{RUN_ID}"
    build_base_image(docker_api, tag)
    container = None
    try:
        image = docker_api.inspect_image(tag)
        assert image["Config"]["Cmd"] == ["sh"]
        container = docker_api.create_container(
            tag, command=KEEPALIVE, labels={"sbx-test-run": RUN_ID},
            host_config=docker_api.create_host_config(network_mode="none"))["Id"]
        docker_api.start(container)
        exec_id = docker_api.exec_create(
            container, ["sh", "-c", "echo ok > /tmp/x && cat /tmp/x && id -u && ls /work"])["Id"]
        output = docker_api.exec_start(exec_id)
        assert docker_api.exec_inspect(exec_id)["ExitCode"] == 0
        assert output.decode().split() == ["ok", "0"]
    finally:
        if container:
            docker_api.remove_container(container, force=True)
        docker_api.remove_image(tag, force=True)
