"""The store's tests: `database`, each test's own migrated database, on SQLite and on
PostgreSQL (a database of the test's own, `pg_url`; `make test` starts the server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxer.core.store.db import Database
from tests.store.test_postgres import pg_url  # noqa: F401 (the fixture)


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "postgresql":
        request.applymarker(pytest.mark.postgres)
        url = request.getfixturevalue("pg_url")
    else:
        url = f"sqlite:///{tmp_path / 'sbx.db'}"
    db = Database(url)
    db.migrate()
    yield db
    db.dispose()
