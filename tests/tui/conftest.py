"""Fixtures of the dashboard tests: the test's own SBX_HOME (from tests/conftest.py), a
`stub` profile in the test's own profile folder, a frozen clock, and the dashboard's model
over the library over a Manager whose stub can do every action."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from sandboxer.core.rules.clock import FrozenClock

from .helpers import FullStub, make_dashboard, make_manager, write_stub_profile


@pytest.fixture
def profiles(sbx_home, tmp_path, monkeypatch):
    folder = tmp_path / "profiles"
    write_stub_profile(folder)
    monkeypatch.setenv("SBX_PROFILE_PATH", str(folder))
    monkeypatch.setenv("SBX_HOST_NAME", "devbox")  # snapshots show it: not this machine's name
    return folder


@pytest.fixture
def clock():
    return FrozenClock(datetime(2026, 3, 2, 9, 0, tzinfo=UTC))


@pytest.fixture
def mgr(sbx_home, profiles, clock):
    manager = make_manager(sbx_home, clock)
    yield manager
    FullStub.reset()


@pytest.fixture
def dashboard(mgr):
    """Stub only in the header; metrics from what is stored (no live sampler)."""
    return make_dashboard(mgr, backends=["stub"], sample_metrics=False)


@pytest.fixture
def seeded(mgr, clock):
    from .helpers import seed_fleet

    return asyncio.run(seed_fleet(mgr, clock))
