"""`watch()` reads only what changed since its last look (docs/design.md, "Watching the
inventory"): an add, a change of any public column (by the library, or by a writer that
writes no event), a destroy, on SQLite and PostgreSQL, in process and over a service; one
tenant never sees another's changes; at 10,000 sandboxes a change of one row is one row read
and one record sent."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

import sandboxer
from sandboxer import State
from sandboxer.core.follow.watch import InventoryWatcher
from sandboxer.core.rules.clock import to_iso
from sandboxer.core.rules.views import VIEW_COLUMNS
from tests.service.live import LiveService
from tests.store.test_postgres import pg_url  # noqa: F401 (a fixture)

STORES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(params=STORES)
def database_url(request, sbx_home: Path, monkeypatch) -> str:
    """The store of the test: SQLite in SBX_HOME, or a PostgreSQL database of its own."""
    if request.param == "sqlite":
        return f"sqlite:///{sbx_home / 'sbx.db'}"
    url = request.getfixturevalue("pg_url")
    monkeypatch.setenv("SBX_DATABASE_URL", url)  # the service's client and its keys too
    return url


@pytest_asyncio.fixture(params=["local", "remote"])
async def watcher_client(request, database_url, sbx_home):
    """(make a client, as `owner` when named; the admin client; the live service or None):
    in process, or clients of a live service on 127.0.0.1 (a read key of that owner)."""
    if request.param == "local":
        admin = sandboxer.AsyncSandboxer(home=sbx_home, database_url=database_url,
                                         actor="api-test")

        def make(owner: str | None = None) -> sandboxer.AsyncSandboxer:
            if owner is None:
                return sandboxer.AsyncSandboxer(home=sbx_home, database_url=database_url,
                                                actor="watcher")
            return admin.acting_as(owner, tenant=True)

        try:
            yield make, admin, None
        finally:
            await admin.close()
        return
    live = LiveService(sbx_home).start()
    admin = sandboxer.AsyncSandboxer(url=live.url, token=live.key())

    def make_remote(owner: str | None = None) -> sandboxer.AsyncSandboxer:
        return sandboxer.AsyncSandboxer(url=live.url, token=live.key(
            "admin" if owner is None else "read", owner=owner or "api-test"))

    try:
        yield make_remote, admin, live
    finally:
        await admin.close()
        live.stop()


@contextmanager
def raw(database_url: str) -> Iterator[object]:
    """A DB-API connection of another writer, one that writes no event."""
    if database_url.startswith("sqlite"):
        conn = sqlite3.connect(database_url.removeprefix("sqlite:///"))
    else:
        import psycopg

        conn = psycopg.connect(database_url.replace("postgresql+psycopg", "postgresql"))
    try:
        yield conn
        conn.commit()
    finally:
        conn.close()


def mark(database_url: str) -> str:
    return "?" if database_url.startswith("sqlite") else "%s"


def new_values() -> dict[str, object]:
    """A new value for each public column but the id, as a writer might set it."""
    later = to_iso(datetime.now(UTC) + timedelta(minutes=7))
    return {"name": "renamed", "profile": "other-profile", "backend_ref": "ref-2",
            "state": "paused", "owner": "someone-else", "task": "a new task",
            "labels_json": '{"team": "blue"}', "install_id": "install-2", "host": "host-2",
            "created_at": later, "started_at": later, "deadline": later,
            "hard_deadline": later, "last_activity_at": later, "idle_timeout_s": 99,
            "ended_at": later, "error": "it broke", "launch": "warm", "pool": "a-pool",
            "backend": "another", "isolation": "gvisor"}


async def test_a_watch_sees_an_add_a_change_of_each_public_column_and_a_destroy(
        watcher_client, database_url, stub_profile):
    make, admin, _ = watcher_client
    assert set(new_values()) == set(VIEW_COLUMNS) - {"id"}  # every public column is tried
    async with make() as sbx, sbx.watch() as watch:
        assert not (await watch.read()).sandboxes
        box = await admin.create(stub_profile, name="watched", owner="api-test")
        added = await watch.read()
        assert [b.id for b in added.added] == [box.id] and not added.changed
        before = box.deadline
        await box.extend("10m")
        moved = await watch.read()
        assert [b.id for b in moved.changed] == [box.id]
        assert moved.changed[0].deadline - before == timedelta(minutes=10)
        seen = moved.changed[0].to_dict()
        for column, value in new_values().items():
            with raw(database_url) as conn:
                conn.execute(f"UPDATE sandboxes SET {column} = {mark(database_url)} "
                             f"WHERE id = {mark(database_url)}", (value, box.id))
            change = await watch.read()
            assert [b.id for b in change.changed] == [box.id], column
            now = change.changed[0].to_dict()
            field = column.removesuffix("_json")
            assert field not in seen or now[field] != seen[field], column
            seen = now
            assert not await watch.read(), column  # told once
        with raw(database_url) as conn:  # its backend again, and it is alive
            conn.execute(f"UPDATE sandboxes SET backend = 'stub', state = 'running', "
                         f"ended_at = NULL, pool = NULL WHERE id = {mark(database_url)}",
                         (box.id,))
        assert [b.id for b in (await watch.read()).changed] == [box.id]
        await admin.destroy(box.id)
        gone = await watch.read()
        assert gone.removed == (box.id,) and box.id not in gone.sandboxes


async def test_activity_and_a_destroy_in_the_view_with_destroyed_ones(watcher_client,
                                                                     stub_profile):
    make, admin, _ = watcher_client
    async with make() as sbx, sbx.watch(include_destroyed=True) as watch:
        box = await admin.create(stub_profile, owner="api-test")
        first = (await watch.read()).sandboxes[box.id].last_activity_at
        await box.touch()
        touched = await watch.read()
        assert [b.id for b in touched.changed] == [box.id]
        assert touched.changed[0].last_activity_at > first
        await box.destroy()
        ended = await watch.read()
        assert [(b.id, b.state) for b in ended.changed] == [(box.id, State.DESTROYED)]
        assert not ended.removed
        watch.include_destroyed = False
        hidden = await watch.read()
        assert hidden.removed == (box.id,) and not hidden.sandboxes


async def test_another_tenants_changes_never_reach_a_watch(watcher_client, stub_profile):
    make, admin, _ = watcher_client
    async with make("alice") as alice, alice.watch() as watch:
        assert not (await watch.read()).sandboxes
        bobs = await admin.create(stub_profile, owner="bob")
        await bobs.extend("5m")
        assert not await watch.read()
        await bobs.destroy()
        assert not await watch.read()
        hers = await admin.create(stub_profile, owner="alice")
        seen = await watch.read()
        assert [b.id for b in seen.added] == [hers.id] and list(seen.sandboxes) == [hers.id]


def seed(database_url: str, template_id: str, count: int) -> None:
    """`count` more sandboxes, copies of one made through the library, inserted with SQL."""
    with raw(database_url) as conn:
        cursor = conn.cursor()
        cursor.execute(f"SELECT * FROM sandboxes WHERE id = {mark(database_url)}",
                       (template_id,))
        names = [d[0] for d in cursor.description if d[0] != "change_seq"]
        row = dict(zip([d[0] for d in cursor.description], cursor.fetchone(), strict=True))
        marks = ", ".join([mark(database_url)] * len(names))
        rows = [tuple({**row, "id": f"sbx-{uuid.uuid4().hex[:12]}", "name": None}[n]
                      for n in names) for _ in range(count)]
        cursor.executemany(f"INSERT INTO sandboxes ({', '.join(names)}) VALUES ({marks})",
                           rows)


async def test_at_ten_thousand_sandboxes_a_change_of_one_is_one_row(
        watcher_client, database_url, stub_profile, monkeypatch):
    make, admin, live = watcher_client
    first = await admin.create(stub_profile, owner="api-test")
    seed(database_url, first.id, 9_999)
    read = []  # rows each look of a watcher read from the database (this process's)
    real = InventoryWatcher._select
    monkeypatch.setattr(InventoryWatcher, "_select",
                        lambda self, *a: (rows := real(self, *a), read.append(len(rows)))[0])
    async with make() as sbx, sbx.watch() as watch:
        assert len((await watch.read()).sandboxes) == 10_000
        await first.extend("1m")
        read.clear()
        change = await watch.read()
        assert [b.id for b in change.changed] == [first.id] and not change.added
        assert read == [1]  # one row read, of 10,000
        assert len(change.sandboxes) == 10_000
    if live is not None:  # and one record sent over the service
        token = live.key("read")
        with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {token}"},
                          timeout=30) as http:
            position = http.get("/v1/inventory/changes").json()["position"]
            await first.touch()
            answer = http.get("/v1/inventory/changes", params={"since": position}).json()
            assert (answer["reset"], [r["id"] for r in answer["changed"]]) == (False,
                                                                              [first.id])


async def test_changes_since_a_position_that_is_not_one_is_refused(sbx_home, stub_profile):
    live = LiveService(sbx_home).start()
    try:
        async with sandboxer.AsyncSandboxer(url=live.url, token=live.key()) as admin:
            box = await admin.create(stub_profile)
        token = live.key("read")
        with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {token}"},
                          timeout=30) as http:
            position = http.get("/v1/inventory/changes").json()["position"]
            bad = http.get("/v1/inventory/changes",
                           params={"since": "x; DROP TABLE sandboxes"})
            assert bad.status_code == 400
            assert "bad since 'x; DROP TABLE sandboxes'" in bad.json()["error"]["message"]
            assert "Traceback" not in bad.text
            after = http.get("/v1/inventory/changes", params={"since": position}).json()
            assert after == {"position": position, "reset": False, "changed": [],
                             "removed": []}  # the refusal changed nothing
            old = http.get("/v1/inventory/changes",
                           params={"since": "an-earlier-run.3"}).json()
            assert old["reset"] and [r["id"] for r in old["changed"]] == [box.id]
        assert httpx.get(f"{live.url}/v1/inventory/changes").status_code == 401
    finally:
        live.stop()
