"""The one rule for user labels: `K=V`, K of [a-z0-9][a-z0-9._-]* up to 63 chars, `sbx.` reserved,
V up to 253 on one line, at most 64 of them."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from sandboxer.adapters.base import RESERVED_LABEL_PREFIX
from sandboxer.core.rules.errors import BadInput

_KEY = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
MAX_VALUE = 253
MAX_LABELS = 64  # a sandbox's labels: each backend object carries them all


def validate_label(key: str, value: str) -> tuple[str, str]:
    if not _KEY.fullmatch(key):
        raise BadInput(
            f"bad label key {key!r}: use lower-case letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, at most 63 characters"
        )
    if key.startswith(RESERVED_LABEL_PREFIX):
        raise BadInput(f"bad label key {key!r}: the {RESERVED_LABEL_PREFIX!r} prefix is reserved")
    if len(value) > MAX_VALUE or any(c in value for c in "\n\r\0"):
        raise BadInput(f"bad label value for {key!r}: at most {MAX_VALUE} characters, one line")
    return key, value


def parse_label(text: str) -> tuple[str, str]:
    """Parse `K=V` from the command line."""
    key, sep, value = text.partition("=")
    if not sep:
        raise BadInput(f"bad label {text!r}: use K=V")
    return validate_label(key, value)


def _at_most(labels: dict[str, str]) -> dict[str, str]:
    if len(labels) > MAX_LABELS:
        raise BadInput(f"too many labels ({len(labels)}): at most {MAX_LABELS}")
    return labels


def parse_labels(texts: Iterable[str]) -> dict[str, str]:
    return _at_most(dict(parse_label(t) for t in texts))


def validate_labels(labels: Mapping[str, str]) -> dict[str, str]:
    return _at_most(dict(validate_label(str(k), str(v)) for k, v in labels.items()))
