"""Sandboxer as a library: short-lived sandboxes from profiles, on deadlines, on record.

    import sandboxer

    with sandboxer.Sandboxer() as sbx, sbx.create("default", ttl="10m", task="try") as box:
        print(box.exec(["sh", "-c", "echo hello"]).stdout.decode())

`AsyncSandboxer` is the one implementation; `Sandboxer` is its sync twin. docs/api.md is the
reference. Everything not in `__all__` is private and may change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandboxer._api import AsyncCheckpoint, AsyncInventoryWatch, AsyncSandbox, AsyncSandboxer
from sandboxer._files import AsyncFiles
from sandboxer._processes import AsyncProcess, AsyncProcesses, ProcessOutput
from sandboxer._records import (
    BackendStatus,
    Event,
    ExecExit,
    ExecResult,
    FileInfo,
    FileTransfer,
    InventoryChange,
    MetricSample,
    OutputChunk,
    PoolInfo,
    ProfileInfo,
    ReapReport,
    VolumeRecord,
    lineage,
)
from sandboxer._sync import (
    Checkpoint,
    Files,
    Process,
    Processes,
    Sandbox,
    Sandboxer,
    SyncIterator,
    Terminal,
)
from sandboxer._terminals import AsyncTerminal
from sandboxer._tools import (
    generate_keys,
    load_profile,
    profile_schema,
    trust_profiles,
    untrust_profiles,
    verify_evidence,
)
from sandboxer.core.rules.catalog import EventType, Reason
from sandboxer.core.rules.errors import (
    BadInput,
    Conflict,
    ExitCode,
    NotFound,
    OperationFailed,
    QuotaExceeded,
    Unauthorized,
    Unavailable,
)
from sandboxer.core.rules.errors import SbxError as Error
from sandboxer.core.rules.states import State

if TYPE_CHECKING:
    from sandboxer.core.rules.profiles import Profile

__all__ = [
    "AsyncCheckpoint",
    "AsyncFiles",
    "AsyncInventoryWatch",
    "AsyncProcess",
    "AsyncProcesses",
    "AsyncSandbox",
    "AsyncSandboxer",
    "AsyncTerminal",
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
    "FileInfo",
    "FileTransfer",
    "Files",
    "InventoryChange",
    "MetricSample",
    "NotFound",
    "OperationFailed",
    "OutputChunk",
    "PoolInfo",
    "Process",
    "ProcessOutput",
    "Processes",
    "Profile",
    "ProfileInfo",
    "QuotaExceeded",
    "Reason",
    "ReapReport",
    "Sandbox",
    "Sandboxer",
    "State",
    "SyncIterator",
    "Terminal",
    "Unauthorized",
    "Unavailable",
    "VolumeRecord",
    "lineage",
    "load_profile",
    "profile_schema",
    "trust_profiles",
    "untrust_profiles",
    "verify_evidence",
    "generate_keys",
]


def __getattr__(name: str) -> Any:
    if name == "Profile":  # pydantic loads only for a program that uses profiles
        from sandboxer.core.rules.profiles import Profile

        return Profile
    raise AttributeError(f"module 'sandboxer' has no attribute {name!r}")
