"""The event log's anchor: the chain's head, kept outside the table.

A hash chain shows a changed or removed row, but not rows cut from its end. So the newest
(id, hash) is also written to a file beside the database after each commit, and `verify`
notices a log that ends before the anchor or disagrees with it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

HEAD_KEY = "sbx_event_head"  # where an append leaves its (id, hash) on the connection


def read_anchor(path: Path) -> tuple[int, str] | None:
    try:  # a link planted in its place is not followed: the anchor reads as missing
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)) as file:
            id_text, hash_text = file.read().split()
        return int(id_text), hash_text
    except (OSError, ValueError):
        return None


def move_anchor(path: Path, head: tuple[int, str]) -> None:
    """Move the anchor forward (never back), atomically; of racing writers the newest wins."""
    commit_anchor(path, stage_anchor(path, head), head)


def stage_anchor(path: Path, head: tuple[int, str]) -> Path | None:
    """Write the anchor's next version beside it, before the transaction commits: what can
    fail for want of space fails then, and rolls the transaction back. None when the
    anchor is already at or past `head`."""
    current = read_anchor(path)
    if current is not None and current[0] >= head[0]:
        return None
    staged = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(f"{head[0]} {head[1]}\n")
    except BaseException:
        discard_anchor(staged)
        raise
    return staged


def commit_anchor(path: Path, staged: Path | None, head: tuple[int, str]) -> None:
    """After the commit: put the staged anchor in place, unless a newer one got there first.
    A rename needs no room, and the commit has happened whatever this does."""
    if staged is None:
        return
    current = read_anchor(path)
    if current is not None and current[0] >= head[0]:
        discard_anchor(staged)
        return
    try:
        os.replace(staged, path)
    except OSError:
        discard_anchor(staged)


def discard_anchor(staged: Path | None) -> None:
    if staged is not None:
        with contextlib.suppress(OSError):
            os.unlink(staged)
