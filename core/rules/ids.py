"""Sandbox ids (`sbx-` + a lower-case ULID) and names."""

from __future__ import annotations

import re

from ulid import ULID

from sandboxer.core.rules.errors import BadInput

PREFIX = "sbx-"
CHECKPOINT_PREFIX = "ckpt-"
VOLUME_PREFIX = "vol-"  # volumes (core/lifecycle/volumes.py)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\[\]-]{0,62}")
# what a unique id prefix can look like: a ULID in lower case starts with 0-7, in Crockford's
# base 32 (no i, l, o, u); a name like that would shadow an id that starts with it
_ID_PREFIX = re.compile(r"[0-7][0-9a-hjkmnp-tv-z]{0,25}")


def new_sandbox_id() -> str:
    return PREFIX + str(ULID()).lower()


def validate_name(name: str, what: str = "name") -> str:
    """The one rule for the names of sandboxes, snapshots and checkpoints: letters, digits
    and a few marks (no control character, so no terminal escape), and nothing an id or an
    id prefix could be, so a reference never means a name where it meant an id."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise BadInput(
            f"bad {what} {str(name)[:80]!r}: use letters, digits, '.', '_', '-', '[' or ']', "
            "starting with a letter or digit, at most 63 characters"
        )
    lowered = name.lower()
    for prefix in (PREFIX, CHECKPOINT_PREFIX, VOLUME_PREFIX):
        if lowered.startswith(prefix):
            raise BadInput(f"bad {what} {name!r}: names may not start with {prefix!r} (ids do)")
    if _ID_PREFIX.fullmatch(lowered):
        raise BadInput(f"bad {what} {name!r}: it could be the start of an id; give a name "
                       "with a letter that ids never hold (i, l, o, u) or a mark")
    return name


MAX_OWNER = 256  # the column's width (core/store/models.py)
MAX_TASK = 4096  # a task says what a sandbox is for; the event log keeps it forever


def validate_owner(owner: str) -> str:
    """Who a sandbox or a key belongs to (its tenant): printable text, so no NUL reaches the
    store and no escape a terminal, at most MAX_OWNER characters."""
    if not isinstance(owner, str) or not owner.strip() or len(owner) > MAX_OWNER \
            or not owner.isprintable():
        raise BadInput(f"bad owner {str(owner)[:80]!r}: printable text of 1 to {MAX_OWNER} "
                       "characters")
    return owner


def validate_task(task: str | None) -> str | None:
    """What a sandbox is for: free text (tabs and newlines too), no NUL or other control
    character a terminal would obey, at most MAX_TASK characters."""
    if task is None:
        return None
    if len(task) > MAX_TASK or any(not c.isprintable() and c not in "\t\n" for c in task):
        raise BadInput(f"bad task ({len(task)} characters): text of at most {MAX_TASK} "
                       "characters, without control characters")
    return task
