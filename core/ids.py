"""Sandbox ids (`sbx-` + a lower-case ULID) and names."""

from __future__ import annotations

import re

from ulid import ULID

from core.errors import BadInput

PREFIX = "sbx-"
CHECKPOINT_PREFIX = "ckpt-"
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
    for prefix in (PREFIX, CHECKPOINT_PREFIX):
        if lowered.startswith(prefix):
            raise BadInput(f"bad {what} {name!r}: names may not start with {prefix!r} (ids do)")
    if _ID_PREFIX.fullmatch(lowered):
        raise BadInput(f"bad {what} {name!r}: it could be the start of an id; give a name "
                       "with a letter that ids never hold (i, l, o, u) or a mark")
    return name
