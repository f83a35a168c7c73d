"""The threads the backends' blocking calls get (sandboxer.core.rules.threads): at least what
each user of a loop asks for, never fewer, on real event loops and real threads. A reap cycle
once swapped a library client's 64 threads for its own 16, for good, so that every later call
of that client (a service whose timer had reaped) ran on 16."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import sandboxer
from sandboxer.core.rules.threads import BLOCKING_THREADS, ensure_thread_pool

AT_ONCE = 32  # more than a reap cycle's 16, fewer than a client's 64
WAIT_S = 20  # a barrier that never fills breaks after this: the calls did not run at once


async def run_at_once(count: int, wait_s: float = WAIT_S) -> set[threading.Thread]:
    """`count` blocking calls on the running loop's default pool, each waiting until all of
    them run: they all return only if the pool runs `count` at once. Returns their threads."""
    barrier = threading.Barrier(count, timeout=wait_s)

    def wait() -> threading.Thread:
        barrier.wait()
        return threading.current_thread()

    return set(await asyncio.gather(*(asyncio.to_thread(wait) for _ in range(count))))


def test_a_smaller_ask_leaves_the_larger_pool():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        ensure_thread_pool(loop, BLOCKING_THREADS)
        ensure_thread_pool(loop, 16)  # a reap cycle on a client's loop
        assert len(await run_at_once(AT_ONCE)) == AT_ONCE

    asyncio.run(main())


def test_a_larger_ask_grows_the_pool_and_the_smaller_ones_threads_end():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        ensure_thread_pool(loop, 4)
        first = await run_at_once(4)
        # held here, as a caller that kept it would: its threads end only if it is shut down
        replaced = loop._default_executor  # noqa: SLF001
        ensure_thread_pool(loop, AT_ONCE)
        assert loop._default_executor is not replaced  # noqa: SLF001
        assert len(await run_at_once(AT_ONCE)) == AT_ONCE
        deadline = time.monotonic() + WAIT_S
        while any(thread.is_alive() for thread in first):
            assert time.monotonic() < deadline, "the replaced pool's threads did not end"
            await asyncio.sleep(0.05)

    asyncio.run(main())


def test_a_small_pool_cannot_run_more_at_once():
    """The check above can fail: on a pool of 16, 32 calls waiting for each other break
    (however long they wait: 16 of them never start)."""
    async def main() -> None:
        ensure_thread_pool(asyncio.get_running_loop(), 16)
        barrier_wait = run_at_once(AT_ONCE, wait_s=1)
        with pytest.raises(threading.BrokenBarrierError):
            await barrier_wait

    asyncio.run(main())


async def test_a_client_that_has_reaped_still_runs_many_calls_at_once(sbx_home, monkeypatch):
    monkeypatch.setenv("SBX_ADAPTERS", "stub")  # the cycle looks at the test double alone
    async with sandboxer.AsyncSandboxer() as client:
        assert (await client.reap()).failed == ()
        # the calls go where the client's own run: its core loop (private, reached for this)
        core = client._transport.core  # noqa: SLF001
        ran = asyncio.run_coroutine_threadsafe(run_at_once(AT_ONCE), core.loop)
        assert len(await asyncio.wrap_future(ran)) == AT_ONCE
