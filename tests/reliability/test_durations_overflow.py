"""A duration too long for the calendar, and a JSON `true` where a duration is asked, are bad
input (docs/reliability.md §14): over HTTP a 4xx `bad_input` naming the field, in the CLI
exit 2 with one line; nothing is written and no deadline moves. Before, "99999999999999d"
was an OverflowError (a 500, exit 1) and `{"ttl": true}` made a sandbox of one second."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import table_rows, write_profile

from tests.service.conftest import api, live, stub_named  # noqa: F401 (fixtures)

HUGE = "99999999999999d"


def everything(home: Path) -> dict:
    return {t: table_rows(home, t) for t in ("sandboxes", "events")}


def refused(answer, status: int, field: str) -> None:
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert (error["kind"], error["code"]) == ("bad_input", 2), answer.text
    assert field in error["message"] and "\n" not in error["message"], error
    assert "Traceback" not in answer.text and "Overflow" not in answer.text


def test_http_refuses_overflowing_and_boolean_durations_and_writes_nothing(
        api, sbx_home, stub_named):  # noqa: F811
    box = api.post("/v1/sandboxes", json={"profile": stub_named}).json()
    before = everything(sbx_home)

    refused(api.post("/v1/sandboxes", json={"profile": stub_named, "ttl": HUGE}), 400, "ttl")
    refused(api.post("/v1/sandboxes", json={"profile": stub_named, "ttl": 1e300}), 400, "ttl")
    refused(api.post("/v1/sandboxes", json={"profile": stub_named, "ttl": True}), 422, "ttl")
    refused(api.post(f"/v1/sandboxes/{box['id']}/extend", json={"by": HUGE}), 400, "by")
    refused(api.post(f"/v1/sandboxes/{box['id']}/extend", json={"by": True}), 422, "by")
    refused(api.post(f"/v1/sandboxes/{box['id']}/exec", json={"argv": ["true"],
                                                              "timeout": True}), 422, "timeout")
    refused(api.post("/v1/checkpoints/ckpt-nothere/restore", json={"ttl": True}), 422, "ttl")

    assert everything(sbx_home) == before  # no row, no event, the deadline where it was
    shown = api.get(f"/v1/sandboxes/{box['id']}").json()
    assert shown["deadline"] == box["deadline"]


def test_http_extend_past_the_calendar_is_capped_at_the_hard_deadline(api, stub_named):  # noqa: F811
    """A `by` that parses (seconds) but would pass year 9999 is past the hard deadline: the
    extension stops there, as any too-long one does (§9), instead of a 500."""
    box = api.post("/v1/sandboxes", json={"profile": stub_named}).json()
    answer = api.post(f"/v1/sandboxes/{box['id']}/extend", json={"by": 8e13})  # ~2.5M years
    assert answer.status_code == 200, answer.text
    assert answer.json()["capped"] is True
    assert answer.json()["deadline"] == box["hard_deadline"]


@pytest.mark.parametrize("argv", [
    ["create", "--ttl", HUGE],
    ["extend", "{box}", HUGE],
    ["restore", "ckpt-nothere", "--ttl", HUGE],
    ["exec", "{box}", "--timeout", HUGE, "--", "true"],
], ids=["create", "extend", "restore", "exec"])
def test_cli_overflowing_duration_is_exit_2_one_line_and_writes_nothing(argv, sbx, tmp_path):
    profile = write_profile(tmp_path, "stubby", "backend: stub\n")
    box = sbx.create("--profile-file", str(profile))
    before = everything(sbx.home)

    result = sbx(*[a.format(box=box["id"]) for a in argv], "--profile-file", str(profile)) \
        if argv[0] == "create" else sbx(*[a.format(box=box["id"]) for a in argv])

    assert result.code == 2, (result.code, result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and HUGE in lines[0], result.err
    assert "Traceback" not in result.err
    assert everything(sbx.home) == before
