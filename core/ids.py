"""Sandbox ids (`sbx-` + a lower-case ULID) and names."""

from __future__ import annotations

import re

from ulid import ULID

from core.errors import BadInput

PREFIX = "sbx-"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\[\]-]{0,62}")


def new_sandbox_id() -> str:
    return PREFIX + str(ULID()).lower()


def validate_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise BadInput(
            f"bad name {name!r}: use letters, digits, '.', '_', '-', '[' or ']', "
            "starting with a letter or digit, at most 63 characters"
        )
    if name.lower().startswith(PREFIX):
        raise BadInput(f"bad name {name!r}: names may not start with {PREFIX!r} (ids do)")
    return name
