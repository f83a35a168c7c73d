"""The event log's anchor: the chain's head, kept outside the table.

A hash chain shows a changed or removed row, but not rows cut from its end. So the newest
(id, hash) is also written to a file beside the database after each commit, and `verify`
notices a log that ends before the anchor or disagrees with it.

The file is one record, `id hash` padded to a fixed width, overwritten in place under an
exclusive `flock` (readers take a shared one): an overwrite needs no new room, so the only
write that can fail for want of space is the one that first makes the file, and that one
happens before the commit (docs/design.md, "The event chain and its anchor").
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
import time
from pathlib import Path

HEAD_KEY = "sbx_event_head"  # where an append leaves its (id, hash) on the connection
WIDTH = 128  # bytes of a record: a 20-digit id, a space, a SHA-256 in hex, room to spare
_OPEN = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a link or a FIFO planted is not used
LOCK_WAIT_S = 0.5  # a lock held longer (a reader stopped with ^Z): go on without it


def _record(head: tuple[int, str] | None) -> bytes:
    text = "" if head is None else f"{head[0]} {head[1]}"
    if len(text) >= WIDTH:
        raise ValueError(f"an anchor record holds {WIDTH - 1} characters: {text[:40]}...")
    return (text.ljust(WIDTH - 1) + "\n").encode()


def _locked(fd: int, kind: int) -> bool:
    """`flock(kind)` within LOCK_WAIT_S; False when another holds it that long."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)


def _parse(data: bytes) -> tuple[int, str] | None:
    try:
        id_text, hash_text = data.decode().split()
        return int(id_text), hash_text
    except ValueError:  # blank (made, never moved), or not an anchor at all
        return None


def _open_regular(path: Path, flags: int) -> int | None:
    """The anchor if it is a regular file of this user's with no other name (a hard link
    planted there would have the overwrite land in the file it names)."""
    try:
        fd = os.open(path, flags | _OPEN)
    except OSError:
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid != os.geteuid():
        os.close(fd)
        return None
    return fd


def read_anchor(path: Path) -> tuple[int, str] | None:
    """The anchored head; None when there is none (a link planted in its place counts as
    none)."""
    fd = _open_regular(path, os.O_RDONLY)
    if fd is None:
        return None
    try:
        _locked(fd, fcntl.LOCK_SH)  # held by a writer for microseconds, if at all
        return _parse(os.pread(fd, 4 * WIDTH, 0))
    except OSError:
        return None
    finally:
        os.close(fd)


def move_anchor(path: Path, head: tuple[int, str]) -> None:
    """Move the anchor forward (never back); of racing writers the newest wins."""
    commit_anchor(path, stage_anchor(path, head), head)


def stage_anchor(path: Path, head: tuple[int, str]) -> Path:
    """Before the transaction commits: make sure the anchor is a regular file of full width
    that the move after the commit overwrites in place. Making it (the first time, or in
    place of a link or a short file of an older sbx) is what can fail for want of space,
    and fails now, rolling the transaction back. It keeps the head it had."""
    _record(head)  # one that cannot be written fails before the commit too
    fd = _open_regular(path, os.O_RDONLY)
    if fd is not None:
        try:
            if os.fstat(fd).st_size >= WIDTH:
                return path
        finally:
            os.close(fd)
    current = read_anchor(path)
    staged = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(_record(current))
        os.replace(staged, path)  # a rename: over a link, replaces the link itself
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        raise
    return path


def commit_anchor(path: Path, staged: Path | None, head: tuple[int, str]) -> None:
    """After the commit: overwrite the anchor with `head` unless a newer one got there
    first. The commit has happened whatever this does: if it cannot write (the file was
    removed or replaced meanwhile), the anchor stays behind the log, which `verify` allows,
    and the next write stages it again."""
    if staged is None:
        return
    fd = _open_regular(path, os.O_RDWR)
    if fd is None:
        return
    try:
        if not _locked(fd, fcntl.LOCK_EX):
            return  # the anchor stays behind this once; the next write moves it
        current = _parse(os.pread(fd, 4 * WIDTH, 0))
        if current is None or current[0] < head[0]:
            os.pwrite(fd, _record(head), 0)
    except OSError:
        pass
    finally:
        os.close(fd)
