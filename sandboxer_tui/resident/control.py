"""Starting, stopping and asking the resident server of a state folder (`sbx server
start|stop|status`, and the start on first use with SBX_SERVER_AUTOSTART=1): the client side
of sandboxer_tui/resident/resident.py, which it runs as a detached process."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from sandboxer.core.rules.settings import open_state_file, sbx_home
from sandboxer_tui.resident.launcher import (
    SOCKET_NAME,
    autostart_idle_s,
    home,
    peer_uid_pid,
    private_folder,
    send_request,
    socket_address,
)

PID_FILE = "server.pid"
LOG_FILE = "server.log"
LOCK_FILE = "server.lock"  # held by the one server of a folder


def server_folder() -> Path:
    """The state folder (the core's rule, which the launcher follows), checked: the server
    neither lives in, nor is looked for in, a folder another user can write to."""
    return sbx_home()


def query_status(folder: Path) -> dict[str, Any] | None:
    """The running server's status, or None when none answers. Only a listener of this user
    counts, and only with its own process id (SO_PEERCRED's): `stop` signals that pid."""
    if not (folder / SOCKET_NAME).exists():
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        try:
            sock.connect(socket_address(folder))
            uid, pid = peer_uid_pid(sock)
            if uid != os.geteuid():
                return None
            send_request(sock, {"op": "status"})
            line = sock.makefile("r").readline()
        except OSError:
            return None
    word, _, payload = line.partition(" ")
    try:
        status = json.loads(payload) if word == "status" else None
    except ValueError:
        return None
    return status if isinstance(status, dict) and status.get("pid") == pid else None


def spawn(folder: Path, idle_s: float | None) -> Path:
    """A detached server for `folder`, started without waiting for it; its log's path."""
    import subprocess

    log = folder / LOG_FILE
    with os.fdopen(open_state_file(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as out:
        os.fchmod(out.fileno(), 0o600)
        subprocess.Popen(
            [sys.executable, "-m", "sandboxer_tui.resident.resident", "" if idle_s is None else str(idle_s)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
            cwd="/", close_fds=True)
    return log


def start(idle_s: float | None = None, wait_s: float = 30.0) -> tuple[dict[str, Any], bool]:
    """Start a detached server unless one answers. Returns its status and whether it is new."""
    folder = server_folder()
    running = query_status(folder)
    if running and "pid" in running:
        return running, False
    if os.path.islink(folder / PID_FILE):  # the server would refuse it: say so here, at once
        os.close(open_state_file(folder / PID_FILE, os.O_RDONLY))
    log = spawn(folder, idle_s)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(0.05)
        status = query_status(folder)
        if status and "pid" in status:
            return status, True
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
    raise RuntimeError(f"the sbx server did not start within {wait_s:.0f} s: {tail[0]} (see {log})")


def stop(wait_s: float = 30.0) -> dict[str, Any] | None:
    """Stop the server (running commands finish first). None when none was running."""
    folder = server_folder()
    status = query_status(folder)
    if not status or "pid" not in status:
        return None
    os.kill(status["pid"], signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and (folder / SOCKET_NAME).exists():
        time.sleep(0.05)
    return status


def autostart() -> None:
    """Start a server for this folder, not waiting for it, unless one listens there. It
    takes the next command; this one runs here. Two first commands at once start one
    server: the second leaves at once (resident.run's lock)."""
    folder = home()
    if not private_folder(folder):
        return  # no folder yet (the command makes it), or one the core refuses
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(socket_address(folder))
        return  # a server listens: it declined this command (another Python, new code)
    except OSError:
        pass
    finally:
        probe.close()
    try:
        spawn(Path(folder), autostart_idle_s())
    except Exception:  # noqa: BLE001 (a server is an accelerator: never fail a command for it)
        pass
