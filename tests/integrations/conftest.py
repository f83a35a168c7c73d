"""Fixtures for the agent-framework integrations (docs/integrations.md): a library client on
the test's own SBX_HOME, in process (`local`) or as a client of a live `sbx serve` on
127.0.0.1 (`remote`), so each framework's interface is tested over both transports; what
they made is removed by id afterwards."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from support import RUN_LABEL, library_client, remove_test_containers, service_for

import sandboxer

RUN = dict([RUN_LABEL.split("=", 1)])


@pytest.fixture(params=["local", "remote"])
def service(request, sbx_home: Path):
    """A live service over the test's SBX_HOME when the transport is `remote`."""
    with service_for(request.param, sbx_home) as live:
        yield live


@pytest.fixture
def sync_client(service, sbx_home: Path) -> Iterator[sandboxer.Sandboxer]:
    sbx = library_client(sandboxer.Sandboxer, service, sbx_home, "integration-test")
    yield sbx
    sbx.close()
    remove_test_containers(sbx_home)


@pytest_asyncio.fixture
async def client(service, sbx_home: Path) -> AsyncIterator[sandboxer.AsyncSandboxer]:
    sbx = library_client(sandboxer.AsyncSandboxer, service, sbx_home, "integration-test")
    yield sbx
    await sbx.close()
    remove_test_containers(sbx_home)


@pytest_asyncio.fixture
async def local_client(sbx_home: Path) -> AsyncIterator[sandboxer.AsyncSandboxer]:
    """In process only, for what the transport does not change."""
    sbx = sandboxer.AsyncSandboxer(home=sbx_home, actor="integration-test")
    yield sbx
    await sbx.close()
    remove_test_containers(sbx_home)
