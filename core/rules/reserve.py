"""Room to end sandboxes on a full disk: a reserve file beside the SQLite database.

A full disk stops SQLite from writing, and even from reading (every connection sizes the
`-shm` file beside the database). Yet ending sandboxes is what frees the disk, and a
sandbox left running because its destroy could not be recorded costs more than any write.
So sbx keeps `sbx.db.reserve` (RESERVE_BYTES, allocated, not sparse) on the database's own
filesystem:

- a create is refused (DiskFull, exit 5, nothing written) when the filesystem has less than
  LOW_WATER_BYTES free, or the reserve is missing and cannot be made;
- a destroy or a reap with less than LOW_WATER_BYTES free deletes the reserve first, and a
  write of theirs that still fails for want of space deletes it and tries once more;
- whatever opens the database makes the reserve again once there is room for it and
  LOW_WATER_BYTES more.

Standard library only: the reaper calls make_room() before it reads anything.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

RESERVE_BYTES = 8 * 1024 * 1024  # a reap's worth of WAL and events for hundreds of sandboxes
LOW_WATER_BYTES = 1024 * 1024
SQLITE_PREFIX = "sqlite:///"


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite URL; None for any other database (or in memory)."""
    if not url.startswith(SQLITE_PREFIX):
        return None
    path = url[len(SQLITE_PREFIX):].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def reserve_of(database: Path) -> Path:
    return database.with_name(database.name + ".reserve")


def free_bytes(folder: Path) -> int | None:
    """Bytes an unprivileged writer may still use on `folder`'s filesystem; None if unknown."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def out_of_space(folder: Path) -> bool:
    free = free_bytes(folder)
    return free is not None and free < LOW_WATER_BYTES


def keep(database: Path) -> bool:
    """Make sure the reserve is there. False when it is not for want of room; True when it
    is, or cannot be for another reason (a folder sbx may not write in fails the command
    that writes, with its own error)."""
    reserve = reserve_of(database)
    try:
        if reserve.stat().st_size >= RESERVE_BYTES:
            return True
    except FileNotFoundError:
        pass
    except OSError:
        return True
    free = free_bytes(database.parent)
    if free is not None and free < RESERVE_BYTES + LOW_WATER_BYTES:
        return False
    scratch = reserve.with_name(f".{reserve.name}.{os.getpid()}")
    try:
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            _allocate(fd)
        finally:
            os.close(fd)
        os.replace(scratch, reserve)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(scratch)
        return exc.errno not in (errno.ENOSPC, errno.EDQUOT)
    return True


def _allocate(fd: int) -> None:
    """RESERVE_BYTES of real blocks, not a hole."""
    try:
        os.posix_fallocate(fd, 0, RESERVE_BYTES)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
        chunk = b"\0" * (1024 * 1024)
        for _ in range(RESERVE_BYTES // len(chunk)):
            os.write(fd, chunk)
        os.fsync(fd)


def release(database: Path) -> bool:
    """Delete the reserve; whether there was one to delete."""
    try:
        os.unlink(reserve_of(database))
    except OSError:
        return False
    return True


def make_room(url: str) -> bool:
    """For a command that ends sandboxes: release the reserve when the database's
    filesystem is nearly full. Whether it did."""
    database = sqlite_file(url)
    if database is None or not out_of_space(database.parent):
        return False
    return release(database)
