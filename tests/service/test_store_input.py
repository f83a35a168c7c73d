"""Input that would reach the store is refused before it, alike on SQLite and PostgreSQL, and
no error ever shows SQL (issue 29, point 4).

PostgreSQL refuses what SQLite keeps (a NUL in text, text longer than its column, a number
past an INTEGER), and SQLAlchemy's error quotes the statement and its parameters (ids, host,
lease holder, the profile): that was a 500 with the SQL in its body. Each case runs against a
real service on each store and checks the status, a one-line body without SQL, and that no
row of any table changed. Then the database itself is made to refuse a write (a trigger) to
show what a person reads when it does: one line, the statement only in the service's log.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from support import SbxRunner

from tests.service.live import LiveService
from tests.store.test_postgres import pg_url  # noqa: F401 (the fixture)

TABLES = ("sandboxes", "events", "api_keys", "tenants", "checkpoints", "idempotency_keys")
SQL_MARKS = ("SELECT ", "INSERT ", "UPDATE ", "%(", "[parameters", "[SQL", "psycopg",
             "sqlalchemy", "sqlite3")


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, sbx_home: Path,
          monkeypatch: pytest.MonkeyPatch) -> str:
    """The database URL the service and the CLI use: the test's SQLite file, or a database
    of its own on the PostgreSQL server `make test` starts."""
    if request.param == "sqlite":
        return f"sqlite:///{sbx_home / 'sbx.db'}"
    request.applymarker(pytest.mark.postgres)
    url = request.getfixturevalue("pg_url")
    monkeypatch.setenv("SBX_DATABASE_URL", url)
    return url


@pytest.fixture
def service(sbx_home: Path, stub_named: str, store: str) -> Iterator[LiveService]:
    service = LiveService(sbx_home).start()
    yield service
    service.stop()


def rows(url: str) -> dict[str, int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar()
                    for t in TABLES}
    finally:
        engine.dispose()


def assert_plain(answer: httpx.Response, status: int, *mentions: str) -> str:
    assert answer.status_code == status, answer.text
    message = answer.json()["error"]["message"]
    assert "\n" not in message and len(message) < 400, message
    assert not [m for m in SQL_MARKS if m in answer.text], answer.text
    for mention in mentions:
        assert mention in message, message
    return message


def cli_env(store: str, **extra: str) -> dict[str, str]:
    """The CLI on the service's database, with the stub profile on its search path."""
    return {"SBX_DATABASE_URL": store, "SBX_PROFILE_PATH": os.environ["SBX_PROFILE_PATH"],
            **extra}


def client(service: LiveService, scope: str, owner: str) -> httpx.Client:
    return httpx.Client(base_url=service.url, timeout=60,
                        headers={"Authorization": f"Bearer {service.key(scope, owner=owner)}"})


def test_text_and_numbers_the_store_cannot_keep_are_refused_before_it(service, store,
                                                                      stub_named):
    admin, writer = client(service, "admin", "ops"), client(service, "write", "writer")
    made = writer.post("/v1/sandboxes", json={"profile": stub_named})
    assert made.status_code == 201, made.text
    box = made.json()["id"]
    before = rows(store)

    create = "/v1/sandboxes"
    cases = [
        (admin.post(create, json={"profile": stub_named, "owner": "a\x00b"}), 400, "owner"),
        (admin.post(create, json={"profile": stub_named, "owner": "o" * 300}), 400, "owner"),
        (writer.post(create, json={"profile": stub_named, "task": "a\x00b"}), 400, "task"),
        (writer.post(create, json={"profile": stub_named, "task": "t" * 5000}), 400, "4096"),
        (writer.post(create, json={"profile": stub_named,
                                   "labels": {f"k{i}": "v" for i in range(65)}}), 400,
         "at most 64"),
        (writer.get(f"/v1/sandboxes/{box}%00garbage"), 404, "no sandbox"),
        (writer.delete(f"/v1/sandboxes/{box}%00garbage"), 404, "no sandbox"),
        (writer.get("/v1/events", params={"after": 2**70}), 400, "bad after"),
        (admin.post("/v1/events/redeliver", json={"event_ids": [2**40]}), 400, "event id"),
        (admin.post("/v1/api-keys", json={"scope": "read", "owner": "q",
                                          "max_sandboxes": 2**40}), 422, "max_sandboxes"),
        (admin.post("/v1/api-keys", json={"scope": "read", "owner": "q",
                                          "max_ttl_s": 2**70}), 422, "max_ttl_s"),
        (admin.delete("/v1/api-keys/key-%00"), 404, "no API key"),
    ]
    for answer, status, mention in cases:
        assert_plain(answer, status, mention)
    assert rows(store) == before
    # the sandbox a NUL-suffixed id would have named is still there
    assert writer.get(f"/v1/sandboxes/{box}").json()["state"] == "running"


def test_the_same_refusals_from_the_cli(service, store, stub_named, sbx: SbxRunner):
    env = cli_env(store)
    assert sbx("api-keys", "ls", env=env).code == 0  # the schema is made
    before = rows(store)
    for argv, extra, mention in [
        (["create", "--profile", stub_named], {"SBX_ACTOR": "a" * 300}, "SBX_ACTOR"),
        (["create", "--profile", stub_named], {"SBX_HOST_NAME": "h" * 300}, "SBX_HOST_NAME"),
        (["api-keys", "create", "--scope", "read", "--owner", "q", "--max-sandboxes",
          str(2**40)], {}, "max_sandboxes"),
        (["api-keys", "create", "--scope", "read", "--owner", "q", "--max-ttl", "36500d"],
         {}, "max_ttl"),
        (["events", "redeliver", str(2**70)], {}, "event id"),
    ]:
        result = sbx(*argv, env={**env, **extra})
        assert result.code == 2, (argv, result.err)
        assert result.err.count("\n") == 1 and mention in result.err, result.err
        assert not [m for m in SQL_MARKS if m in result.err], result.err
    assert rows(store) == before


def _refuse_creates(url: str) -> None:
    """The database itself refuses every new sandbox row, as a constraint would."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql("CREATE TRIGGER refuse BEFORE INSERT ON sandboxes "
                                 "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
        else:
            conn.exec_driver_sql("CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN "
                                 "RAISE EXCEPTION 'refused by the test'; END $$ "
                                 "LANGUAGE plpgsql")
            conn.exec_driver_sql("CREATE TRIGGER refuse BEFORE INSERT ON sandboxes "
                                 "FOR EACH ROW EXECUTE FUNCTION refuse()")
    engine.dispose()


def test_a_write_the_database_refuses_is_one_line_and_the_sql_stays_in_the_log(
        service, store, stub_named, sbx: SbxRunner, caplog):
    writer = client(service, "write", "writer")
    assert writer.post("/v1/sandboxes", json={"profile": stub_named}).status_code == 201
    _refuse_creates(store)
    before = rows(store)

    with caplog.at_level("WARNING", logger="sbx.serve"):
        answer = writer.post("/v1/sandboxes", json={"profile": stub_named, "task": "refused"})
    message = assert_plain(answer, 500)
    assert message == "the database refused the write (refused by the test)"
    assert "INSERT INTO sandboxes" in caplog.text  # the operator's log has it all

    result = sbx("create", "--profile", stub_named, env=cli_env(store))
    assert (result.code, result.err) == (
        1, "sbx: the database refused the write (refused by the test)\n")
    assert rows(store) == before
