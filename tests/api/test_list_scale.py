"""Listing a large inventory (issue 36): 2,000 seeded sandboxes listed through the library,
`sbx ls --json` and the service (a page by default, every one with `limit=all`, streamed)
give every sandbox once, each with the fields reading it alone gives. Timings live in
bench/, not here."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from support import table_rows

import sandboxer
from tests.store.test_postgres import pg_url  # noqa: F401 (the fixture)

ROWS = 2000
LISTED_PAGE = 100  # the service's page when no limit is given (docs/service.md)


def _seed(home: Path) -> dict[str, dict]:
    """ROWS sandbox rows on the stub backend straight into the store, in every shape a view
    reads: names or none, idle timeouts (some idle deadlines before the deadline, some
    after), gVisor isolation, paused, destroyed, warm pool members claimed and not, two
    owners, label sets that repeat. Returns the rows by id."""
    import sqlalchemy as sa

    from sandboxer.core.rules import settings
    from sandboxer.core.rules.clock import to_iso
    from sandboxer.core.rules.ids import new_sandbox_id
    from sandboxer.core.store.db import Database
    from sandboxer.core.store.models import Sandbox

    db = Database(settings.database_url())
    db.migrate()
    now = datetime.now(UTC)
    rows = {}
    for i in range(ROWS):
        sid = new_sandbox_id()
        state = ("destroyed" if i % 11 == 0 else "paused" if i % 5 == 0 else "running")
        rows[sid] = dict(
            id=sid, name=f"box-{i}" if i % 3 == 0 else None, profile="stubby",
            profile_json="{}", backend="stub", backend_ref=f"stub-{sid}",
            install_id="inst-scale", host="scale-host", state=state,
            owner="alice" if i % 2 else "bob",
            labels_json=json.dumps({"team": f"t{i % 7}", "n": str(i % 2)}) if i % 13 else "{}",
            isolation="gvisor" if i % 17 == 0 else "container",
            pool="stubby" if i % 19 == 0 else None,
            launch=("warm" if i % 38 == 0 else None) if i % 19 == 0 else None,
            # a few share a created_at: the order (and the cursor) falls back on the id
            created_at=to_iso(now - timedelta(hours=1) + timedelta(microseconds=i // 3)),
            started_at=to_iso(now - timedelta(minutes=59)),
            deadline=to_iso(now + timedelta(minutes=30 + i % 60)),
            hard_deadline=to_iso(now + timedelta(hours=3)),
            last_activity_at=to_iso(now - timedelta(minutes=i % 50)),
            idle_timeout_s=(600 + 60 * (i % 80)) if i % 4 else None,
            ended_at=to_iso(now) if state == "destroyed" else None,
            error="gone" if state == "destroyed" else None, fence=0)
    with db.write() as conn:
        conn.execute(sa.insert(Sandbox.__table__), list(rows.values()))
    db.dispose()
    return rows


def _listed(row: dict, include_destroyed: bool = False) -> bool:
    """Whether a listing shows the row: users' sandboxes, not an unclaimed pool member."""
    return ((include_destroyed or row["state"] != "destroyed")
            and (row["pool"] is None or row["launch"] is not None))


def _in_order(rows: dict[str, dict], **kwargs) -> list[str]:
    wanted = [r for r in rows.values() if _listed(r, **kwargs)]
    return [r["id"] for r in sorted(wanted, key=lambda r: (r["created_at"], r["id"]))]


def _same(listed: dict, alone: dict, apart_s: float = 0) -> None:
    """A listed view equals the view of the sandbox read alone; ttl_left_s counts down, so
    the two may be a second or two apart, more when they were read `apart_s` apart."""
    a, b = dict(listed), dict(alone)
    left_a, left_b = a.pop("ttl_left_s"), b.pop("ttl_left_s")
    assert a == b
    assert (left_a is None) == (left_b is None)
    if left_a is not None:
        assert abs(left_a - left_b) <= 2 + apart_s


@pytest.fixture
def seeded(sbx_home: Path) -> dict[str, dict]:
    return _seed(sbx_home)


@pytest.fixture(params=["sqlite", "postgresql"])
def seeded_store(request: pytest.FixtureRequest, sbx_home: Path,
                 monkeypatch: pytest.MonkeyPatch) -> dict[str, dict]:
    """The seeded rows in the test's SQLite file, or in a database of its own on the
    PostgreSQL server `make test` starts (the driver's rows differ: psycopg's, not sqlite3's)."""
    if request.param == "postgresql":
        request.applymarker(pytest.mark.postgres)
        monkeypatch.setenv("SBX_DATABASE_URL", request.getfixturevalue("pg_url"))
    return _seed(sbx_home)


def test_the_library_lists_every_sandbox_once_as_reading_it_alone_shows_it(seeded_store):
    seeded = seeded_store
    sbx = sandboxer.Sandboxer(actor="lister")
    try:
        listed_at = time.monotonic()
        boxes = sbx.list()
        assert [b.id for b in boxes] == _in_order(seeded)
        for box in boxes:  # 2,000 reads take seconds on a busy machine
            _same(box.to_dict(), sbx.get(box.id).to_dict(), time.monotonic() - listed_at)
        gvisor = [b for b in boxes if seeded[b.id]["isolation"] == "gvisor"]
        assert gvisor and all(b.isolation == "gvisor" for b in gvisor)
        warm = [b for b in boxes if seeded[b.id]["launch"] == "warm"]
        assert warm and all(b.to_dict()["launch"] == "warm" for b in warm)
        # two records with the same labels hold their own: changing what one's to_dict()
        # gave leaves the other as it was
        first, second = [b for b in boxes if seeded[b.id]["labels_json"]
                         == seeded[boxes[0].id]["labels_json"]][:2]
        first.to_dict()["labels"]["mine"] = "1"
        assert "mine" not in second.labels and "mine" not in second.to_dict()["labels"]

        everything = sbx.list(include_destroyed=True)
        assert [b.id for b in everything] == _in_order(seeded, include_destroyed=True)
        team = sbx.list(labels={"team": "t3"})
        assert [b.id for b in team] == [
            i for i in _in_order(seeded) if json.loads(seeded[i]["labels_json"])
            .get("team") == "t3"]
    finally:
        sbx.close()


def test_listing_again_reads_only_what_changed_and_shows_every_change(seeded_store,
                                                                      monkeypatch):
    """A client keeps its listing from its second call on (core/follow/watch.py
    InventoryMirror): the next list() reads only the rows changed since, from another
    connection too, and gives what a fresh client reading every row gives."""
    import sqlalchemy as sa

    from sandboxer.core.follow.watch import InventoryWatcher
    from sandboxer.core.rules import settings
    from sandboxer.core.rules.clock import to_iso
    from sandboxer.core.store.db import Database
    from sandboxer.core.store.models import Sandbox

    seeded = seeded_store
    reads: list[int] = []  # rows each look read from the database
    real = InventoryWatcher._select
    monkeypatch.setattr(InventoryWatcher, "_select",
                        lambda self, *a: (rows := real(self, *a), reads.append(len(rows)))[0])
    sbx = sandboxer.Sandboxer(actor="lister")
    try:
        first = sbx.list()  # read once, as a one-shot `sbx ls` reads
        assert [b.id for b in first] == _in_order(seeded) and reads == []
        kept = sbx.list()  # the mirror's first look reads every row shown
        assert reads == [sum(r["state"] != "destroyed" for r in seeded.values())]
        kept[0].to_dict()["labels"]["mine"] = "1"  # what a caller does to its copy stays there
        again = sbx.list()
        for mine, before in zip(again, first, strict=True):
            _same(mine.to_dict(), before.to_dict())
        assert "mine" not in again[0].labels
        assert sum(reads[1:]) == 0  # nobody wrote: not a row read again

        shown = _in_order(seeded)
        renamed, destroyed = shown[5], shown[6]
        unclaimed = next(i for i, r in seeded.items() if not _listed(r)
                         and r["state"] != "destroyed")
        early = dict(seeded[renamed], id="sbx-00000000000000000000000000", name="early",
                     created_at=to_iso(datetime.now(UTC) - timedelta(days=1)))
        table = Sandbox.__table__
        db = Database(settings.database_url())  # another connection: another writer
        try:
            with db.write() as conn:
                conn.execute(sa.update(table).where(table.c.id == renamed)
                             .values(name="renamed", labels_json='{"new": "1"}'))
                conn.execute(sa.update(table).where(table.c.id == destroyed)
                             .values(state="destroyed"))
                conn.execute(sa.update(table).where(table.c.id == unclaimed)
                             .values(launch="warm"))
                conn.execute(sa.insert(table), [early])
        finally:
            db.dispose()
        reads.clear()
        changed = sbx.list()
        assert reads == [4]  # the four rows changed, of 2,000
        fresh = sandboxer.Sandboxer(actor="lister")
        try:
            everything = fresh.list()
        finally:
            fresh.close()
        assert [b.id for b in changed] == [b.id for b in everything]
        assert changed[0].id == early["id"] and destroyed not in {b.id for b in changed}
        assert unclaimed in {b.id for b in changed}
        for mine, theirs in zip(changed, everything, strict=True):
            _same(mine.to_dict(), theirs.to_dict())
        assert next(b for b in changed if b.id == renamed).labels == {"new": "1"}
        assert [b.id for b in sbx.list(labels={"new": "1"})] == [renamed]
    finally:
        sbx.close()


def _same_listing(document: bytes, boxes: list) -> None:
    """`list_json()`'s document is the records' to_dict()s, one per line."""
    assert document == b"[]" if not boxes else (
        document.startswith(b"[\n") and document.count(b"\n") == len(boxes) + 1)
    listed = json.loads(document)
    assert [v["id"] for v in listed] == [b.id for b in boxes]
    for view, box in zip(listed, boxes, strict=True):
        _same(view, box.to_dict())


def test_list_json_is_the_document_of_what_list_gives(seeded_store):
    """Read once, then from the mirror, after a change, narrowed, and as a tenant: each time
    the JSON listing is what list() gives, record for record."""
    import sqlalchemy as sa

    from sandboxer.core.rules import settings
    from sandboxer.core.store.db import Database
    from sandboxer.core.store.models import Sandbox

    seeded = seeded_store
    sbx = sandboxer.Sandboxer(actor="lister")
    try:
        cold = sbx.list_json()  # a first listing reads every row
        _same_listing(cold, sbx.list())
        _same_listing(sbx.list_json(), sbx.list())  # from the mirror
        renamed = _in_order(seeded)[3]
        table = Sandbox.__table__
        db = Database(settings.database_url())
        try:
            with db.write() as conn:
                conn.execute(sa.update(table).where(table.c.id == renamed)
                             .values(name="renamed", labels_json='{"new": "1"}'))
        finally:
            db.dispose()
        changed = json.loads(sbx.list_json())
        assert next(v for v in changed if v["id"] == renamed)["labels"] == {"new": "1"}
        _same_listing(sbx.list_json(), sbx.list())
        for narrowed in ({"labels": {"team": "t3"}}, {"state": "paused"},
                         {"include_destroyed": True}, {"backend": "nope"}):
            _same_listing(sbx.list_json(**narrowed), sbx.list(**narrowed))
        assert sbx.list_json(backend="nope") == b"[]"
        alice = sbx.acting_as("alice", tenant=True)
        hers = json.loads(alice.list_json())
        assert hers and {v["owner"] for v in hers} == {"alice"}
        _same_listing(alice.list_json(), alice.list())
    finally:
        sbx.close()


# A process that keeps the listing, then forks a child that lists from it: what the resident
# server does between two `sbx ls` (sandboxer_tui/resident/resident.py). In a fresh Python of
# its own, which has no thread (forking the test's process, which may, would be unsafe).
KEEP_AND_FORK = r"""
import json, os, sys, threading
from sandboxer.core.follow import watch
from sandboxer.core.rules import settings
from sandboxer.core.rules.clock import clock_from_env, to_iso

url = settings.database_url()
assert watch.keep_for_children(url)
assert threading.active_count() == 1, "keeping the listing started a thread"
assert watch.handed_down(url, False, None) is None, "handed down in the process that keeps it"
open_files = []
for fd in os.listdir("/proc/self/fd"):
    try:
        open_files.append(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:  # the listing's own
        pass
sys.stdout.write(json.dumps({"open": open_files}) + "\n")
sys.stdout.flush()
sys.stdin.readline()  # the test changes rows meanwhile
pid = os.fork()
if pid == 0:
    try:
        mirror = watch.handed_down(url, False, None)
        document = mirror.views_json(to_iso(clock_from_env().now()))
        again = watch.handed_down(url, False, None)
        sys.stdout.write(json.dumps({"rows_read": mirror.rows_read, "again": again is None})
                         + "\n")
        sys.stdout.buffer.write(document)
        sys.stdout.flush()
    finally:
        os._exit(0)
os.waitpid(pid, 0)
"""


def _keep_then_fork(change) -> tuple[dict, bytes]:
    """KEEP_AND_FORK in a fresh Python: `change()` runs between the keeping and the fork.
    (what the child said, the listing it wrote)."""
    import subprocess
    import sys

    keeper = subprocess.Popen([sys.executable, "-c", KEEP_AND_FORK], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        said = json.loads(keeper.stdout.readline() or b"null")
        assert said is not None, keeper.stderr.read().decode()[-2000:]
        assert not [f for f in said["open"] if "sbx.db" in f]  # no connection kept open
        change()
        out, err = keeper.communicate(b"go\n", timeout=120)
    finally:
        if keeper.poll() is None:
            keeper.kill()
    assert keeper.returncode == 0, err.decode()[-2000:]
    head, _, document = out.partition(b"\n")
    return json.loads(head), document


def _fresh_listing() -> list:
    fresh = sandboxer.Sandboxer(actor="lister")
    try:
        return fresh.list()
    finally:
        fresh.close()


def test_a_forked_child_lists_from_the_kept_listing_reading_only_what_changed(seeded):
    import sqlalchemy as sa

    from sandboxer.core.rules import settings
    from sandboxer.core.store.db import Database
    from sandboxer.core.store.models import Sandbox

    shown = _in_order(seeded)
    renamed, destroyed = shown[10], shown[11]

    def change() -> None:
        table = Sandbox.__table__
        db = Database(settings.database_url())
        try:
            with db.write() as conn:
                conn.execute(sa.update(table).where(table.c.id == renamed)
                             .values(name="renamed"))
                conn.execute(sa.update(table).where(table.c.id == destroyed)
                             .values(state="destroyed"))
        finally:
            db.dispose()

    child, document = _keep_then_fork(change)
    assert child == {"rows_read": 2, "again": True}  # the two rows changed, of 2,000
    _same_listing(document, _fresh_listing())
    listed = json.loads(document)
    assert destroyed not in {v["id"] for v in listed}
    assert next(v for v in listed if v["id"] == renamed)["name"] == "renamed"


def test_a_database_made_again_is_listed_whole_not_from_the_kept_listing(seeded, sbx_home):
    """The kept position counts in the old file's changes: a new file under the same name
    (removed and made again) is read whole, so no sandbox of the old one shows."""
    def change() -> None:
        for name in ("sbx.db", "sbx.db-wal", "sbx.db-shm"):
            (sbx_home / name).unlink(missing_ok=True)
        _seed(sbx_home)  # 2,000 others, with change_seq counting from 1 again

    child, document = _keep_then_fork(change)
    assert child["rows_read"] >= len(_in_order(seeded)) - 200  # read whole (2,000, shown)
    _same_listing(document, _fresh_listing())
    assert not {v["id"] for v in json.loads(document)} & set(seeded)


def test_only_an_sqlite_listing_is_kept(pg_url):  # noqa: F811 (the fixture)
    """A PostgreSQL URL may name another database in a caller's environment (libpq's
    variables): the server keeps no listing of one."""
    from sandboxer.core.follow.watch import keep_for_children, kept_for_children

    assert keep_for_children(pg_url) is False and kept_for_children() == 0


def test_sbx_ls_through_the_server_lists_what_the_database_holds_then(seeded, sbx):
    """The resident server keeps `sbx ls`'s listing between commands; each `sbx ls` through
    it still lists what the database holds when it runs, a change made in between too."""
    import os
    import signal

    import sqlalchemy as sa
    from support import Launcher

    from sandboxer.core.rules import settings
    from sandboxer.core.store.db import Database
    from sandboxer.core.store.models import Sandbox
    from tests.reliability.test_reliability import wait_until

    via = Launcher(sbx.home, sbx.cwd)
    started = via("server", "start", "--json")
    assert started.code == 0, started.err
    pid = started.json()["pid"]
    try:
        assert started.json()["listings_kept"] == 0
        first = via("ls", "--json")
        assert first.code == 0, first.err
        assert [v["id"] for v in first.json()] == _in_order(seeded)
        wait_until(lambda: via.status()["listings_kept"] == 1, 60, "the server kept the listing")
        fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        assert not [f for f in fds if "sbx.db" in f]  # no connection held between commands
        shown = _in_order(seeded)
        table = Sandbox.__table__
        db = Database(settings.database_url())
        try:
            with db.write() as conn:
                conn.execute(sa.update(table).where(table.c.id == shown[0])
                             .values(state="destroyed"))
                conn.execute(sa.update(table).where(table.c.id == shown[1])
                             .values(name="renamed"))
        finally:
            db.dispose()
        served = via.status()["served"]
        second = via("ls", "--json")
        assert second.code == 0, second.err
        assert via.status()["served"] == served + 1  # the server ran it
        listed = second.json()
        assert [v["id"] for v in listed] == shown[1:]
        assert listed[0]["name"] == "renamed"
        table_view = via("ls")
        assert table_view.code == 0 and "renamed" in table_view.out
        assert shown[0] not in table_view.out
    finally:
        via("server", "stop")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_sbx_ls_json_lists_what_the_library_lists(seeded, sbx):
    result = sbx("ls", "--json")
    assert result.code == 0, result.err
    listed = result.json()
    library = sandboxer.Sandboxer(actor="lister")
    try:
        alone = {b.id: b.to_dict() for b in library.list()}
    finally:
        library.close()
    assert [v["id"] for v in listed] == _in_order(seeded)
    for view in listed:
        _same(view, alone[view["id"]])


def test_the_service_pages_by_default_and_streams_every_sandbox_with_limit_all(seeded, sbx_home):
    from tests.service.live import LiveService

    live = LiveService(sbx_home).start()
    try:
        token = live.key()  # an admin key: every owner's sandboxes
        with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {token}"},
                          timeout=60) as http:
            first = http.get("/v1/sandboxes").json()
            assert len(first["items"]) == LISTED_PAGE and first["next_cursor"]
            paged, cursor = list(first["items"]), first["next_cursor"]
            while cursor is not None:
                page = http.get("/v1/sandboxes", params={"cursor": cursor}).json()
                assert len(page["items"]) <= LISTED_PAGE
                paged += page["items"]
                cursor = page["next_cursor"]
            assert [v["id"] for v in paged] == _in_order(seeded)

            with http.stream("GET", "/v1/sandboxes", params={"limit": "all"}) as answer:
                assert answer.status_code == 200
                assert answer.headers["content-type"] == "application/json"
                assert "content-length" not in answer.headers  # sent as it is encoded
                streamed = json.loads(answer.read())
            assert streamed["next_cursor"] is None
            assert len(streamed["items"]) == len(paged)
            for one, other in zip(streamed["items"], paged, strict=True):
                _same(one, other)
            odd = http.get("/v1/sandboxes", params={"limit": "all", "label": "n=1",
                                                    "include_destroyed": True}).json()
            assert [v["id"] for v in odd["items"]] == [
                i for i in _in_order(seeded, include_destroyed=True)
                if json.loads(seeded[i]["labels_json"]).get("n") == "1"]
            # a read key sees its owner's sandboxes only, streamed or paged
            alice = {"Authorization": f"Bearer {live.key('read', owner='alice')}"}
            hers = http.get("/v1/sandboxes", params={"limit": "all"}, headers=alice).json()
            assert [v["id"] for v in hers["items"]] == [
                i for i in _in_order(seeded) if seeded[i]["owner"] == "alice"]
            assert {v["owner"] for v in http.get("/v1/sandboxes", headers=alice).json()[
                "items"]} == {"alice"}

        # the library over the service lists everything too
        remote = sandboxer.Sandboxer(url=live.url, token=token)
        try:
            remote_boxes = remote.list()
        finally:
            remote.close()
        assert [b.id for b in remote_boxes] == [v["id"] for v in paged]
        for box, view in zip(remote_boxes, streamed["items"], strict=True):
            _same(box.to_dict(), view)
        remote = sandboxer.Sandboxer(url=live.url, token=live.key("read", owner="alice"))
        try:  # the JSON listing over the service: the tenant's, as list() gives it
            _same_listing(remote.list_json(), remote.list())
            assert {v["owner"] for v in json.loads(remote.list_json())} == {"alice"}
        finally:
            remote.close()
    finally:
        live.stop()


@pytest.mark.parametrize("query, status, says", [
    ({"limit": "all", "cursor": "abc"}, 400, "limit=all lists every sandbox from the first"),
    ({"limit": "0"}, 422, "limit"),
    ({"limit": "1001"}, 422, "limit"),
    ({"limit": "every"}, 422, "limit"),
])
def test_a_bad_limit_is_refused_in_one_line_and_changes_nothing(seeded, sbx_home, query, status,
                                                                says):
    from tests.service.live import LiveService

    before = table_rows(sbx_home, "sandboxes")
    live = LiveService(sbx_home).start()
    try:
        answer = httpx.get(f"{live.url}/v1/sandboxes", params=query, timeout=60,
                           headers={"Authorization": f"Bearer {live.key()}"})
    finally:
        live.stop()
    assert answer.status_code == status
    message = answer.json()["error"]["message"]
    assert says in message and "\n" not in message and "Traceback" not in message
    assert table_rows(sbx_home, "sandboxes") == before
