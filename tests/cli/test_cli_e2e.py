"""The CLI contract (docs/cli.md) end to end: the real `sbx` in subprocesses, the real
Docker engine, one SBX_HOME per test."""

from __future__ import annotations

import os
import re
import sqlite3
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from support import RUN_ID, RUN_LABEL, containers_of, one_json, write_profile

pytestmark = pytest.mark.docker

ID_RE = re.compile(r"^sbx-[0-9a-z]{26}$")
TIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")
SANDBOX_FIELDS = {"id", "name", "profile", "backend", "backend_ref", "state", "owner", "task",
                  "labels", "created_at", "deadline", "hard_deadline", "last_activity_at"}
TIME_FIELDS = ("created_at", "deadline", "hard_deadline", "last_activity_at")


def parse_time(text: str) -> datetime:
    assert TIME_RE.match(text), f"not ISO 8601 UTC with Z: {text!r}"
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def ids_of(result) -> list[str]:
    assert result.code == 0, result.err
    docs = one_json(result.out)
    assert isinstance(docs, list)
    return [d["id"] for d in docs]


# -- create --json --------------------------------------------------------------------------


def test_create_json_is_one_sandbox_object(sbx):
    result = sbx("create", "--label", RUN_LABEL, "--json")
    assert result.code == 0, result.err
    box = one_json(result.out)
    assert isinstance(box, dict)
    assert SANDBOX_FIELDS <= set(box), SANDBOX_FIELDS - set(box)
    assert ID_RE.match(box["id"]), box["id"]
    assert box["profile"] == "default"
    assert box["backend"] == "docker"
    assert box["backend_ref"]
    assert box["state"] == "running"
    assert box["labels"] == {"sbx-test-run": RUN_ID}
    for field in TIME_FIELDS:
        parse_time(box[field])
    created = parse_time(box["created_at"])
    assert parse_time(box["deadline"]) - created == timedelta(minutes=30)
    assert parse_time(box["hard_deadline"]) - created == timedelta(hours=4)
    assert parse_time(box["last_activity_at"]) >= created


def test_create_options_round_trip(sbx):
    box = sbx.create("--ttl", "45m", "--name", "round-trip-1", "--owner", "alice@example",
                     "--task", "TICKET-42 run the suite", "--label", "team=infra",
                     "--label", "tier=gold")
    created = parse_time(box["created_at"])
    assert parse_time(box["deadline"]) - created == timedelta(minutes=45)
    assert parse_time(box["hard_deadline"]) - created == timedelta(hours=4)
    assert box["name"] == "round-trip-1"
    assert box["owner"] == "alice@example"
    assert box["task"] == "TICKET-42 run the suite"
    assert box["labels"] == {"sbx-test-run": RUN_ID, "team": "infra", "tier": "gold"}

    shown = sbx("show", box["id"], "--json")
    assert shown.code == 0, shown.err
    again = one_json(shown.out)
    for field in ("id", "name", "owner", "task", "labels", "deadline", "hard_deadline",
                  "created_at", "backend_ref"):
        assert again[field] == box[field], field


def test_create_ttl_in_combined_units(sbx):
    box = sbx.create("--ttl", "1h30m")
    created = parse_time(box["created_at"])
    assert parse_time(box["deadline"]) - created == timedelta(hours=1, minutes=30)


# -- id resolution --------------------------------------------------------------------------


def test_id_full_prefix_and_name_resolve_everywhere(sbx):
    box = sbx.create("--name", "resolver")
    other = sbx.create()  # a second sandbox, so prefixes must really be unique ones
    sid = box["id"]
    # The ULID's last characters are random: a prefix that drops only them is unique.
    refs = [sid, sid[:-3], sid[4:-3], "resolver"]
    for ref in refs:
        shown = sbx("show", ref, "--json")
        assert shown.code == 0, (ref, shown.err)
        assert one_json(shown.out)["id"] == sid, ref
        ran = sbx("exec", ref, "--", "sh", "-c", "echo $0", "hi")
        assert (ran.code, ran.out) == (0, "hi\n"), (ref, ran.err)

    gone = sbx("destroy", sid[4:-3])
    assert gone.code == 0, gone.err
    assert sid in gone.out
    by_name = sbx("destroy", "resolver")
    assert by_name.code == 0, by_name.err
    assert "already destroyed" in by_name.out
    assert one_json(sbx("show", other["id"], "--json").out)["state"] == "running"


def test_destroy_by_name_and_by_prefix(sbx):
    named = sbx.create("--name", "to-go")
    plain = sbx.create()
    result = sbx("destroy", "to-go", plain["id"][:-3])
    assert result.code == 0, result.err
    listed = ids_of(sbx("ls", "--all", "--json"))
    assert set(listed) == {named["id"], plain["id"]}
    states = {b["id"]: b["state"] for b in one_json(sbx("ls", "--all", "--json").out)}
    assert states == {named["id"]: "destroyed", plain["id"]: "destroyed"}


def test_a_name_is_taken_only_while_its_sandbox_lives(sbx, docker_api):
    first = sbx.create("--name", "shared-name")
    install = (sbx.home / "install-id").read_text().strip()

    def containers():
        return sorted(c["Id"] for c in containers_of(docker_api, install))

    def inventory():  # everything but the countdown, which ticks
        return [{k: v for k, v in r.items() if k != "ttl_left_s"}
                for r in one_json(sbx("ls", "--all", "--json").out)]

    before_ls, before_containers = inventory(), containers()
    taken = sbx("create", "--name", "shared-name")
    assert taken.code == 4, (taken.code, taken.err)
    assert "shared-name" in taken.err
    assert inventory() == before_ls
    assert containers() == before_containers

    assert sbx("destroy", "shared-name").code == 0
    second = sbx.create("--name", "shared-name")
    shown = sbx("show", "shared-name", "--json")
    assert shown.code == 0, shown.err
    assert one_json(shown.out)["id"] == second["id"] != first["id"]


def test_ambiguous_prefix_is_bad_input_naming_the_candidates(sbx):
    a = sbx.create()
    b = sbx.create()
    common = os.path.commonprefix([a["id"], b["id"]])
    assert len(common) < len(a["id"])
    for ref in {common, common.removeprefix("sbx-")} - {""}:
        for argv in (["show", ref], ["exec", ref, "--", "sh", "-c", "echo no"],
                     ["destroy", ref]):
            result = sbx(*argv)
            assert result.code == 2, (argv, result.code, result.err)
            assert a["id"] in result.err and b["id"] in result.err, result.err
            assert len(result.err.strip().splitlines()) == 1, result.err
    states = {x["state"] for x in one_json(sbx("ls", "--json").out)}
    assert states == {"running"}


def test_unknown_id_is_exit_3(sbx):
    sbx.create()
    for argv in (["show", "sbx-zzzzzzzz"], ["exec", "zzzzzzzz", "--", "sh", "-c", "echo"],
                 ["destroy", "no-such-name"], ["logs", "sbx-zzzz"],
                 ["events", "sbx-zzzz"]):
        result = sbx(*argv)
        assert result.code == 3, (argv, result.code, result.err)
        assert argv[1] in result.err


# -- ls -------------------------------------------------------------------------------------


def test_ls_filters(sbx, tmp_path):
    a = sbx.create("--label", "team=red")
    b = sbx.create("--label", "team=blue", "--label", "tier=gold")
    c = sbx.create("--label", "team=red", "--label", "tier=gold")
    assert sbx("destroy", c["id"]).code == 0

    listed = sbx("ls", "--json")
    assert ids_of(listed) == [a["id"], b["id"]]  # destroyed hidden, oldest first
    assert ids_of(sbx("ls", "--all", "--json")) == [a["id"], b["id"], c["id"]]
    assert ids_of(sbx("ls", "--state", "destroyed", "--json")) == [c["id"]]
    assert ids_of(sbx("ls", "--state", "running", "--json")) == [a["id"], b["id"]]
    assert ids_of(sbx("ls", "--label", "team=red", "--json")) == [a["id"]]
    assert ids_of(sbx("ls", "--all", "--label", "team=red", "--json")) == [a["id"], c["id"]]
    assert ids_of(sbx("ls", "--all", "--label", "team=red", "--label", "tier=gold",
                      "--json")) == [c["id"]]
    assert ids_of(sbx("ls", "--label", "team=green", "--json")) == []
    assert ids_of(sbx("ls", "--backend", "docker", "--json")) == [a["id"], b["id"]]
    assert ids_of(sbx("ls", "--backend", "nope", "--json")) == []

    human = sbx("ls")
    assert human.code == 0
    assert a["id"] in human.out and b["id"] in human.out and c["id"] not in human.out


def test_ls_backend_filter_separates_backends(sbx, tmp_path):
    docker_box = sbx.create()
    # The in-process test double only provides a second backend value to filter on.
    stub_profile = write_profile(tmp_path, "stubby", "backend: stub\n")
    stub_box = sbx.create("--profile-file", str(stub_profile))
    assert stub_box["backend"] == "stub"
    assert ids_of(sbx("ls", "--backend", "docker", "--json")) == [docker_box["id"]]
    assert ids_of(sbx("ls", "--backend", "stub", "--json")) == [stub_box["id"]]
    assert ids_of(sbx("ls", "--json")) == [docker_box["id"], stub_box["id"]]


def test_ls_json_is_an_array_even_when_empty(sbx):
    result = sbx("ls", "--json")
    assert result.code == 0, result.err
    assert one_json(result.out) == []
    box = sbx.create()
    docs = one_json(sbx("ls", "--json").out)
    assert isinstance(docs, list) and len(docs) == 1
    assert SANDBOX_FIELDS <= set(docs[0])
    assert docs[0]["id"] == box["id"]


# -- no tty ---------------------------------------------------------------------------------


def test_sbx_without_a_tty_prints_help(sbx):
    result = sbx(input="")
    assert result.code == 0, result.err
    assert "Usage:" in result.out
    for name in ("create", "ls", "destroy", "exec", "events"):
        assert re.search(rf"^\s+{name}\b", result.out, re.M), name


# -- events ---------------------------------------------------------------------------------


def lifecycle(sbx) -> str:
    box = sbx.create()
    assert sbx("exec", box["id"], "--", "sh", "-c", "echo x").code == 0
    assert sbx("destroy", box["id"]).code == 0
    return box["id"]


def verify(sbx):
    return sbx("events", "verify")


def test_events_list_the_lifecycle_in_order(sbx):
    sid = lifecycle(sbx)
    result = sbx("events", sid, "--json")
    assert result.code == 0, result.err
    events = one_json(result.out)
    assert [e["type"] for e in events] == [
        "sandbox.creating", "sandbox.created", "sandbox.exec",
        "sandbox.destroying", "sandbox.destroyed"]
    assert all(e["sandbox_id"] == sid for e in events)
    ids = [e["id"] for e in events]
    assert ids == sorted(ids)
    times = [parse_time(e["time"]) for e in events]
    assert times == sorted(times)

    ok = verify(sbx)
    assert ok.code == 0, ok.err


def tamper(home: Path, sql: str) -> None:
    conn = sqlite3.connect(home / "sbx.db")
    try:
        with conn:
            changed = conn.execute(sql).rowcount
        assert changed == 1, sql
    finally:
        conn.close()


@pytest.mark.parametrize(("sql", "named"), [
    ("UPDATE events SET payload_json='{}' WHERE id=2", r"\bevent 2\b"),
    ("DELETE FROM events WHERE id=3", r"\b3\b"),
], ids=["a-changed-row", "a-deleted-middle-row"])
def test_events_verify_detects_tampering_naming_the_event(sbx, sql, named):
    lifecycle(sbx)
    assert verify(sbx).code == 0
    tamper(sbx.home, sql)
    result = verify(sbx)
    assert result.code == 1, (result.out, result.err)
    assert re.search(named, result.err), result.err


def test_events_verify_json(sbx):
    lifecycle(sbx)
    good = sbx("events", "verify", "--json")
    assert good.code == 0
    assert one_json(good.out)["intact"] is True
    tamper(sbx.home, "UPDATE events SET actor='mallory' WHERE id=4")
    bad = sbx("events", "verify", "--json")
    assert bad.code == 1
    report = one_json(bad.out)
    assert report["intact"] is False
    assert report["broken_at"] == 4


# -- errors under --json --------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "code"), [
    (["show", "sbx-zzzzzzzz", "--json"], 3),
    (["destroy", "sbx-zzzzzzzz", "--json"], 3),
    (["create", "--profile", "nope", "--json"], 3),
    (["create", "--ttl", "abc", "--json"], 2),
    (["create", "--label", "Bad=1", "--json"], 2),
    (["create", "--ttl", "5h", "--json"], 2),
    (["ls", "--state", "bogus", "--json"], 2),
    (["events", "sbx-zzzzzzzz", "--json"], 3),
])
def test_errors_under_json_are_one_object(sbx, argv, code):
    result = sbx(*argv)
    assert result.code == code, (result.code, result.out, result.err)
    doc = one_json(result.out)
    assert set(doc) == {"error"}, doc
    assert doc["error"]["code"] == code
    assert isinstance(doc["error"]["message"], str) and doc["error"]["message"]


def test_json_error_when_engine_unreachable(sbx, tmp_path):
    result = sbx("create", "--json",
                 env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert result.code == 5
    doc = one_json(result.out)
    assert doc["error"]["code"] == 5
    assert "DOCKER_HOST" in doc["error"]["message"] or "dockerd" in doc["error"]["message"]


def test_unknown_flag_under_json_is_one_error_object(sbx):
    result = sbx("create", "--json", "--no-such-flag")
    assert result.code == 2
    doc = one_json(result.out)
    assert doc["error"]["code"] == 2
    assert "--no-such-flag" in doc["error"]["message"]


def test_destroy_json_reports_what_happened(sbx):
    box = sbx.create()
    first = sbx("destroy", box["id"], "--json")
    assert first.code == 0, first.err
    assert box["id"] in one_json(first.out)["destroyed"]
    second = sbx("destroy", box["id"], "--json")
    assert second.code == 0, second.err
    assert one_json(second.out)["destroyed"] == []


# -- the database file ---------------------------------------------------------------------


def test_database_file_is_private(sbx):
    sbx.create()
    db = sbx.home / "sbx.db"
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    for extra in sbx.home.glob("sbx.db-*"):  # WAL and shared-memory files, if left
        assert stat.S_IMODE(extra.stat().st_mode) & 0o077 == 0, extra
    assert stat.S_IMODE(sbx.home.stat().st_mode) & 0o077 == 0
