"""Following every running sandbox's metrics (`sbx metrics --all`, the dashboard's live
figures) reads only what changed since its last refresh (issue 36): a refresh where no
sandbox changed reads no row at all, however many there are, and a sandbox that starts
is followed from the next refresh on."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from sandboxer.core.follow import sampler
from sandboxer.core.follow.watch import InventoryWatcher
from sandboxer.core.rules.clock import FrozenClock
from sandboxer.core.rules.profiles import ProfileLoader
from tests.tui.helpers import FullStub, make_manager, write_stub_profile

COUNT = 100
REFRESH = timedelta(milliseconds=100)


async def until(condition, what: str, within: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.02)


def test_following_every_sandbox_reads_only_the_rows_that_changed(sbx_home, tmp_path,
                                                                   monkeypatch):
    write_stub_profile(tmp_path / "profiles")
    monkeypatch.setenv("SBX_PROFILE_PATH", str(tmp_path / "profiles"))
    mgr = make_manager(sbx_home, FrozenClock(datetime(2026, 3, 2, 9, 0, tzinfo=UTC)))
    reads: list[int] = []  # the rows each refresh read
    read = InventoryWatcher.read

    def counted(self):
        delta = read(self)
        reads.append(self.rows_read if delta is not None else -1)
        return delta

    monkeypatch.setattr(InventoryWatcher, "read", counted)

    async def main() -> None:
        profile = ProfileLoader().load("stub")
        boxes = [await mgr.create(profile) for _ in range(COUNT)]
        gone = await mgr.create(profile)
        await mgr.destroy(gone["id"])
        followed: set[str] = set()
        stop = asyncio.Event()
        task = asyncio.create_task(sampler.follow_all(
            mgr, lambda view: followed.add(view["sandbox_id"]), stop, REFRESH))
        try:
            await until(lambda: followed >= {b["id"] for b in boxes}, "every sandbox followed")
            assert reads[0] == COUNT  # the first look: every sandbox not destroyed
            assert gone["id"] not in followed
            # the second look reads what the first left out (the destroyed one), once
            await until(lambda: len(reads) >= 2, "a second refresh")
            quiet = len(reads)
            await until(lambda: len(reads) >= quiet + 5, "five more refreshes")
            assert reads[quiet:] == [0] * len(reads[quiet:]), reads[quiet:]

            late = await mgr.create(profile)
            changed = len(reads)
            await until(lambda: late["id"] in followed, "the new sandbox followed")
            # its row, read once or twice (while being made, then running): not all of them
            assert 1 <= sum(reads[changed:]) <= 2, reads[changed:]
        finally:
            stop.set()
            await task
            await mgr.close()

    try:
        asyncio.run(main())
    finally:
        FullStub.reset()


def test_a_follow_left_running_when_its_loop_ended_closes_quietly(sbx_home, tmp_path,
                                                                  monkeypatch):
    """A front end whose loop ends without stopping its follower (a service shutting down):
    the garbage collector closes the coroutine after the loop, and nothing is raised."""
    write_stub_profile(tmp_path / "profiles")
    monkeypatch.setenv("SBX_PROFILE_PATH", str(tmp_path / "profiles"))
    mgr = make_manager(sbx_home, FrozenClock(datetime(2026, 3, 2, 9, 0, tzinfo=UTC)))
    loop = asyncio.new_event_loop()
    try:
        box = loop.run_until_complete(mgr.create(ProfileLoader().load("stub")))
        followed: set[str] = set()
        follower = sampler.follow_all(mgr, lambda view: followed.add(view["sandbox_id"]),
                                      asyncio.Event(), REFRESH)
        task = loop.create_task(follower)
        loop.run_until_complete(until(lambda: box["id"] in followed, "the sandbox followed"))
        assert not task.done()  # waiting for its next refresh, a stream open
    finally:
        loop.close()
    follower.close()  # what the collector does; raised "Event loop is closed" before
    mgr.db.dispose()
    FullStub.reset()
