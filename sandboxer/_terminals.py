"""A terminal in a sandbox, from a program: `box.pty()` starts a program (a login shell by
default) on a pseudo-terminal; write keystrokes, read its output, resize it, close it
(docs/terminals-and-ports.md, "Terminals"). The sync twin (`Terminal`) is made from this in
`sandboxer._sync`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandboxer._api import AsyncSandbox
    from sandboxer._transport import Transport


class AsyncTerminal:
    """One terminal session. Output has offsets from the session's start: `offset` is that
    of the next byte `read` gives. Whoever holds the session's `id` can come back to it
    (`box.terminal(id, offset)`, or `attach(offset)` after a dropped connection): the last
    `SBX_TERMINAL_REPLAY` (1 MiB) of output is kept for that. `async with` closes it."""

    def __init__(self, box: AsyncSandbox, view: Mapping[str, Any], offset: int = 0) -> None:
        self._box = box
        self._view = dict(view)
        self.offset = offset
        self._items: AsyncIterator[dict[str, Any]] | None = None
        self._ended = False

    @property
    def _t(self) -> Transport:
        return self._box._client._transport

    @property
    def id(self) -> str:
        """The session's id (another client attaches with it)."""
        return self._view["id"]

    @property
    def sandbox_id(self) -> str:
        return self._view["sandbox_id"]

    @property
    def argv(self) -> list[str]:
        return list(self._view["argv"])

    @property
    def exit_code(self) -> int | None:
        """The program's exit status once it ended (None before, or when not known)."""
        return self._view.get("exit_code")

    @property
    def running(self) -> bool:
        return not self._ended and bool(self._view.get("running", True))

    def to_dict(self) -> dict[str, Any]:
        """The session as last read from the sbx it runs in: its "offset" is how much output
        it had written then, "kept_from" the oldest byte still kept (this handle's own
        position is `offset`, the attribute)."""
        return dict(self._view)

    async def read(self) -> bytes:
        """The next output, as soon as there is some; b"" once the program ended and all of
        its output was read (then `exit_code` says how it ended)."""
        if self._ended:
            return b""
        if self._items is None:
            self._items = self._t.pty_output(self._box.id, self.id, self.offset)
        try:
            item = await self._items.__anext__()
        except StopAsyncIteration:
            item = {"exit": self.exit_code}
        if "exit" in item:
            self._ended = True
            self._view.update(running=False, exit_code=item["exit"])
            await self._drop_stream()
            return b""
        data = item["data"]
        self.offset = int(item["offset"]) + len(data)
        return data

    def __aiter__(self) -> AsyncTerminal:
        return self

    async def __anext__(self) -> bytes:
        data = await self.read()
        if not data:
            raise StopAsyncIteration
        return data

    async def write(self, data: bytes | str) -> None:
        """Keystrokes, as a terminal sends them (text is sent as UTF-8; Enter is a carriage
        return)."""
        from sandboxer.core.rules.errors import BadInput

        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, bytes | bytearray):
            raise BadInput("a terminal takes bytes or text")
        await self._t.write_pty(self._box.id, self.id, bytes(data))

    async def resize(self, cols: int, rows: int) -> None:
        """The terminal's new size: the program sees SIGWINCH (`stty size` changes)."""
        await self._t.resize_pty(self._box.id, self.id, cols, rows)
        self._view.update(cols=cols, rows=rows)

    async def close(self) -> None:
        """End the program (its terminal hangs up); idempotent."""
        if not self._ended:
            await self._t.close_pty(self._box.id, self.id)

    async def wait(self) -> int | None:
        """Read (and drop) its output until the program ends: its exit code."""
        while await self.read():
            pass
        return self.exit_code

    async def attach(self, offset: int | None = None) -> None:
        """Read again from `offset` (where this handle had read to, by default) on a new
        connection: after a dropped one, nothing still kept is missed. Output older than
        the oldest kept byte is gone: `read` goes on from that byte (`offset` jumps)."""
        await self._drop_stream()
        if offset is not None:
            self.offset = offset
        self._ended = False

    async def _drop_stream(self) -> None:
        items, self._items = self._items, None
        if items is not None and hasattr(items, "aclose"):
            await items.aclose()

    async def __aenter__(self) -> AsyncTerminal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
        await self._drop_stream()

    def __repr__(self) -> str:
        state = "running" if self.running else f"exit_code={self.exit_code}"
        return f"<{type(self).__name__} {self.id} {self.argv!r} {state}>"
