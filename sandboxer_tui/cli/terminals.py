"""`sbx shell ID [-- ARGV]`: an interactive terminal in a sandbox, through the library (so
in process, or through the service under SBX_URL alike; docs/terminals-and-ports.md).

This terminal goes into raw mode while the session runs (every key goes to the program,
Ctrl-C included), its size follows this terminal's (SIGWINCH becomes a resize), and it is
restored on the way out whatever happens; `sbx shell` exits with the program's exit code."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

import click

from sandboxer_tui.cli.output import command

STDIN_PIECE = 4096


@click.command("shell", context_settings={"ignore_unknown_options": True})
@click.argument("sandbox_id", metavar="ID")
@click.argument("argv", nargs=-1, type=click.UNPROCESSED, metavar="[-- ARGV...]")
@command
def shell_command(sandbox_id: str, argv: tuple[str, ...]) -> None:
    """An interactive terminal in sandbox ID: a login shell (bash if it has one, else sh),
    or ARGV after `--`. Exits with the program's exit code. Works through SBX_URL too."""
    code = asyncio.run(_ended_by_signals(_shell(sandbox_id, list(argv) or None)))
    sys.stdout.flush()
    sys.exit(code if code is not None else 1)


async def _ended_by_signals(run):
    """`run` (a coroutine), cancelled by SIGHUP (this terminal went away) or SIGTERM, which
    then end the program in the sandbox too (it would run on, with nobody at its terminal):
    128 + the signal's number."""
    import signal

    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(run)
    got: list[int] = []

    def stop(signum: int) -> None:
        got.append(signum)
        task.cancel()

    for signum in (signal.SIGHUP, signal.SIGTERM):
        loop.add_signal_handler(signum, stop, signum)
    try:
        return await task
    except asyncio.CancelledError:
        if not got:
            raise
        return 128 + got[0]
    finally:
        for signum in (signal.SIGHUP, signal.SIGTERM):
            loop.remove_signal_handler(signum)


def _size(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
        return max(1, size.columns), max(1, size.lines)
    except OSError:
        return 80, 24


async def _shell(sandbox_id: str, argv: list[str] | None) -> int | None:
    from sandboxer_tui.cli.clients import async_client

    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    tty_fd = stdin if os.isatty(stdin) else (stdout if os.isatty(stdout) else None)
    cols, rows = _size(tty_fd) if tty_fd is not None else (80, 24)
    async with async_client() as sbx:
        box = await sbx.get(sandbox_id)
        term = await box.pty(argv, cols=cols, rows=rows)  # refused here: one line, exit 4
        try:
            with _raw(stdin):
                await _relay(term, stdin, stdout, tty_fd)
        finally:
            with contextlib.suppress(Exception):
                await term.close()
        return term.exit_code


@contextlib.contextmanager
def _raw(fd: int):
    """This terminal in raw mode (when it is one), as it was again on the way out."""
    if not os.isatty(fd):
        yield
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSAFLUSH, saved)


async def _relay(term, stdin: int, stdout: int, tty_fd: int | None) -> None:
    """Keys in, output out, resizes, until the program ends."""
    import signal

    loop = asyncio.get_running_loop()
    keys: asyncio.Queue[bytes] = asyncio.Queue()

    def readable() -> None:
        try:
            data = os.read(stdin, STDIN_PIECE)
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(stdin)
        keys.put_nowait(data)

    async def typing() -> None:
        while data := await keys.get():
            await term.write(data)
        if tty_fd is None or not os.isatty(stdin):
            await term.write(b"\x04")  # piped input ended: end-of-file to the program
        else:
            await term.close()  # this terminal hung up

    async def read_in_thread() -> None:  # a file on stdin: no reader for it on the loop
        while data := await asyncio.to_thread(os.read, stdin, STDIN_PIECE):
            keys.put_nowait(data)
        keys.put_nowait(b"")

    async def resized() -> None:
        with contextlib.suppress(Exception):  # the program ended meanwhile
            await term.resize(*_size(tty_fd))

    feeder = None
    try:
        loop.add_reader(stdin, readable)
    except (OSError, ValueError):
        feeder = loop.create_task(read_in_thread())
    if tty_fd is not None:
        resizes: set[asyncio.Task[None]] = set()  # held: the loop keeps weak references

        def on_winch() -> None:
            task = loop.create_task(resized())
            resizes.add(task)
            task.add_done_callback(resizes.discard)

        loop.add_signal_handler(signal.SIGWINCH, on_winch)
    typist = loop.create_task(typing())
    try:
        async for chunk in term:
            view = memoryview(chunk)
            while view:
                written = os.write(stdout, view)
                view = view[written:]
    finally:
        loop.remove_reader(stdin)
        if tty_fd is not None:
            loop.remove_signal_handler(signal.SIGWINCH)
        for task in (typist, feeder):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
