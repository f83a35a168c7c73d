"""The event log's anchor: the chain's head, kept outside the table.

A hash chain shows a changed or removed row, but not rows cut from its end. So the newest
(id, hash) is also written to a file beside the database after each commit, and `verify`
notices a log that ends before the anchor or disagrees with it.
"""

from __future__ import annotations

import os
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
    current = read_anchor(path)
    if current is not None and current[0] >= head[0]:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"{head[0]} {head[1]}\n")
    os.replace(tmp, path)  # replaces a link planted at `path`, never follows it
