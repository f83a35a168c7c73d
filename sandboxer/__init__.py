"""Sandboxer as a library: short-lived sandboxes from profiles, on deadlines, on record.

    import sandboxer

    with sandboxer.Sandboxer() as sbx, sbx.create("default", ttl="10m", task="try") as box:
        print(box.exec(["sh", "-c", "echo hello"]).stdout.decode())

`AsyncSandboxer` is the one implementation; `Sandboxer` is its sync twin. docs/api.md is the
reference. Everything not in `__all__` is private and may change.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.catalog import EventType, Reason
from core.errors import (
    BadInput,
    Conflict,
    ExitCode,
    NotFound,
    OperationFailed,
    Unavailable,
)
from core.errors import SbxError as Error
from core.states import State
from sandboxer._api import AsyncCheckpoint, AsyncInventoryWatch, AsyncSandbox, AsyncSandboxer
from sandboxer._records import (
    BackendStatus,
    Event,
    ExecExit,
    ExecResult,
    InventoryChange,
    MetricSample,
    OutputChunk,
    ProfileInfo,
    ReapReport,
    lineage,
)
from sandboxer._sync import Checkpoint, Sandbox, Sandboxer, SyncIterator

if TYPE_CHECKING:
    from core.profiles import Profile

__all__ = [
    "AsyncCheckpoint",
    "AsyncInventoryWatch",
    "AsyncSandbox",
    "AsyncSandboxer",
    "BackendStatus",
    "BadInput",
    "Checkpoint",
    "Conflict",
    "Error",
    "Event",
    "EventType",
    "ExecExit",
    "ExecResult",
    "ExitCode",
    "InventoryChange",
    "MetricSample",
    "NotFound",
    "OperationFailed",
    "OutputChunk",
    "Profile",
    "ProfileInfo",
    "Reason",
    "ReapReport",
    "Sandbox",
    "Sandboxer",
    "State",
    "SyncIterator",
    "Unavailable",
    "lineage",
    "load_profile",
    "profile_schema",
    "trust_profiles",
    "untrust_profiles",
    "verify_evidence",
]


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


def __getattr__(name: str) -> Any:
    if name == "Profile":  # pydantic loads only for a program that uses profiles
        from core.profiles import Profile

        return Profile
    raise AttributeError(f"module 'sandboxer' has no attribute {name!r}")
