"""The library as a user's program would use it, with the types written out: the sync client
and the async one, each making a sandbox, running commands, extending and destroying it,
listing, and taking and restoring a checkpoint.

tests/api/test_typing.py type-checks this file with mypy --strict (so every annotation here
must be what the library says it returns) and runs it on the Docker engine (so it is also
what the library does)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

import sandboxer


def with_the_sync_api(sbx: sandboxer.Sandboxer, labels: Mapping[str, str]) -> list[str]:
    """What a script does; returns the lines it printed."""
    said: list[str] = []
    with sbx.create("default", ttl="10m", labels=labels, task="typed example") as box:
        made: sandboxer.Sandbox = box
        state: sandboxer.State = made.state
        said.append(f"{made.id} is {state.value}")
        result: sandboxer.ExecResult = box.exec(["sh", "-c", "echo hello > /tmp/mark; cat /tmp/mark"])
        said.append(result.stdout.decode().strip())
        capped: bool = box.extend(timedelta(minutes=5))
        left: timedelta | None = box.ttl_left
        said.append(f"capped={capped} left={left is not None}")
        for item in box.exec_stream(["echo", "streamed"]):
            if isinstance(item, sandboxer.OutputChunk):
                said.append(item.data.decode().strip())
            else:
                exit_code: int = item.exit_code
                said.append(f"exit {exit_code}")
        boxes: list[sandboxer.Sandbox] = sbx.list(labels=labels)
        said.append(f"listed {len(boxes)}")
        checkpoint: sandboxer.Checkpoint = box.snapshot()
        taken: list[sandboxer.Checkpoint] = box.checkpoints()
        said.append(f"checkpoints {len(taken)}")
        restored: sandboxer.Sandbox = checkpoint.restore(ttl="5m", labels=labels)
        said.append(restored.exec(["cat", "/tmp/mark"]).stdout.decode().strip())
        destroyed_now: bool = restored.destroy()
        said.append(f"destroyed {destroyed_now}, again {restored.destroy()}")
        checkpoint.remove()
    try:
        sbx.get(box.id).exec(["true"])
    except sandboxer.Conflict as exc:  # destroyed on leaving the `with`
        said.append(f"refused: {type(exc).__name__}")
    events: list[sandboxer.Event] = sbx.events(box.id)
    said.append(f"first event {events[0].type}")
    return said


async def with_the_async_api(sbx: sandboxer.AsyncSandboxer,
                             labels: Mapping[str, str]) -> list[str]:
    """What an async program does; returns the lines it printed."""
    said: list[str] = []
    box: sandboxer.AsyncSandbox = await sbx.create("default", ttl="10m", labels=labels)
    try:
        result: sandboxer.ExecResult = await box.exec(["sh", "-c", "echo hello > /tmp/mark"])
        said.append(f"exit {result.exit_code}")
        capped: bool = await box.extend("5m")
        said.append(f"capped={capped}")
        boxes: list[sandboxer.AsyncSandbox] = await sbx.list(labels=labels)
        said.append(f"listed {len(boxes)}")
        checkpoint: sandboxer.AsyncCheckpoint = await box.snapshot()
        forks: list[sandboxer.AsyncSandbox] = await checkpoint.fork(2, labels=labels)
        for fork in forks:
            said.append((await fork.exec(["cat", "/tmp/mark"])).stdout.decode().strip())
            await fork.destroy()
        await checkpoint.remove()
    finally:
        destroyed_now: bool = await box.destroy()
        said.append(f"destroyed {destroyed_now}")
    async with sbx.create("default", ttl="1m", labels=labels) as short:
        said.append(f"{short.backend} {short.state.value}")
    return said
