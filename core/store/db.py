"""The database: SQLite (WAL, busy timeout, `BEGIN IMMEDIATE` for writers) or PostgreSQL.

SQLite: writers take the write lock at BEGIN, so a read-then-write transaction never fails
with "database is locked" halfway (see docs/reliability.md). Readers use deferred
transactions and, under WAL, never wait for a writer.

PostgreSQL (fleet mode): transactions are READ COMMITTED; a writer locks the rows it reads
before changing them (`SELECT ... FOR UPDATE`, which SQLite's dialect leaves out since its
transaction already holds the write lock), the reaper claims with SKIP LOCKED, and the two
things that need a total order, the event chain and migrations, take a transaction-scoped
advisory lock (`serialise`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from sandboxer.core.rules import reserve
from sandboxer.core.rules.errors import (
    BadInput,
    DiskFull,
    OperationFailed,
    Unavailable,
    database_reason,
    is_disk_full,
)
from sandboxer.core.store.anchor import HEAD_KEY, commit_anchor, stage_anchor
from sandboxer.core.store.migrations import SCHEMA_HEAD

if TYPE_CHECKING:
    from sqlmodel import Session

BUSY_TIMEOUT_MS = 30_000
T = TypeVar("T")
_WRITE = "sbx_write"
# pg_advisory_xact_lock keys: one per thing that needs a total order
LOCK_EVENT_CHAIN = 0x5B0001
LOCK_MIGRATIONS = 0x5B0002
LOCK_DELIVERY_CURSORS = 0x5B0003
LOCK_SANDBOX_NAMES = 0x5B0004
LOCK_TENANT_QUOTAS = 0x5B0005
SUPPORTED = ("sqlite", "postgresql")


def serialise(conn: Connection, key: int) -> None:
    """Hold `key` until this transaction ends (PostgreSQL). On SQLite a write transaction is
    already the only writer."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({int(key)})")


def _sqlite_path(url: sa.URL) -> Path | None:
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return Path(url.database)


def _sqlite_path_of(url: str) -> Path | None:
    try:
        return _sqlite_path(sa.make_url(url))
    except sa.exc.ArgumentError:
        return None


def _precreate_private(path: Path) -> None:
    """Create the database file 0600 before SQLite does, so it is never world-readable.
    Only when it is missing: opening and closing an existing database file would drop the
    POSIX locks SQLite holds on it in this process."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except FileExistsError:
        return  # another process made it first
    os.close(fd)


def _waiting_while_locked(action: Callable[[], T]) -> T:
    """Run `action`, trying again while SQLite says "database is locked". A new file that
    another process is creating right now answers that at once, without the busy handler
    (switching to WAL needs an exclusive lock): wait for it, as the busy timeout would."""
    import sqlite3
    import time

    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            return action()
        except (sqlite3.OperationalError, sa.exc.OperationalError) as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _ensure_wal(cur) -> None:
    """WAL mode, set once in the file's life."""
    def switch() -> None:
        if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            cur.execute("PRAGMA journal_mode=WAL")

    _waiting_while_locked(switch)


# the largest numbers an INTEGER and a BIGINT column hold (PostgreSQL; SQLite holds more)
INTEGER_MAX, BIGINT_MAX = 2**31 - 1, 2**63 - 1


def _refuse_unstorable(conn, cursor, statement, parameters, context, executemany) -> None:
    """Before an INSERT or UPDATE: BadInput for a value one of the two stores would refuse
    (PostgreSQL: a NUL in text, text longer than its column, a number past its column's
    range; SQLite would keep them), so both refuse alike, in one line, before the statement
    runs. The inputs are checked where they arrive; this is the net behind them."""
    compiled = getattr(context, "compiled", None)
    if compiled is None or not (context.isinsert or context.isupdate):
        return
    checks = _checks(compiled)
    for params in context.compiled_parameters:
        for name, length, most in checks:
            value = params.get(name)
            if value is None:
                continue
            if isinstance(value, str):
                if "\x00" in value:
                    raise BadInput(f"bad {_column(compiled, name)}: it holds a NUL character")
                if length is not None and len(value) > length:
                    raise BadInput(f"bad {_column(compiled, name)}: {len(value)} characters, "
                                   f"at most {length}")
            elif most is not None and type(value) is int and not -most - 1 <= value <= most:
                raise BadInput(f"bad {_column(compiled, name)}: {value} is out of range "
                               f"(at most {most})")


def _checks(compiled) -> list[tuple[str, int | None, int | None]]:
    """(bind, text length, largest number) of each parameter of a compiled statement, worked
    out once: SQLAlchemy caches the compiled form, so a write pays a loop, not a lookup."""
    found = compiled.__dict__.get("_sbx_checks")
    if found is None:
        found = []
        for name, bind in compiled.binds.items():
            kind = bind.type
            most = BIGINT_MAX if isinstance(kind, sa.BigInteger) else \
                INTEGER_MAX if isinstance(kind, sa.Integer) else None
            found.append((name, getattr(kind, "length", None), most))
        compiled.__dict__["_sbx_checks"] = found
    return found


def _column(compiled, name: str) -> str:
    table = getattr(getattr(compiled, "statement", None), "table", None)
    column = name.rsplit("_", 1)[0] if name.rsplit("_", 1)[-1].isdigit() else name
    return f"{table.name}.{column}" if table is not None else column


def make_engine(url: str) -> Engine:
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        raise BadInput(f"database URL {redact(url)!s} cannot be parsed "
                       "(sqlite:///PATH or postgresql+psycopg://USER@HOST/DB)") from None
    backend = parsed.get_backend_name()
    if backend not in SUPPORTED:
        raise BadInput(f"database {redact(url)}: {backend} is not supported "
                       "(sqlite:///PATH or postgresql+psycopg://USER@HOST/DB)")
    if backend == "postgresql":
        if parsed.get_driver_name() not in ("psycopg", "psycopg2"):
            parsed = parsed.set(drivername="postgresql+psycopg")
        engine = sa.create_engine(parsed, pool_pre_ping=False,
                                  connect_args={"connect_timeout": 10})
        sa.event.listen(engine, "before_cursor_execute", _refuse_unstorable)
        return engine
    path = _sqlite_path(parsed)
    if path is not None:
        _precreate_private(path)
    engine = sa.create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})
    sa.event.listen(engine, "before_cursor_execute", _refuse_unstorable)

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        if path is not None:
            _ensure_wal(cur)
            cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn):
        # on the driver's connection: through exec_driver_sql it cost as much as the
        # statement the transaction is for
        conn.connection.dbapi_connection.execute(
            "BEGIN IMMEDIATE" if conn.get_execution_options().get(_WRITE) else "BEGIN"
        )

    return engine


class Database:
    """An engine plus the two kinds of transaction sbx uses."""

    def __init__(self, url: str) -> None:
        self.url = url
        try:
            self.engine = make_engine(url)
        except BadInput:
            raise
        except Exception as exc:
            self._refuse_if_full(exc, _sqlite_path_of(url))
            raise Unavailable(f"cannot open the database {redact(url)}: "
                              f"{database_reason(exc)}") from exc
        self._migrated = False

    # -- a full disk (see sandboxer.core.rules.reserve) ------------------------------------------------------

    @property
    def folder(self) -> Path | None:
        """The folder of a SQLite database file (SBX_HOME by default); None for a server."""
        path = _sqlite_path(self.engine.url)
        return path.parent if path else None

    @staticmethod
    def _refuse_if_full(exc: BaseException, path: Path | None) -> None:
        """DiskFull (exit 5, one line naming the folder) when `exc` means the disk is full."""
        folder = path.parent if path else None
        if is_disk_full(exc, folder):
            raise DiskFull.at(folder) from None

    def keep_reserve(self) -> bool:
        """The reserve is in place (made now if missing and there is room); True for a
        database server, whose disk is not ours to reserve."""
        path = _sqlite_path(self.engine.url)
        return reserve.keep(path) if path else True

    def release_reserve(self) -> bool:
        """Delete the reserve, to make room for a write that ends or records a sandbox."""
        path = _sqlite_path(self.engine.url)
        return reserve.release(path) if path else False

    def make_room(self) -> bool:
        """Before ending sandboxes: release the reserve if the disk is nearly full."""
        return reserve.make_room(self.url)

    def require_room(self) -> None:
        """Before starting a sandbox: DiskFull unless the disk has room and the reserve."""
        folder = self.folder
        if folder is not None and (reserve.out_of_space(folder) or not self.keep_reserve()):
            raise DiskFull.at(folder)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def file_identity(self) -> tuple[int, int] | None:
        """Which file a SQLite database is (device, inode); None for a server database or
        a file not there. A file replaced under the same name is another database."""
        path = _sqlite_path(self.engine.url)
        try:
            st = os.stat(path) if path else None
        except OSError:
            return None
        return (st.st_dev, st.st_ino) if st else None

    @property
    def anchor_path(self) -> Path | None:
        """Where the event log's head is anchored: beside the SQLite file."""
        path = _sqlite_path(self.engine.url)
        return path.with_name(path.name + ".head") if path else None

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A short write transaction (BEGIN IMMEDIATE on SQLite). Never hold it across I/O.
        On a full disk it is rolled back and raises DiskFull."""
        try:
            self.migrate()
            with self.engine.connect().execution_options(**{_WRITE: True}) as conn:
                staged = None
                try:
                    with conn.begin():
                        yield conn
                        head = conn.info.get(HEAD_KEY)
                        if head and self.anchor_path:  # before the commit: see stage_anchor
                            staged = stage_anchor(self.anchor_path, head)
                except BaseException:
                    # rolled back: its events were never written, so its head must not be left
                    # on this pooled connection for the next transaction to anchor
                    conn.info.pop(HEAD_KEY, None)
                    raise
                head = conn.info.pop(HEAD_KEY, None)  # committed: move the anchor
                if head and self.anchor_path:
                    commit_anchor(self.anchor_path, staged, head)
        except Exception as exc:
            self._refuse_if_full(exc, _sqlite_path(self.engine.url))
            raise

    @contextmanager
    def session(self, *, write: bool = False) -> Iterator[Session]:
        """Typed rows: a SQLModel session inside one `read()` or `write()` transaction
        (which commits it; the session only flushes into it)."""
        from sqlmodel import Session

        with (self.write() if write else self.read()) as conn:
            with Session(bind=conn, expire_on_commit=False) as session:
                yield session
                session.flush()

    @contextmanager
    def read(self) -> Iterator[Connection]:
        try:
            self.migrate()
            with self.engine.connect() as conn:
                with conn.begin():
                    yield conn
        except Exception as exc:
            self._refuse_if_full(exc, _sqlite_path(self.engine.url))
            raise

    def schema_version(self) -> str | None:
        try:
            return _waiting_while_locked(self._read_schema_version)
        except sa.exc.OperationalError as exc:  # still locked after the busy timeout
            self._refuse_if_full(exc, _sqlite_path(self.engine.url))
            raise Unavailable(f"cannot read the database {redact(self.url)}: "
                              f"{database_reason(exc)}") from exc

    def _read_schema_version(self) -> str | None:
        try:
            with self.engine.connect() as conn:
                return conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
        except sa.exc.OperationalError as exc:
            if "no such table" in str(exc):
                return None
            if "locked" in str(exc):
                raise
            self._refuse_if_full(exc, _sqlite_path(self.engine.url))
            raise Unavailable(f"cannot read the database {redact(self.url)}: "
                              f"{database_reason(exc)}") from exc
        except sa.exc.ProgrammingError:
            return None
        except sa.exc.DBAPIError as exc:  # PostgreSQL unreachable, refused, bad password
            raise Unavailable(f"cannot reach the database {redact(self.url)}: "
                              f"{database_reason(exc)}") from exc

    def migrate(self) -> None:
        """Bring the schema to head; cheap when it already is (Alembic is imported only to upgrade)."""
        if self._migrated:
            return
        if self.schema_version() != SCHEMA_HEAD:
            from sandboxer.core.store.migrations import upgrade

            with self.engine.connect().execution_options(**{_WRITE: True}) as conn:
                with conn.begin():
                    serialise(conn, LOCK_MIGRATIONS)  # several first runs at once: one migrates
                    try:
                        upgrade(conn)
                    except Exception as exc:
                        self._refuse_if_full(exc, _sqlite_path(self.engine.url))
                        raise OperationFailed("database migration failed: "
                                              f"{database_reason(exc)}") from exc
        self._migrated = True
        self.keep_reserve()  # once per process; a create insists on it (require_room)

    def dispose(self) -> None:
        self.engine.dispose()


def redact(url: str) -> str:
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable database URL>"
