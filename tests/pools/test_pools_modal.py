"""A warm pool on Modal, through the real `modal` SDK against the local stand-in
(tests/standins/modal_server.py), through the real `sbx` CLI. Modal cannot move a sandbox's
timeout, so a member is made with the latest one any claim can need (max_age plus ttl.max),
and with no idle clock of Modal's: the profile's idle limit counts from the claim, in sbx."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from support import show

from tests.backends.test_modal import created, image, modal_env, standin  # noqa: F401 (fixtures)


def when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def test_a_modal_member_waits_without_an_idle_clock_and_its_timeout_covers_any_claim(
        sbx, standin, image):  # noqa: F811
    folder = sbx.cwd / "xdg-config" / "sandboxer" / "profiles"
    folder.mkdir(parents=True)
    (folder / "mdlwarm.yaml").write_text(
        f"extends: modal\nimage: {image}\nttl: {{default: 10m, max: 1h, idle: 5m}}\n"
        "pool: {size: 1, max_age: 10m}\n")
    reaped = sbx("reap", "--json")
    assert reaped.code == 0, reaped.err
    (made,) = [p["id"] for p in reaped.json()["pools"] if p["action"] == "warmed"]
    member = show(sbx, made)
    definition = created(standin, member).definition
    assert definition.idle_timeout_secs == 0  # no idle clock while it waits
    # Modal's timeout: the member's max_age plus the profile's ttl.max, from when it was made
    assert abs(definition.timeout_secs - 70 * 60) <= 5
    assert when(member["hard_deadline"]) - when(member["created_at"]) == timedelta(minutes=70)

    result = sbx("create", "--profile", "mdlwarm", "--json")
    assert result.code == 0, result.err
    box = result.json()
    assert box["launch"] == "warm" and box["id"] == made
    assert box["idle_timeout_s"] == 300  # the idle limit is sbx's, from the claim on
    # the claim's hard deadline is within the timeout Modal holds
    assert when(box["hard_deadline"]) <= when(member["created_at"]) + timedelta(minutes=70)
    said = sbx("exec", box["id"], "--", "cat", "hello.txt")
    assert (said.code, said.out) == (0, "hello from the image\n"), said.err
    drained = sbx("pool", "drain", "mdlwarm", "--json")
    assert drained.code == 0 and drained.json()["destroyed"] == []  # the claimed one is not its
    assert sbx("destroy", "--yes", box["id"]).code == 0
