"""Fixtures for the library's own tests: a client on the test's own SBX_HOME, a profile on
the stub test double (for what needs no engine) and the run label on everything made."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from conftest import RUN_LABEL, remove_test_containers

import sandboxer

RUN = dict([RUN_LABEL.split("=", 1)])


@pytest.fixture
def stub_profile(sbx_home: Path, tmp_path: Path):
    """A profile on the stub backend (a test double: in this process only)."""
    from adapters.stub import StubAdapter
    from core.profiles import ProfileLoader

    StubAdapter.reset()
    path = tmp_path / "stubby.yaml"
    path.write_text("backend: stub\nttl: {default: 10m, max: 1h, idle: 30m}\n")
    return ProfileLoader().load_file(path)


@pytest_asyncio.fixture
async def client(sbx_home: Path) -> AsyncIterator[sandboxer.AsyncSandboxer]:
    """An AsyncSandboxer on the test's SBX_HOME; the containers it made are removed after."""
    sbx = sandboxer.AsyncSandboxer(home=sbx_home, actor="api-test")
    yield sbx
    await sbx.close()
    remove_test_containers(sbx_home)


@pytest.fixture
def sync_client(sbx_home: Path):
    sbx = sandboxer.Sandboxer(home=sbx_home, actor="api-test")
    yield sbx
    sbx.close()
    remove_test_containers(sbx_home)
