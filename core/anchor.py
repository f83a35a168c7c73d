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
    try:
        id_text, hash_text = path.read_text().split()
        return int(id_text), hash_text
    except (OSError, ValueError):
        return None


def move_anchor(path: Path, head: tuple[int, str]) -> None:
    """Move the anchor forward (never back), atomically; of racing writers the newest wins."""
    current = read_anchor(path)
    if current is not None and current[0] >= head[0]:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(f"{head[0]} {head[1]}\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
