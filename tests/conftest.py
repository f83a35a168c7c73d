"""The fixtures every test may use; they and the helpers tests import live in tests/support."""

import os

import pytest
from support import (  # noqa: F401 (fixtures pytest finds here)
    docker_api,
    sbx,
    sbx_home,
    tmux,
)

# When a test fails and the Docker engine no longer answers, the rest of the suite cannot
# pass: each Docker test would wait out its own timeout (300 s), for hours. Stop the run at
# once instead, with what the machine says about why (disk, memory, the engine's log).
ENGINE_ANSWER_S = 20


def _engine_answers() -> bool:
    import docker

    try:
        api = docker.APIClient(version="auto", timeout=ENGINE_ANSWER_S)
        try:
            return api.ping() is True
        finally:
            api.close()
    except Exception:  # noqa: BLE001 (any failure to answer is the answer)
        return False


def _machine_report() -> str:
    import shutil

    lines = []
    for folder in ("/", "/tmp", "/var/lib/docker"):
        if os.path.exists(folder):
            usage = shutil.disk_usage(folder)
            lines.append(f"disk {folder}: {usage.free >> 20} MiB free of {usage.total >> 20}")
    try:
        with open("/proc/meminfo") as meminfo:
            lines += [line.strip() for line in meminfo if line.startswith(("MemAvailable",
                                                                              "MemTotal"))]
    except OSError:
        pass
    try:
        with open("/tmp/sbx-dockerd.log", errors="replace") as log:
            lines += ["last lines of /tmp/sbx-dockerd.log:", *log.readlines()[-40:]]
    except OSError:
        pass
    return "\n".join(line.rstrip() for line in lines)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    uses_docker = item.get_closest_marker("docker") is not None or \
        {"docker_api", "sbx"} & set(getattr(item, "fixturenames", ()))
    if report.failed and uses_docker and not _engine_answers():
        print(f"\n{item.nodeid}: the Docker engine did not answer a ping within "
              f"{ENGINE_ANSWER_S} s after this test failed\n{_machine_report()}", flush=True)
        pytest.exit("the Docker engine stopped answering; the remaining tests cannot pass",
                    returncode=3)
    return report
