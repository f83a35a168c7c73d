"""How long the library waits before asking a service again for a stream it refused for want
of a slot (docs/service.md, "The remote client"): the service's Retry-After in seconds, kept
within 0.05-5 s, never past the give-up time; any other refusal is raised at once."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from sandboxer import _remote
from sandboxer.core.rules.errors import QuotaExceeded, Unauthorized, Unavailable


def _wait(status: int, error: Exception, give_up: float | None, **headers: str) -> float | None:
    async def ask() -> float | None:
        return _remote._slot_wait(httpx.Response(status, headers=headers), error, give_up)

    return asyncio.run(ask())


@pytest.mark.parametrize(("retry_after", "pause"), [
    ("2", 2.0), ("0", 0.05), ("-3", 0.05), ("600", 5.0),
    ("nan", 1.0), ("inf", 1.0), ("Wed, 21 Oct 2015 07:28:00 GMT", 1.0)])
def test_the_pause_is_the_retry_after_within_bounds(retry_after, pause):
    assert _wait(429, Unavailable("streams"), None, **{"Retry-After": retry_after}) == pause


def test_without_a_retry_after_the_pause_is_a_second():
    assert _wait(429, Unavailable("streams"), None) == 1.0


@pytest.mark.parametrize(("status", "error"), [
    (429, QuotaExceeded("quota")), (503, Unavailable("down")), (401, Unauthorized("key"))])
def test_any_other_refusal_is_raised_at_once(status, error):
    assert _wait(status, error, None, **{"Retry-After": "1"}) is None


def test_past_the_give_up_time_it_is_raised_and_before_it_no_pause_runs_past_it():
    async def ask() -> tuple[float | None, float | None]:
        now = asyncio.get_running_loop().time()
        refused = httpx.Response(429, headers={"Retry-After": "5"})
        return (_remote._slot_wait(refused, Unavailable("streams"), now - 1),
                _remote._slot_wait(refused, Unavailable("streams"), now + 2))

    past, near = asyncio.run(ask())
    assert past is None and near is not None and 0 < near <= 2
