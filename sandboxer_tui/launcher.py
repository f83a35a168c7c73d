"""The `sbx` entry point: hands the command to a running `sbx server` when there is one.

Most of an `sbx` command's time is Python importing SQLAlchemy, pydantic and docker-py, not
the work. A resident server (sandboxer_tui/resident.py) imports them once and forks a child
per command; this launcher only connects, passes its argv, environment, working folder and
its own stdin/stdout/stderr, forwards signals and exits with the child's code. With no
server, or one that cannot take the command, the command runs here as it always did.

Every millisecond here is paid by every command, so this file imports only modules built
into the interpreter (`_socket`, `_signal`, `marshal`): not `socket`, `signal` or `json`,
which pull in `enum` and `re`, nor `pathlib`.

The protocol: the request is a 4-byte big-endian length and a `marshal`led dict, with the
caller's fds 0, 1 and 2 attached (SCM_RIGHTS). Replies are text lines: `pid N` when a child
took the command, then `exit N`; or `declined REASON` (run it here instead).
"""

from __future__ import annotations

import _signal
import _socket
import marshal
import os
import sys

SOCKET_NAME = "server.sock"
PROTOCOL = 2
APP_NAME = "sandboxer"
# Not through the server: the dashboard needs the terminal as its own (job control,
# resizes), and the server commands manage the server itself.
_LOCAL_COMMANDS = {"tui", "server"}


def home() -> str:
    """The folder core.settings.sbx_home() names, without importing the core.

    Where every platformdirs release agrees (Linux, XDG_DATA_HOME absolute or empty, HOME
    absolute), its rule is written out here to spare its import; anything else is left to
    it. tests/test_resident_server.py checks that this, and launcher.c's copy, agree with
    the core."""
    raw = os.environ.get("SBX_HOME")
    if raw:
        return os.path.expanduser(raw)
    if sys.platform == "linux" and "ANDROID_DATA" not in os.environ:
        data = os.environ.get("XDG_DATA_HOME", "")
        user = os.environ.get("HOME", "")
        if data.startswith("/"):
            return os.path.join(data, APP_NAME)
        if not data and user.startswith("/"):
            return os.path.join(os.path.expanduser("~/.local/share"), APP_NAME)
    from platformdirs import user_data_dir

    return user_data_dir(APP_NAME)


def socket_address(folder: str) -> str:
    """The socket's path; through /proc/self/fd when the real one is too long for AF_UNIX."""
    path = os.path.join(folder, SOCKET_NAME)
    if len(path.encode()) < 100:
        return path
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{fd}/{SOCKET_NAME}"


def frame(data: dict) -> bytes:
    body = marshal.dumps(data)
    return len(body).to_bytes(4, "big") + body


def send_request(sock, data: dict, fds: list[int] | None = None) -> None:
    body = frame(data)
    if fds:
        rights = b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)
        sent = sock.sendmsg([body], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
        body = body[sent:]  # a large environment may not go in one write
    if body:  # sendall(b"") still writes: after a quick command's end, EPIPE, and a rerun
        sock.sendall(body)


class _Lines:
    """Reply lines from the server; None at end of stream."""

    def __init__(self, sock) -> None:
        self.sock, self.buffer = sock, b""

    def next(self) -> tuple[str, str] | None:
        while b"\n" not in self.buffer:
            try:
                chunk = self.sock.recv(4096)
            except InterruptedError:
                continue
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        word, _, rest = line.decode().partition(" ")
        return word, rest


def wants_server(args: list[str]) -> bool:
    if os.environ.get("SBX_NO_SERVER"):
        return False
    first = next((a for a in args if not a.startswith("-")), None)
    return bool(args) and first not in _LOCAL_COMMANDS


def through_server(args: list[str]) -> int | None:
    """The command's exit code, or None when no server took it (run it here instead)."""
    folder = home()
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
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
        send_request(sock, request, [0, 1, 2])
        replies = _Lines(sock)
        started = replies.next()
    except (OSError, ValueError):
        sock.close()
        return None  # no server (no socket, a stale one), or it went away: run here
    if not started or started[0] != "pid":
        sock.close()
        return None  # the server declined (another Python, its code changed): run here
    child = int(started[1])

    def forward(signum, _frame) -> None:
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP):
        if _signal.getsignal(signum) != _signal.SIG_IGN:  # nohup, a background job: stays so
            _signal.signal(signum, forward)
    try:
        finished = replies.next()
    except OSError:
        finished = None
    sock.close()
    if not finished or finished[0] != "exit":
        print("sbx: the sbx server went away while running the command", file=sys.stderr)
        return 1
    return int(finished[1])


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def main() -> None:
    args = sys.argv[1:]
    if wants_server(args):
        code = through_server(args)
        if code is not None:
            sys.stderr.flush()
            os._exit(code)  # skips the interpreter's teardown (~3 ms): nothing here needs it
    run_here(args)


def run_here(args: list[str]) -> None:
    """The command in this process: what main() falls back to, and what the compiled launcher
    (launcher.c) execs Python for when no server takes the command."""
    from sandboxer_tui.cli import main as run_cli

    run_cli(args)


if __name__ == "__main__":
    main()
