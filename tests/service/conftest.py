"""Fixtures for the service's tests: a live service over the test's SBX_HOME (real uvicorn on
127.0.0.1, in a thread, so the stub test double is shared), its keys, and a profile on the
stub that the service finds by name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.service.live import LiveService


@pytest.fixture
def stub_named(sbx_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """`stubby`, a profile on the stub backend on the search path (SBX_PROFILE_PATH)."""
    from sandboxer.adapters.stub import StubAdapter

    StubAdapter.reset()
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "stubby.yaml").write_text("backend: stub\nttl: {default: 10m, max: 1h}\n")
    monkeypatch.setenv("SBX_PROFILE_PATH", str(folder))
    return "stubby"


@pytest.fixture
def live(sbx_home: Path, stub_named: str) -> Iterator[LiveService]:
    service = LiveService(sbx_home).start()
    yield service
    service.stop()


class Api:
    """An HTTP client of the live service with one key (or none)."""

    def __init__(self, url: str, token: str | None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=60)

    def __getattr__(self, name: str):
        return getattr(self.http, name)


@pytest.fixture
def api(live: LiveService) -> Iterator[Api]:
    """A write key's client (owner `writer`)."""
    client = Api(live.url, live.key("write", owner="writer"))
    yield client
    client.http.close()
