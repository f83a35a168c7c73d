"""The unmodified `e2b` SDK's `sandbox.pty` against `sbx serve` on the real Docker engine
(docs/e2b-api.md): a terminal is the library's (`box.pty`), driven by pid as on envd:
create, input, output through `on_data`, resize, connect again, kill."""

from __future__ import annotations

import asyncio

import pytest
from support import RUN_LABEL

pytestmark = pytest.mark.docker

LABEL_KEY, LABEL_VALUE = RUN_LABEL.split("=")
LIMIT_S = 30.0


async def _until(seen: bytearray, text: bytes) -> None:
    """Until `text` is in what the terminal wrote (a generous limit, never a fixed sleep)."""
    async with asyncio.timeout(LIMIT_S):
        while text not in seen:
            await asyncio.sleep(0.05)


def test_a_pty_takes_keystrokes_shows_output_resizes_and_is_killed(e2b_env, live):
    from e2b import AsyncSandbox, CommandExitException, InvalidArgumentException, PtySize

    async def main() -> None:
        box = await AsyncSandbox.create("default", timeout=120,
                                        metadata={LABEL_KEY: LABEL_VALUE})
        try:
            seen = bytearray()
            term = await box.pty.create(PtySize(rows=24, cols=80), on_data=seen.extend,
                                        envs={"WHO": "e2b"})
            assert term.pid > 0
            await box.pty.send_stdin(term.pid, b"echo $((6*7)) $WHO; stty size\r")
            await _until(seen, b"42 e2b")
            await _until(seen, b"24 80")
            await box.pty.resize(term.pid, PtySize(rows=30, cols=100))
            await box.pty.send_stdin(term.pid, b"stty size\r")
            await _until(seen, b"30 100")
            with pytest.raises(InvalidArgumentException, match="bad cols 5000"):
                await box.pty.resize(term.pid, PtySize(rows=0, cols=5000))
            seen.clear()
            await box.pty.send_stdin(term.pid, b"stty size\r")
            await _until(seen, b"30 100")  # the refused size changed nothing
            # input as a stream: a piece reaches the terminal while the stream is open
            async with box.pty.stream_input(term.pid) as stream:
                await stream.send(b"echo ear" + b"ly\r")
                await _until(seen, b"early\r\n")
                await stream.send("echo str" + "eamed\r")
            await _until(seen, b"streamed\r\n")
            assert term.pid in [p.pid for p in await box.commands.list()]
            # another handle on the same terminal reads what is kept of its output
            again = bytearray()
            other = await box.pty.connect(term.pid, on_data=again.extend)
            await _until(again, b"42 e2b")
            await other.disconnect()
            assert await box.pty.kill(term.pid) is True
            with pytest.raises(CommandExitException):
                await term.wait()
            assert await box.pty.kill(term.pid) is False  # ended: not found, as on envd
            assert term.pid not in [p.pid for p in await box.commands.list()]
            # a short-lived program on a pty ends with its own exit code
            out = bytearray()
            ended = await box.pty.create(PtySize(rows=24, cols=80), on_data=out.extend)
            await box.pty.send_stdin(ended.pid, b"exit 0\r")
            assert (await ended.wait()).exit_code == 0
        finally:
            await box.kill()

        return box.sandbox_id

    sandbox_id = asyncio.run(main())
    import sandboxer

    with sandboxer.Sandboxer(home=live.home) as sbx:
        opened = [e for e in sbx.events(sandbox_id) if e.type == "sandbox.pty.opened"]
    assert len(opened) == 2 and {e.actor for e in opened} == {"writer"}
    text = repr([e.to_dict() for e in opened])
    assert "WHO" in text and "'e2b'" not in text  # variable names only, never values
