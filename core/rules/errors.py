"""Errors the core raises, the exit codes, and the one mapping from any error to them.

`sandboxer.Error` and its subclasses are these classes: the library, the CLI and the service
share one hierarchy, and each class carries the CLI's exit code (docs/cli.md)."""

from __future__ import annotations

import enum
import errno
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sandboxer.adapters.base import (
    ArtifactRefused,
    BackendObjectGone,
    BackendUnavailable,
    CapabilityNotSupported,
    InvalidRequest,
    NoSuchPath,
)
from sandboxer.adapters.base import one_line as _text_of


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


class SbxError(Exception):
    """Anything sbx refuses or fails; `exit_code` is what the CLI exits with."""

    exit_code = ExitCode.FAILED
    kind = "failed"


class OperationFailed(SbxError):
    exit_code = ExitCode.FAILED
    kind = "failed"


class BadInput(SbxError):
    """Nothing was written."""

    exit_code = ExitCode.BAD_INPUT
    kind = "bad_input"


class NotFound(SbxError):
    exit_code = ExitCode.NOT_FOUND
    kind = "not_found"


class Conflict(SbxError):
    exit_code = ExitCode.CONFLICT
    kind = "conflict"


class QuotaExceeded(Conflict):
    """A tenant's quota would be passed (docs/security.md, "Tenants"): nothing was done.
    Exit 4 as a conflict; the service answers 429."""

    kind = "quota_exceeded"


class Unavailable(SbxError):
    exit_code = ExitCode.UNAVAILABLE
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
                from sandboxer.core.rules.reserve import out_of_space

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


def storable(text: str) -> str:
    """Words sbx keeps about a failure (a backend's, a command's output), storable on either
    database: PostgreSQL refuses a NUL in text, so it is kept as U+FFFD."""
    return text.replace("\x00", "\ufffd")


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
        return ExitCode.UNAVAILABLE, "unavailable"
    if is_database_error(exc):
        return (ExitCode.UNAVAILABLE, "unavailable") if _database_unreachable(exc) \
            else (ExitCode.FAILED, "failed")
    if isinstance(exc, ArtifactRefused | InvalidRequest):
        return ExitCode.BAD_INPUT, "bad_input"
    if isinstance(exc, BackendUnavailable):
        return ExitCode.UNAVAILABLE, "unavailable"
    if isinstance(exc, CapabilityNotSupported):
        return ExitCode.CONFLICT, "conflict"
    if isinstance(exc, BackendObjectGone):
        return ExitCode.CONFLICT, "conflict"
    if isinstance(exc, NoSuchPath):
        return ExitCode.NOT_FOUND, "not_found"
    return ExitCode.FAILED, "failed"  # AdapterError and anything unexpected


# -- a document's problems, as pydantic finds them, in plain words ----------------------------

_SHOULD_BE = {"dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type":
              "a mapping", "list_type": "a list", "string_type": "text", "int_type":
              "a whole number", "int_parsing": "a whole number", "int_from_float":
              "a whole number", "float_type": "a number", "float_parsing": "a number",
              "bool_type": "true or false", "bool_parsing": "true or false",
              "byte_size": "a size such as 512m or 2g", "byte_size_unit":
              "a size such as 512m or 2g"}


def _shown(value: Any) -> str:
    import json

    if isinstance(value, bytes | bytearray):  # a body that was not parsed: not JSON
        return "text that is not JSON"
    try:
        text = json.dumps(value, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def plain_problem(err: Mapping[str, Any], fields_here: Sequence[str] = ()) -> str:
    """What is wrong with one value of a document, from one of pydantic's errors, in words a
    person reads without knowing the models: "should be a mapping, not 5", "unknown field
    (did you mean 'image'?)". `fields_here`: the fields allowed where an unknown one was."""
    kind, message = err.get("type"), str(err.get("msg", ""))
    if kind == "extra_forbidden":
        import difflib

        close = difflib.get_close_matches(str(err["loc"][-1]), list(fields_here), n=1)
        return "unknown field" + (f" (did you mean {close[0]!r}?)" if close else "")
    if kind == "json_invalid":
        return f"not JSON ({(err.get('ctx') or {}).get('error', message)})"
    if kind == "missing":
        return "required, not given"
    if kind in _SHOULD_BE:
        return f"should be {_SHOULD_BE[kind]}, not {_shown(err.get('input'))}"
    if kind == "string_pattern_mismatch":  # the pattern itself says nothing to a person
        return f"is not of the form this field takes: {_shown(err.get('input'))}"
    message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    first, _, rest = message.partition(" ")
    if first in ("Input", "String", "List", "Dictionary", "Value", "Tuple", "Set") \
            and rest.startswith("should "):  # pydantic's "Input should be ...": what, and not what
        return f"{rest}, not {_shown(err.get('input'))}"
    return " ".join(message.split())


def plain_problems(errors: Sequence[Mapping[str, Any]],
                   fields_at: Callable[[tuple], Sequence[str]] = lambda loc: ()) -> list[str]:
    """pydantic's errors of one document as `path: what is wrong`, one each; the errors of one
    value that fits no member of a union (text, a number...) are one: "ttl: should be text, a
    number or a whole number, not [1]". `fields_at(loc)`: the fields allowed at `loc`."""
    said, i = [], 0
    while i < len(errors):
        first, j = errors[i], i + 1
        while (j < len(errors) and len(first["loc"]) > 1
               and tuple(errors[j]["loc"][:-1]) == tuple(first["loc"][:-1])
               and {errors[j]["type"], first["type"]} <= _SHOULD_BE.keys()
               and errors[j]["type"] != errors[j - 1]["type"]
               and errors[j].get("input") == first.get("input")):
            j += 1
        if j - i > 1:
            wants = list(dict.fromkeys(_SHOULD_BE[e["type"]] for e in errors[i:j]))
            words = (", ".join(wants[:-1]) + " or " + wants[-1]) if len(wants) > 1 \
                else wants[0]
            said.append(f"{problem_path(first['loc'][:-1])}: should be {words}, not "
                        f"{_shown(first.get('input'))}")
        else:
            loc = tuple(first["loc"])
            said.append(f"{problem_path(loc)}: {plain_problem(first, fields_at(loc[:-1]))}")
        i = j
    return said


def problem_path(loc: Sequence[Any]) -> str:
    """Where in the document: `resources.memory`, `env.A`, `setup[0]`."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(the whole document)"


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
