"""The library client a CLI command uses, and what `sbx server`'s spare child opens for it
ahead of time.

The spare child (sandboxer_tui/server/resident.py) opens the SQLite database and reaches the local
engine while no command waits (`prepare`). The command that comes next takes them over
(`take_client`) only if its own environment names the same database file and the same
engine settings; it builds its own Manager around them, so everything the command's
environment decides (actor, clock, lease time, installation) is its own. bench/README.md
says what this buys, measured.

With `SBX_URL` (or `sbx --url`), every command is a client of that service instead, as
DOCKER_HOST makes docker one of another engine; `SBX_TOKEN` is its API key.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

# How long a database opened ahead keeps its first connection: a command after a long
# pause gets a new one (the engine and what it compiled stay).
PREPARED_FOR_S = 30.0
# The environment an adapter reads when it is made: a prepared one is taken only if the
# command's environment agrees on all of it.
ADAPTER_ENV_PREFIXES = ("DOCKER_", "SBX_DOCKER", "SBX_SSH", "E2B_", "MODAL_", "SBX_ADAPTERS")

_database: tuple[str, Any, tuple[int, int], float] | None = None  # url, db, file, when
_adapters: dict[str, tuple[tuple, Any]] = {}  # backend -> (its environment, the adapter)
_abandoned: list[Any] = []  # see take_client


def _adapter_env() -> tuple:
    return tuple(sorted((k, v) for k, v in os.environ.items()
                        if k.startswith(ADAPTER_ENV_PREFIXES) or k == "HOME"))


def prepare(backends: tuple[str, ...] = ()) -> None:
    """Open the database and reach `backends` before the command exists. Only a SQLite file
    is opened ahead (a database server may drop an idle connection). Whatever fails here is
    left for the command to meet and report."""
    global _database
    import asyncio

    from sandboxer.adapters import registry
    from sandboxer.core.rules import settings
    from sandboxer.core.store.db import Database

    with contextlib.suppress(Exception):
        url = settings.database_url()
        db = Database(url)
        identity = db.file_identity()  # None unless a SQLite file
        if identity is None:
            db.dispose()
        else:
            db.migrate()  # connects, and checks the schema once
            _database = (url, db, identity, time.monotonic())
    env = _adapter_env()
    for name in backends:
        with contextlib.suppress(Exception):
            adapter = registry.load_class(name)()
            asyncio.run(adapter.ensure_available())
            _adapters[name] = (env, adapter)


def _take_database(url: str) -> Any | None:
    """The database opened ahead for `url`, if it is still the same file; else None.

    A connection to a file since replaced is left open, untouched, until the process ends:
    closing SQLite's last connection to a file checkpoints and removes the `-wal` beside it,
    which by now may belong to the new file."""
    global _database
    found, _database = _database, None
    if found is None:
        return None
    prepared_url, db, identity, opened = found
    if prepared_url != url:
        db.dispose()
        return None
    if db.file_identity() != identity:
        _abandoned.append(db)
        return None
    if time.monotonic() - opened > PREPARED_FOR_S:
        db.dispose()  # a connection of its own, new; the engine and what it compiled stay
    return db


def service_url() -> str | None:
    """The service the CLI talks to (`SBX_URL`), if any."""
    from sandboxer.core.rules.settings import service_url as url

    return url()


def service_token() -> str | None:
    from sandboxer.core.rules.settings import service_token as token

    return token()


def take_async_client() -> Any:
    """A `sandboxer.AsyncSandboxer` for a long-running command (`reap --every`, `metrics
    --all`), of the service too under `SBX_URL`."""
    from sandboxer import AsyncSandboxer

    url = service_url()
    if url:
        return AsyncSandboxer(url=url, token=service_token())
    return AsyncSandboxer()


def take_client() -> Any:
    """A `sandboxer.Sandboxer` for this command: of the service under `SBX_URL`; else around
    what was prepared if it fits."""
    from sandboxer import Sandboxer

    url = service_url()
    if url:
        return Sandboxer(url=url, token=service_token())
    if _database is None and not _adapters:
        return Sandboxer()
    from sandboxer._local import LocalTransport
    from sandboxer.core.lifecycle.manager import Manager
    from sandboxer.core.rules import settings
    from sandboxer.core.store.db import Database

    url = settings.database_url()
    db = _take_database(url)
    env = _adapter_env()
    adapters = {name: adapter for name, (made_with, adapter) in _adapters.items()
                if made_with == env}
    _adapters.clear()
    if db is None and not adapters:
        return Sandboxer()
    manager = Manager(db=db or Database(url), adapters=adapters)
    return Sandboxer(_transport=LocalTransport(manager=manager))
