"""Fixtures for the library's own tests: a client on the test's own SBX_HOME, a profile on
the stub test double (for what needs no engine) and the run label on everything made.

`client` and `sync_client` come twice: in-process (`local`) and as a client of a live
`sbx serve` on 127.0.0.1 over that same SBX_HOME (`remote`, with an admin key whose owner
is the actor the tests expect), so the suites run unchanged against both transports."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from support import RUN_LABEL, library_client, remove_test_containers, service_for

import sandboxer

RUN = dict([RUN_LABEL.split("=", 1)])


@pytest.fixture
def stub_profile(sbx_home: Path, tmp_path: Path):
    """A profile on the stub backend (a test double: in this process only)."""
    from sandboxer.adapters.stub import StubAdapter
    from sandboxer.core.rules.profiles import ProfileLoader

    StubAdapter.reset()
    path = tmp_path / "stubby.yaml"
    path.write_text("backend: stub\nttl: {default: 10m, max: 1h, idle: 30m}\n")
    return ProfileLoader().load_file(path)


DEBIAN = "sandboxer/python-base:bookworm"  # has bash and dash (made by `make test-setup`)


async def debian_box(client, docker_api, tmp_path: Path):
    """A sandbox of `client` on the Debian image DEBIAN, labelled with the run. An engine
    without that image fails the test, saying what makes it (as docker_api fails without an
    engine): it is part of what `make test` sets up."""
    from sandboxer.core.rules.profiles import ProfileLoader

    if not docker_api.images(name=DEBIAN):
        pytest.fail(f"{DEBIAN} is built by `make test-setup` (the service image's base); "
                    "this engine does not have it")
    path = tmp_path / "debian.yaml"
    path.write_text(f"extends: default\nimage: {DEBIAN}\n")
    return await client.create(ProfileLoader().load_file(path), ttl="10m", labels=RUN)


TRANSPORTS = ["local", "remote"]


@pytest.fixture
def service(request, sbx_home: Path):
    """A live service over the test's SBX_HOME when the transport is `remote`."""
    with service_for(request.param, sbx_home) as live:
        yield live


@pytest_asyncio.fixture
async def client(service, sbx_home: Path) -> AsyncIterator[sandboxer.AsyncSandboxer]:
    """An AsyncSandboxer on the test's SBX_HOME; the containers it made are removed after."""
    sbx = library_client(sandboxer.AsyncSandboxer, service, sbx_home, "api-test")
    yield sbx
    await sbx.close()
    remove_test_containers(sbx_home)


@pytest.fixture
def sync_client(service, sbx_home: Path):
    sbx = library_client(sandboxer.Sandboxer, service, sbx_home, "api-test")
    yield sbx
    sbx.close()
    remove_test_containers(sbx_home)


def pytest_generate_tests(metafunc) -> None:
    if "service" in metafunc.fixturenames:
        metafunc.parametrize("service", TRANSPORTS, indirect=True)
