"""What the library offers without a client: profile files, their schema and trust, and the
offline check of an evidence bundle. All of it is local to this machine."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.profiles import Profile


def load_profile(path: str | Path) -> Profile:
    """A profile file, resolved (its `extends:` along the search path); BadInput naming the
    file, the field and the reason when it cannot be used (`.problems` lists them all)."""
    from core.profiles import ProfileLoader

    return ProfileLoader().load_file(Path(path))


def profile_schema() -> dict[str, Any]:
    """The JSON Schema of a profile file (docs/profile.schema.json)."""
    from core.profiles import json_schema

    return json_schema()


def trust_profiles(folder: str | Path | None = None) -> tuple[Path, list[str], str]:
    """Use the profiles in `folder` (default ./.sbx/profiles) as they are now: (the folder,
    its profile names, the digest recorded). A change to them leaves them out again."""
    from core.profiles import trust

    return trust(None if folder is None else Path(folder))


def untrust_profiles(folder: str | Path | None = None) -> tuple[Path, bool]:
    """Stop using the profiles in `folder`: (the folder, whether it was trusted)."""
    from core.profiles import untrust

    return untrust(None if folder is None else Path(folder))


def verify_evidence(bundle: Mapping[str, Any]) -> list[str]:
    """Check an evidence bundle offline: the problems found, each naming the altered part or
    event; empty when intact."""
    from core.evidence import verify

    return verify(bundle)
