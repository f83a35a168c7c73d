"""envd's folder watch (`files.watch_dir`) for the E2B API (docs/e2b-api.md, "Watching a
folder"). sbx has no filesystem notifications, so a watch looks at the folder with the
library's `files.list` and reports the difference between two looks as envd's events: the
SDK's polling watcher (sync) looks when it asks for new events; the streaming one (async)
looks every POLL_S. Between two looks, changes fold together: a file made and removed in
between is not seen, a rename is the old name's REMOVE and the new name's CREATE, and a
rewrite that keeps a file's size and modification time is not seen."""

from __future__ import annotations

from typing import Any

from sandboxer_tui.e2b_api.wire import RpcError

POLL_S = 0.5  # the streaming watch's latency: it looks this often
MAX_WATCHERS = 256  # polling watchers kept at once by one service process
RECURSIVE_DEPTH = 16  # the levels a recursive watch looks down (each look lists them all)

Look = dict[str, Any]  # a name relative to the watched folder -> its FileInfo


async def look(box, path: str, recursive: bool) -> Look | None:
    """What the folder holds now (all levels when recursive), by relative name; None when
    it is not found (the folder is gone, or the sandbox)."""
    from sandboxer.core.rules.errors import NotFound

    try:
        top = await box.files.stat(path)
        if not top.is_dir:
            raise RpcError("invalid_argument", f"path '{path}' is not a directory")
        found = await box.files.list(path, RECURSIVE_DEPTH if recursive else 1)
    except NotFound:
        return None
    base = top.path.rstrip("/") + "/"
    return {info.path[len(base):]: info for info in found if info.path.startswith(base)}


def changes(before: Look, after: Look) -> list[tuple[str, str, Any]]:
    """(name, envd's event type, the entry now or None) from one look to the next, by name:
    a new entry is CREATE (and WRITE when it is a file with bytes, as its writer's write
    is), a file whose size, time or type changed is WRITE, a changed mode is CHMOD, a gone
    one REMOVE. A folder changing because its entries did is not an event (as on envd)."""
    out: list[tuple[str, str, Any]] = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if new is None:
            out.append((name, "EVENT_TYPE_REMOVE", None))
        elif old is None:
            out.append((name, "EVENT_TYPE_CREATE", new))
            if new.type == "file" and new.size:
                out.append((name, "EVENT_TYPE_WRITE", new))
        elif new.type != "dir" and (old.size, old.mtime, old.type) != (
                new.size, new.mtime, new.type):
            out.append((name, "EVENT_TYPE_WRITE", new))
        elif old.mode != new.mode:
            out.append((name, "EVENT_TYPE_CHMOD", new))
    return out
