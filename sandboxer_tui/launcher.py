"""The `sbx` entry point: hands the command to a running `sbx server` when there is one.

Most of an `sbx` command's time is Python importing SQLAlchemy, pydantic and docker-py, not
the work. A resident server (sandboxer_tui/resident.py) imports them once and forks a child
per command; this launcher only connects, passes its argv, environment, working folder and
its own stdin/stdout/stderr, forwards signals and exits with the child's code. It imports
nothing but the standard library. With no server, or one that cannot take the command, the
command runs here as it always did.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
from pathlib import Path

SOCKET_NAME = "server.sock"
PROTOCOL = 1
# Not through the server: the dashboard needs the terminal as its own (job control,
# resizes), and the server commands manage the server itself.
_LOCAL_COMMANDS = {"tui", "server"}


def home() -> Path:
    """The same folder as core.settings.sbx_home(), without importing the core."""
    raw = os.environ.get("SBX_HOME")
    if raw:
        return Path(raw).expanduser()
    from platformdirs import user_data_path

    return user_data_path("sandboxer")


def socket_address(folder: Path) -> str:
    """The socket's path; through /proc/self/fd when the real one is too long for AF_UNIX."""
    path = str(folder / SOCKET_NAME)
    if len(path.encode()) < 100:
        return path
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{fd}/{SOCKET_NAME}"


def send_message(sock: socket.socket, data: dict, fds: list[int] | None = None) -> None:
    body = json.dumps(data).encode()
    frame = struct.pack("!I", len(body)) + body
    if fds:
        socket.send_fds(sock, [frame], fds)
    else:
        sock.sendall(frame)


def read_line(stream) -> dict | None:
    line = stream.readline()
    return json.loads(line) if line else None


def wants_server(args: list[str]) -> bool:
    if os.environ.get("SBX_NO_SERVER"):
        return False
    first = next((a for a in args if not a.startswith("-")), None)
    return bool(args) and first not in _LOCAL_COMMANDS


def through_server(args: list[str]) -> int | None:
    """The command's exit code, or None when no server took it (run it here instead)."""
    folder = home()
    if not (folder / SOCKET_NAME).exists():
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(socket_address(folder))
        request = {
            "protocol": PROTOCOL,
            "executable": sys.executable,
            "argv": args,
            "env": dict(os.environ),
            "cwd": os.getcwd(),
            "umask": _umask(),
        }
        send_message(sock, request, [0, 1, 2])
        replies = sock.makefile("r")
        started = read_line(replies)
    except (OSError, ValueError):
        sock.close()
        return None  # no server (a stale socket), or it went away: run here
    if not started or "pid" not in started:
        sock.close()
        return None  # the server declined (another Python, its code changed): run here
    child = started["pid"]

    def forward(signum, _frame) -> None:
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    try:
        while True:
            try:
                finished = read_line(replies)
                break
            except InterruptedError:
                continue
    except (OSError, ValueError):
        finished = None
    sock.close()
    if not finished or "exit" not in finished:
        print("sbx: the sbx server went away while running the command", file=sys.stderr)
        return 1
    return int(finished["exit"])


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def main() -> None:
    args = sys.argv[1:]
    if wants_server(args):
        code = through_server(args)
        if code is not None:
            sys.exit(code)
    from sandboxer_tui.cli import main as run_here

    run_here(args)


if __name__ == "__main__":
    main()
