"""Errors the core raises and the one mapping from any error to the CLI's exit codes."""

from __future__ import annotations

from adapters.base import (
    ArtifactRefused,
    BackendObjectGone,
    BackendUnavailable,
    CapabilityNotSupported,
    InvalidRequest,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_FOUND = 3
EXIT_CONFLICT = 4
EXIT_UNAVAILABLE = 5


class SbxError(Exception):
    exit_code = EXIT_FAILED
    kind = "failed"


class OperationFailed(SbxError):
    exit_code = EXIT_FAILED
    kind = "failed"


class BadInput(SbxError):
    """Nothing was written."""

    exit_code = EXIT_BAD_INPUT
    kind = "bad_input"


class NotFound(SbxError):
    exit_code = EXIT_NOT_FOUND
    kind = "not_found"


class Conflict(SbxError):
    exit_code = EXIT_CONFLICT
    kind = "conflict"


class Unavailable(SbxError):
    exit_code = EXIT_UNAVAILABLE
    kind = "unavailable"


class NotDue(Conflict):
    """A reaper's precondition no longer held inside the transaction; nothing was written."""


class LeaseLost(Conflict):
    """Another process took the sandbox's lease: our result is stale and was not written."""


def classify(exc: BaseException) -> tuple[int, str]:
    """(exit code, kind) for any exception the front ends may see."""
    if isinstance(exc, SbxError):
        return exc.exit_code, exc.kind
    if isinstance(exc, ArtifactRefused | InvalidRequest):
        return EXIT_BAD_INPUT, "bad_input"
    if isinstance(exc, BackendUnavailable):
        return EXIT_UNAVAILABLE, "unavailable"
    if isinstance(exc, CapabilityNotSupported):
        return EXIT_CONFLICT, "conflict"
    if isinstance(exc, BackendObjectGone):
        return EXIT_CONFLICT, "conflict"
    return EXIT_FAILED, "failed"  # AdapterError and anything unexpected
