"""Who is at the other end of a Unix socket (SO_PEERCRED, Linux): a client checks it before
it sends anything there, since whoever could bind the path first gets what is sent.

It imports only modules built into the interpreter; the remote client (sandboxer/_remote.py)
uses it. The `sbx` launcher (sandboxer_tui/resident/launcher.py) writes the same rule out:
importing this module imports the library, which the launcher must not."""

from __future__ import annotations

import _socket
import sys


def peer_uid_pid(sock) -> tuple[int, int]:
    """The uid and pid of the process at the other end of a Unix socket (SO_PEERCRED)."""
    cred = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # pid, uid, gid
    return (int.from_bytes(cred[4:8], sys.byteorder),
            int.from_bytes(cred[0:4], sys.byteorder, signed=True))
