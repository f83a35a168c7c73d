"""The unmodified `e2b` SDK's async classes (AsyncSandbox) against `sbx serve` on the real
Docker engine (docs/e2b-api.md): the same flows as the sync ones, and pause, resume,
and connecting to a running command (ptys: test_sdk_pty.py)."""

from __future__ import annotations

import asyncio

import pytest
from support import RUN_LABEL

pytestmark = pytest.mark.docker

LABEL_KEY, LABEL_VALUE = RUN_LABEL.split("=")


async def _sandbox(**metadata: str):
    from e2b import AsyncSandbox

    return await AsyncSandbox.create("default", timeout=120,
                                     metadata={LABEL_KEY: LABEL_VALUE, **metadata})


def test_async_commands_files_and_kill(e2b_env):
    from e2b import AsyncSandbox, CommandExitException

    async def main() -> None:
        box = await _sandbox(flavour="async")
        try:
            out: list[str] = []
            result = await box.commands.run("for i in 1 2 3; do echo $i; done",
                                            on_stdout=out.append)
            assert result.stdout == "1\n2\n3\n" and "".join(out) == "1\n2\n3\n"
            with pytest.raises(CommandExitException) as failed:
                await box.commands.run("exit 7")
            assert failed.value.exit_code == 7
            handle = await box.commands.run("sleep 300", background=True)
            assert await handle.kill() is True
            with pytest.raises(CommandExitException):
                await handle.wait()
            payload = bytes(range(256)) * 64
            await box.files.write("/tmp/d/blob.bin", payload)
            assert await box.files.read("/tmp/d/blob.bin", format="bytes") == payload
            assert [e.name for e in await box.files.list("/tmp/d")] == ["blob.bin"]
            await box.files.remove("/tmp/d/blob.bin")
            assert not await box.files.exists("/tmp/d/blob.bin")
            found = await AsyncSandbox.list().next_items()
            assert [s.sandbox_id for s in found] == [box.sandbox_id]
        finally:
            assert await box.kill() is True
        assert await AsyncSandbox.list().next_items() == []

    asyncio.run(main())


def test_async_pause_resume_and_connect_to_a_command(e2b_env, live):
    from e2b import AsyncSandbox

    async def main() -> None:
        box = await _sandbox()
        try:
            handle = await box.commands.run("read x; echo after $x", background=True,
                                            stdin=True)
            again = await box.commands.connect(handle.pid)
            await box.commands.send_stdin(handle.pid, "resume\n")
            assert (await again.wait()).stdout.endswith("after resume\n")
            await box.pause()
            assert (await box.get_info()).state.value == "paused"
            resumed = await AsyncSandbox.connect(box.sandbox_id)
            assert (await resumed.get_info()).state.value == "running"
            assert (await resumed.commands.run("echo back")).stdout == "back\n"
        finally:
            await box.kill()

    asyncio.run(main())
