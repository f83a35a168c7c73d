"""The library client a CLI command uses. `sbx server`'s spare child may have made one ahead,
with its database open and its engine reached, before the command arrived."""

from __future__ import annotations

from typing import Any


def take_client() -> Any:
    """A `sandboxer.Sandboxer` for this command."""
    from sandboxer import Sandboxer

    return Sandboxer()
