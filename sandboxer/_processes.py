"""Background processes in a sandbox, from a program: `box.processes.start(argv)` gives a
handle whose output any client can read again later from an offset (the sandbox keeps the
last 8 MiB of each stream, at least: docs/api.md, "Background processes"). The sync twins
(`Processes`, `Process`) are made from these in `sandboxer._sync`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from sandboxer._records import _time

if TYPE_CHECKING:
    from sandboxer._api import AsyncSandbox, Duration
    from sandboxer._transport import Transport


@dataclass(frozen=True, slots=True)
class ProcessOutput:
    """A piece of a background process's output: `offset` is where its first byte lies in
    its stream since the process started, so a client that reads again from
    `offset + len(data)` misses nothing. An offset past the one asked for means the output
    between is no longer kept (the sandbox keeps the last 8 MiB of each stream, at least)."""

    stream: Literal["stdout", "stderr"]
    offset: int
    data: bytes

    @property
    def end(self) -> int:
        """The offset to read on from."""
        return self.offset + len(self.data)

    def to_dict(self) -> dict[str, Any]:
        from sandboxer._records import output_doc

        return {"stream": self.stream, "offset": self.offset, "data": output_doc(self.data)}


class ProcessRecord:
    """A background process's fields, as of when it was last read. `argv` is as the event
    log keeps it (the sandbox's secret values masked); `env_names` are the names of the
    variables it was given, never their values."""

    __slots__ = ("_view",)

    def __init__(self, view: Mapping[str, Any]) -> None:
        self._view = dict(view)

    def _replace(self, view: Mapping[str, Any]) -> None:
        self._view = dict(view)

    def to_dict(self) -> dict[str, Any]:
        return dict(self._view)

    @property
    def pid(self) -> int:
        """Its process id in the sandbox."""
        return self._view["pid"]

    @property
    def sandbox_id(self) -> str:
        return self._view["sandbox_id"]

    @property
    def argv(self) -> list[str]:
        return list(self._view["argv"])

    @property
    def cwd(self) -> str | None:
        return self._view["cwd"]

    @property
    def user(self) -> str | None:
        return self._view["user"]

    @property
    def env_names(self) -> list[str]:
        return list(self._view["env_names"])

    @property
    def stdin(self) -> bool:
        """Whether it was started with its standard input open for `write`."""
        return bool(self._view["stdin"])

    @property
    def started_at(self) -> datetime:
        return _time(self._view["started_at"])

    @property
    def running(self) -> bool:
        """False once anyone has seen it end (or its sandbox is gone)."""
        return bool(self._view["running"])

    @property
    def exit_code(self) -> int | None:
        """Its exit status (128 + N when signal N ended it); None while it runs, or when how
        it ended is not known (it ended with its sandbox)."""
        return self._view["exit_code"]

    @property
    def ended_at(self) -> datetime | None:
        return _time(self._view["ended_at"])

    def __repr__(self) -> str:
        state = "running" if self.running else f"exit_code={self.exit_code}"
        return f"<{type(self).__name__} {self.pid} {self.argv!r} {state}>"


class AsyncProcesses:
    """`box.processes`: start background processes in the sandbox, and find them again."""

    __slots__ = ("_box",)

    def __init__(self, box: AsyncSandbox) -> None:
        self._box = box

    @property
    def _t(self) -> Transport:
        return self._box._client._transport

    async def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                    cwd: str | None = None, user: str | None = None,
                    stdin: bool = True) -> AsyncProcess:
        """Start `argv` in the background (with `env` added, in `cwd`, as `user`) and return
        at once. With `stdin`, its standard input stays open for `write` until
        `close_stdin`; without, it reads nothing. Starting it is activity, and while it
        runs the reaper does not end the sandbox for being idle."""
        from sandboxer._api import _argv

        view = await self._t.start_process(self._box.id, _argv(argv), env=env, cwd=cwd,
                                           user=user, stdin=bool(stdin))
        return AsyncProcess(self._box, view)

    async def list(self) -> list[AsyncProcess]:
        """Every process started in the sandbox, oldest first, as they are now."""
        return [AsyncProcess(self._box, v) for v in await self._t.list_processes(self._box.id)]

    async def get(self, pid: int) -> AsyncProcess:
        """A process by its pid (NotFound when none was started with it)."""
        return AsyncProcess(self._box, await self._t.get_process(self._box.id, pid))


class AsyncProcess(ProcessRecord):
    """A handle on one background process (any client can make one: `processes.get`)."""

    __slots__ = ("_box",)

    def __init__(self, box: AsyncSandbox, view: Mapping[str, Any]) -> None:
        super().__init__(view)
        self._box = box

    @property
    def _t(self) -> Transport:
        return self._box._client._transport

    async def refresh(self) -> AsyncProcess:
        """Read it again (an end seen now is recorded)."""
        self._replace(await self._t.get_process(self._box.id, self.pid))
        return self

    async def wait(self, timeout: Duration | None = None) -> int | None:
        """Wait for it to end: its exit code (None when how it ended is not known). TimedOut
        (exit 1) when `timeout` passes first; it runs on."""
        from sandboxer._api import _duration

        self._replace(await self._t.wait_process(self._box.id, self.pid,
                                                 _duration(timeout, "timeout")))
        if self.running:
            from sandboxer.core.rules.errors import TimedOut

            raise TimedOut(f"process {self.pid} still runs after {timeout}")
        return self.exit_code

    async def kill(self, signal: int = 9) -> None:
        """Send `signal` (a number or a `signal.Signals`; SIGKILL, 9, by default) to it;
        `wait` then says how it ended (143 after SIGTERM, 137 after SIGKILL)."""
        self._replace(await self._t.signal_process(self._box.id, self.pid, int(signal)))

    async def write(self, data: bytes | str) -> None:
        """Write to its standard input (it must have been started with `stdin=True`)."""
        from sandboxer.core.rules.errors import BadInput

        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, bytes | bytearray):
            raise BadInput("write takes bytes or text")
        await self._t.write_process_stdin(self._box.id, self.pid, bytes(data))

    async def close_stdin(self) -> None:
        """Close its standard input: it reads end-of-file after what was written."""
        await self._t.close_process_stdin(self._box.id, self.pid)

    async def output(self, stdout_offset: int = 0, stderr_offset: int = 0, *,
                     follow: bool = True) -> AsyncIterator[ProcessOutput]:
        """Its output from these offsets on, as it comes; with `follow`, until it has ended
        and all of it was read (then the record says how it ended), else until caught up.
        Read again from each stream's last `end` to resume: nothing is missed that is still
        kept."""
        async for item in self._t.process_output(self._box.id, self.pid,
                                                 stdout_offset=stdout_offset,
                                                 stderr_offset=stderr_offset, follow=follow):
            if "exit" in item:
                self._replace(item["exit"])
                continue
            yield ProcessOutput("stderr" if item["stream"] == "stderr" else "stdout",
                                int(item["offset"]), _data(item["data"]))


def _data(value: Any) -> bytes:
    from sandboxer._records import _bytes

    return _bytes(value)
