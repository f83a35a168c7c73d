"""How `sbx` hands a command to a running `sbx server` (sandboxer_tui/__main__.py is the entry).

Most of an `sbx` command's time is Python importing SQLAlchemy, pydantic and docker-py, not
the work. A resident server (sandboxer_tui/resident/resident.py) imports them once and forks a
child per command; this launcher only connects, passes its argv, environment, working folder
and its own stdin/stdout/stderr, forwards signals and exits with the child's code. With no
server, or one that cannot take the command, the command runs here as it always did: that is
what `sbx` does by default (a server runs only when started with `sbx server start`, or on
first use with SBX_SERVER_AUTOSTART=1).

Every millisecond here is paid by every command, so this file imports only modules built
into the interpreter (`_socket`, `_signal`, `marshal`): not `socket`, `signal` or `json`,
which pull in `enum` and `re`, nor `pathlib`, nor anything of `sandboxer` (importing the
library takes about 140 ms).

The protocol: the request is a 4-byte big-endian length and a `marshal`led dict. Replies
are text lines: `pid N` when a child took the command, then `exit N`; or `declined REASON`
(run it here instead). Only after `pid` does the launcher send the caller's fds 0, 1 and 2
(SCM_RIGHTS, on one byte), which the child waits for before it runs anything: fds in flight
to a server that never reads them would hold the caller's stdout open after the launcher
gave up on it, and a child whose caller has gone (no fds, only the end of the stream) runs
nothing, so a command the launcher ran itself never runs twice.

What goes to the server is every variable of the caller's environment and its terminal, so
it goes only to a server of this user, in a folder of this user that no one else can write
to: a folder that is not such (`private_folder`) is left to the core, which refuses it with
one line, and a listener of another uid (SO_PEERCRED) gets nothing; the command runs here.
A server that does not answer `pid` within ANSWER_WITHIN_S is given up on, and the command
runs here.
"""

from __future__ import annotations

import _signal
import _socket
import marshal
import os
import sys

SOCKET_NAME = "server.sock"
PROTOCOL = 3
ANSWER_WITHIN_S = 5  # a server answers `pid` within milliseconds; one that has not is stuck
# ExitCode.FAILED (sandboxer.core.rules.errors), written out: importing it imports the library
FAILED = 1
APP_NAME = "sandboxer"
# Not through the server: the dashboard and `sbx shell` need the terminal as their own (job
# control, resizes), the server commands manage the server itself, and `sbx serve` is a
# long-running service of its own, never a child of the server; so is `sbx mcp`, whose
# stdin and stdout are the agent's MCP channel.
LOCAL_COMMANDS = {"tui", "shell", "server", "serve", "mcp"}
# The root options that take a value: the word after one is not the command.
_OPTIONS_WITH_A_VALUE = {"--url"}


def peer_uid_pid(sock) -> tuple[int, int]:
    """The uid and pid of the process at the other end of a Unix socket (SO_PEERCRED).
    sandboxer.core.rules.peercred's rule, written out here: importing it would import the
    library."""
    cred = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # pid, uid, gid
    return (int.from_bytes(cred[4:8], sys.byteorder),
            int.from_bytes(cred[0:4], sys.byteorder, signed=True))


def home() -> str:
    """The folder sandboxer.core.rules.settings.sbx_home() names, without importing the core.

    Where every platformdirs release agrees (Linux, XDG_DATA_HOME absolute or empty, HOME
    absolute), its rule is written out here to spare its import; anything else is left to
    it. tests/cli/test_resident_server.py checks that the two agree."""
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


def private_folder(folder: str) -> bool:
    """Whether `folder` is a folder of this user that group and others cannot write to:
    the core's rule for the state folder (sandboxer.adapters.base.state_folder_problem),
    written out here to spare its import. False when it does not exist: then no server runs
    there."""
    try:
        st = os.stat(folder)
    except (OSError, ValueError):
        return False
    return (st.st_mode & 0o170000 == 0o040000 and st.st_uid == os.geteuid()
            and not st.st_mode & 0o022)


def reply_number(text: str, low: int, high: int) -> int | None:
    """A reply's number: an optional `-` and ASCII digits, nothing else, in range; None if it
    is not one."""
    digits = text[1:] if text[:1] == "-" else text
    if not (digits.isascii() and digits.isdigit()):
        return None
    value = int(text)
    return value if low <= value <= high else None


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


def send_request(sock, data: dict) -> None:
    sock.sendall(frame(data))


def send_fds(sock, fds: list[int]) -> None:
    """`fds` on one byte (a stream socket carries SCM_RIGHTS only with data)."""
    rights = b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)
    sock.sendmsg([b"\0"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])


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
        word, _, rest = line.decode(errors="replace").partition(" ")
        return word, rest


def command_word(args: list[str]) -> str | None:
    """The command's first word (`ls` of `sbx --url URL ls -a`), None when there is none."""
    words = iter(args)
    for arg in words:
        if arg in _OPTIONS_WITH_A_VALUE:
            next(words, None)
        elif not arg.startswith("-"):
            return arg
    return None


def wants_server(args: list[str]) -> bool:
    if os.environ.get("SBX_NO_SERVER"):
        return False
    return bool(args) and command_word(args) not in LOCAL_COMMANDS


def through_server(args: list[str]) -> int | None:
    """The command's exit code, or None when no server took it (run it here instead)."""
    folder = home()
    if not private_folder(folder):
        return None  # none yet (so no server), or one the core refuses, saying why
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(ANSWER_WITHIN_S)
        sock.connect(socket_address(folder))
        if peer_uid_pid(sock)[0] != os.geteuid():
            sock.close()
            return None  # another user's listener: it gets nothing
        request = {
            "protocol": PROTOCOL,
            "executable": sys.executable,
            "argv": args,
            "env": dict(os.environ),
            "cwd": os.getcwd(),
            "umask": _umask(),
        }
        send_request(sock, request)
        replies = _Lines(sock)
        started = replies.next()
    except TimeoutError:
        sock.close()
        print(f"sbx: the sbx server did not answer within {ANSWER_WITHIN_S} s; running the "
              "command here", file=sys.stderr)
        return None
    except (OSError, ValueError):
        sock.close()
        return None  # no server (no socket, a stale one), or it went away: run here
    if not started or started[0] != "pid":
        sock.close()
        return None  # the server declined (another Python, its code changed): run here
    child = reply_number(started[1], 1, 2**31 - 1)
    if child is None:  # never 0 or -1: a signal forwarded there reaches a process group
        sock.close()
        print("sbx: the sbx server answered with no process id", file=sys.stderr)
        return FAILED
    sock.settimeout(None)  # the command takes as long as it takes
    try:
        send_fds(sock, [0, 1, 2])
    except OSError:
        pass  # it has gone: the missing `exit` says so below

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
    except (OSError, ValueError):
        finished = None
    sock.close()
    if not finished or finished[0] != "exit":
        print("sbx: the sbx server went away while running the command", file=sys.stderr)
        return FAILED
    code = reply_number(finished[1], -(2**31), 2**31 - 1)
    if code is None:
        print("sbx: the sbx server answered with no exit code", file=sys.stderr)
        return FAILED
    return code


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


# A server started on first use exits after this long without a command (SBX_SERVER_IDLE).
AUTOSTART_IDLE = "15m"


def autostart_idle_s() -> float | None:
    """How long a server started on first use waits for commands; None: start none. Off
    unless SBX_SERVER_AUTOSTART=1 (or yes, on, true): a process that stays behind, holding
    the database open and receiving every command's environment, is started only when asked
    for."""
    if os.environ.get("SBX_SERVER_AUTOSTART", "").strip().lower() not in ("1", "yes", "on",
                                                                          "true"):
        return None
    from sandboxer.core.rules.durations import parse_duration
    from sandboxer.core.rules.errors import BadInput

    try:
        return parse_duration(os.environ.get("SBX_SERVER_IDLE") or AUTOSTART_IDLE,
                              "SBX_SERVER_IDLE").total_seconds()
    except BadInput:
        return None  # the command itself does not depend on it: it just runs here


def is_remote(args: list[str]) -> bool:
    """Whether the command is a client of an sbx service (SBX_URL, or --url): it keeps
    nothing in the local state folder, so no server is started for it."""
    word = command_word(args)
    root = args[:args.index(word)] if word is not None else args  # sbx's own options
    return bool(os.environ.get("SBX_URL", "").strip()) or any(
        arg == "--url" or arg.startswith("--url=") for arg in root)
