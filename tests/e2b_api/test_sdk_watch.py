"""The unmodified `e2b` SDK's `files.watch_dir` against `sbx serve` on the real Docker engine
(docs/e2b-api.md, "Watching a folder"): the sync SDK's polling watcher and the async SDK's
streaming one both report what changed in a folder, by name relative to it."""

from __future__ import annotations

import asyncio

import pytest
from support import RUN_LABEL

pytestmark = pytest.mark.docker

LABEL_KEY, LABEL_VALUE = RUN_LABEL.split("=")


def test_the_polling_watcher_reports_writes_creates_removes_and_refuses_bad_paths(e2b_env):
    from e2b import (
        FilesystemEventType,
        FileType,
        InvalidArgumentException,
        NotFoundException,
        Sandbox,
        SandboxException,
    )

    box = Sandbox.create("default", timeout=120, metadata={LABEL_KEY: LABEL_VALUE})
    try:
        box.files.write("/tmp/w/a.txt", "first")
        handle = box.files.watch_dir("/tmp/w", include_entry=True)
        assert handle.get_new_events() == []
        box.files.write("/tmp/w/a.txt", "the second, longer")
        box.files.write("/tmp/w/b.txt", "new")
        seen = {(e.name, e.type) for e in handle.get_new_events()}
        assert seen == {("a.txt", FilesystemEventType.WRITE),
                        ("b.txt", FilesystemEventType.CREATE),
                        ("b.txt", FilesystemEventType.WRITE)}
        box.files.remove("/tmp/w/a.txt")
        box.files.make_dir("/tmp/w/sub")
        box.files.write("/tmp/w/sub/deep.txt", "not watched: not recursive")
        events = handle.get_new_events()
        assert [(e.name, e.type) for e in events] == [
            ("a.txt", FilesystemEventType.REMOVE), ("sub", FilesystemEventType.CREATE)]
        assert events[1].entry.type == FileType.DIR and events[1].entry.path == "/tmp/w/sub"
        handle.stop()
        with pytest.raises(SandboxException, match="stopped"):
            handle.get_new_events()
        deep = box.files.watch_dir("/tmp/w", recursive=True)
        box.files.write("/tmp/w/sub/deeper.txt", "x")
        assert ("sub/deeper.txt", FilesystemEventType.CREATE) in {
            (e.name, e.type) for e in deep.get_new_events()}
        deep.stop()
        with pytest.raises(NotFoundException):
            box.files.watch_dir("/tmp/no-such-folder")
        with pytest.raises(InvalidArgumentException, match="not a directory"):
            box.files.watch_dir("/tmp/w/b.txt")
    finally:
        box.kill()


def test_the_streaming_watcher_calls_back_as_files_change(e2b_env):
    from e2b import AsyncSandbox, FilesystemEventType

    async def main() -> None:
        box = await AsyncSandbox.create("default", timeout=120,
                                        metadata={LABEL_KEY: LABEL_VALUE})
        try:
            await box.files.make_dir("/tmp/s")
            seen: list[tuple[str, FilesystemEventType]] = []
            handle = await box.files.watch_dir("/tmp/s", on_event=lambda e: seen.append(
                (e.name, e.type)))
            await box.files.write("/tmp/s/new.txt", "hello")
            async with asyncio.timeout(30):
                while ("new.txt", FilesystemEventType.WRITE) not in seen:
                    await asyncio.sleep(0.05)
            await box.files.remove("/tmp/s/new.txt")
            async with asyncio.timeout(30):
                while ("new.txt", FilesystemEventType.REMOVE) not in seen:
                    await asyncio.sleep(0.05)
            assert seen == [("new.txt", FilesystemEventType.CREATE),
                            ("new.txt", FilesystemEventType.WRITE),
                            ("new.txt", FilesystemEventType.REMOVE)]
            await handle.stop()
            # the sandbox going away ends a watch with an error, not with every file removed
            await box.files.write("/tmp/s/kept.txt", "k")
            ended: list[Exception | None] = []
            seen.clear()
            await box.files.watch_dir("/tmp/s", on_event=lambda e: seen.append(
                (e.name, e.type)), on_exit=ended.append)
            await box.kill()
            async with asyncio.timeout(30):
                while not ended:
                    await asyncio.sleep(0.05)
            assert ended[0] is not None and seen == []
        finally:
            await box.kill()

    asyncio.run(main())
