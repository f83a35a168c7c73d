"""Errors the core raises, the exit codes, and the one mapping from any error to them.

`sandboxer.Error` and its subclasses are these classes: the library, the CLI and the service
share one hierarchy, and each class carries the CLI's exit code (docs/cli.md)."""

from __future__ import annotations

import enum
import errno
from pathlib import Path

from adapters.base import (
    ArtifactRefused,
    BackendObjectGone,
    BackendUnavailable,
    CapabilityNotSupported,
    InvalidRequest,
)
from adapters.base import one_line as _text_of


class ExitCode(enum.IntEnum):
    """Every exit status sbx gives of its own (docs/cli.md, "Exit codes")."""

    OK = 0
    FAILED = 1  # the operation failed (the backend refused, a command failed to start)
    BAD_INPUT = 2  # nothing was written
    NOT_FOUND = 3
    CONFLICT = 4  # the sandbox's state does not allow it
    UNAVAILABLE = 5  # a backend, the database or a service cannot be reached or refused our key
    TIMED_OUT = 124  # `exec --timeout` ended the command, as timeout(1) does
    INTERRUPTED = 130  # Ctrl-C (SIGINT)


EXIT_OK = ExitCode.OK
EXIT_FAILED = ExitCode.FAILED
EXIT_BAD_INPUT = ExitCode.BAD_INPUT
EXIT_NOT_FOUND = ExitCode.NOT_FOUND
EXIT_CONFLICT = ExitCode.CONFLICT
EXIT_UNAVAILABLE = ExitCode.UNAVAILABLE


class SbxError(Exception):
    """Anything sbx refuses or fails; `exit_code` is what the CLI exits with."""

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


class QuotaExceeded(Conflict):
    """A tenant's quota would be passed (docs/security.md, "Tenants"): nothing was done.
    Exit 4 as a conflict; the service answers 429."""

    kind = "quota_exceeded"


class Unavailable(SbxError):
    exit_code = EXIT_UNAVAILABLE
    kind = "unavailable"


class Unauthorized(Unavailable):
    """A service refused our credentials (the sbx service's 401: no API key, a wrong or a
    revoked one). Exit 5, as a backend that refuses its credentials: nothing was done, and
    the fix is the key, not the request."""

    kind = "unauthorized"


class TimedOut(OperationFailed):
    """An operation given a time limit did not finish within it (`sbx reap --timeout`)."""


class DiskFull(Unavailable):
    """The disk holding the state folder (or the database server's) has no room: the
    transaction was rolled back."""

    @classmethod
    def at(cls, folder: Path | None) -> DiskFull:
        where = f"the disk holding {folder}" if folder else "the database server's disk"
        return cls(f"{where} is full: nothing was changed (free some space, then try again)")


class NotDue(Conflict):
    """A reaper's precondition no longer held inside the transaction; nothing was written."""


class LeaseLost(Conflict):
    """Another process took the sandbox's lease: our result is stale and was not written."""


_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_SQLITE_FULL, _SQLITE_IOERR = 13, 10
_PG_DISK_FULL = "53100"  # SQLSTATE disk_full


def is_disk_full(exc: BaseException | None, folder: Path | None = None) -> bool:
    """Whether `exc` (or what it wraps) says the disk is full: ENOSPC or EDQUOT, SQLite's
    SQLITE_FULL, PostgreSQL's disk_full. SQLite reports some failures to grow a file as a
    bare I/O error (SQLITE_IOERR_SHMSIZE when it cannot size the `-shm` file beside the
    database, which every reader needs): those count when `folder` is out of space."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFull):
            return True
        if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
            return True
        code = getattr(exc, "sqlite_errorcode", None)
        if isinstance(code, int):
            if code & 0xFF == _SQLITE_FULL:
                return True
            if code & 0xFF == _SQLITE_IOERR and folder is not None:
                from core.reserve import out_of_space

                return out_of_space(folder)
        if getattr(exc, "sqlstate", None) == _PG_DISK_FULL:
            return True
        exc = getattr(exc, "orig", None) or exc.__cause__ or exc.__context__
    return False


# -- the database's own errors -----------------------------------------------------------------
# SQLAlchemy's errors quote the statement and its parameters (ids, hosts, lease holders, the
# profile): never shown. A person reads one line from `one_line`; the service logs the rest.

_DB_MODULES = ("sqlalchemy", "psycopg", "sqlite3")
_DB_UNREACHABLE = frozenset({"OperationalError", "InterfaceError", "DisconnectionError",
                             "TimeoutError"})


def is_database_error(exc: BaseException) -> bool:
    """Raised by SQLAlchemy or a database driver (checked by module: nothing is imported)."""
    return type(exc).__module__.split(".")[0] in _DB_MODULES


def database_cause(exc: BaseException | None) -> BaseException | None:
    """The database error `exc` is or was raised from, if any (for the service's log)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if is_database_error(exc):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def database_reason(exc: BaseException) -> str:
    """What the database said, in one short line: the driver's primary message, never the
    statement, its parameters or SQLAlchemy's pointers."""
    orig = getattr(exc, "orig", None) or exc
    diag = getattr(orig, "diag", None)  # psycopg: the server's message without its detail
    text = str(getattr(diag, "message_primary", None) or orig).strip()
    text = text.splitlines()[0] if text else ""
    for cut in ("[SQL:", "[parameters:", "(Background on this error"):
        text = text.split(cut)[0]
    if text.startswith("("):  # SQLAlchemy's "(psycopg.errors.X) ..." prefix
        text = text.partition(") ")[2] or text
    return " ".join(text.split())[:200] or type(orig).__name__


def _database_unreachable(exc: BaseException) -> bool:
    chain = (exc, getattr(exc, "orig", None))
    return any(c.__name__ in _DB_UNREACHABLE for e in chain if e is not None
               for c in type(e).__mro__)


def _database_message(exc: BaseException) -> str:
    reason = database_reason(exc)
    if _database_unreachable(exc):
        return f"the database could not be used ({reason})"
    statement = str(getattr(exc, "statement", None) or "").lstrip().upper()
    what = "read" if statement.startswith(("SELECT", "WITH")) else "write"
    return f"the database refused the {what} ({reason})"


def one_line(exc: BaseException) -> str:
    """The one-line message a person sees for any error, never a traceback; for the
    database's own errors, what it said without the statement or its parameters."""
    if is_database_error(exc):
        return _database_message(exc)
    return _text_of(exc)


def classify(exc: BaseException) -> tuple[int, str]:
    """(exit code, kind) for any exception the front ends may see."""
    if isinstance(exc, SbxError):
        return exc.exit_code, exc.kind
    if is_disk_full(exc):
        return EXIT_UNAVAILABLE, "unavailable"
    if is_database_error(exc):
        return (EXIT_UNAVAILABLE, "unavailable") if _database_unreachable(exc) \
            else (EXIT_FAILED, "failed")
    if isinstance(exc, ArtifactRefused | InvalidRequest):
        return EXIT_BAD_INPUT, "bad_input"
    if isinstance(exc, BackendUnavailable):
        return EXIT_UNAVAILABLE, "unavailable"
    if isinstance(exc, CapabilityNotSupported):
        return EXIT_CONFLICT, "conflict"
    if isinstance(exc, BackendObjectGone):
        return EXIT_CONFLICT, "conflict"
    return EXIT_FAILED, "failed"  # AdapterError and anything unexpected


_KINDS: dict[str, type[SbxError]] = {}


def as_error(exc: BaseException) -> SbxError:
    """`exc` as one of the classes above (a backend's own error keeps its message), so a
    caller of the library catches one hierarchy."""
    if isinstance(exc, SbxError):
        return exc
    if not _KINDS:
        _KINDS.update({cls.kind: cls for cls in (OperationFailed, BadInput, NotFound,
                                                  Conflict, QuotaExceeded, Unavailable,
                                                  Unauthorized)})
    _, kind = classify(exc)
    error = _KINDS[kind](one_line(exc))
    error.__cause__ = exc
    return error
