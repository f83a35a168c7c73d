"""Fixtures for the E2B API's tests: a live `sbx serve` (real uvicorn on 127.0.0.1, in a
thread) on the real Docker engine, its keys, and the unmodified `e2b` SDK pointed at it by
E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY (docs/e2b-api.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import remove_test_containers

from tests.service.live import LiveService


@pytest.fixture
def live(sbx_home: Path, docker_api) -> Iterator[LiveService]:
    service = LiveService(sbx_home).start()
    yield service
    service.stop()
    remove_test_containers(sbx_home)


@pytest.fixture
def e2b_env(live: LiveService, monkeypatch: pytest.MonkeyPatch) -> str:
    """The SDK's environment pointed at the live service with a write key of owner `writer`;
    the key."""
    key = live.key("write", owner="writer")
    monkeypatch.setenv("E2B_API_URL", f"{live.url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{live.url}/e2b")
    monkeypatch.setenv("E2B_API_KEY", key)
    monkeypatch.delenv("E2B_DOMAIN", raising=False)
    monkeypatch.delenv("E2B_DEBUG", raising=False)
    return key
