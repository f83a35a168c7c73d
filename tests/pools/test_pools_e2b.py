"""A warm pool on a cloud backend: E2B through the real `e2b` SDK against the local stand-in
(tests/standins/e2b_server.py), through the real `sbx` CLI. A member waits on E2B's clock of
its own (its max_age), and a claim moves E2B's timeout to the claimed sandbox's deadline."""

from __future__ import annotations

from datetime import timedelta

from sandboxer.adapters.e2b import DEADLINE_GRACE
from tests.backends.test_e2b import e2b, e2b_env, near, parse, standin  # noqa: F401 (fixtures)


def test_an_e2b_member_is_claimed_and_e2bs_timeout_starts_at_the_claim(e2b, standin):  # noqa: F811
    folder = e2b.sbx.cwd / "xdg-config" / "sandboxer" / "profiles"
    folder.mkdir(parents=True)
    (folder / "e2bwarm.yaml").write_text("extends: e2b\npool: {size: 1, max_age: 10m}\n")
    reaped = e2b("reap", "--json")
    assert reaped.code == 0, reaped.err
    (made,) = [p for p in reaped.json()["pools"] if p["action"] == "warmed"]
    member = e2b.show(made["id"])
    assert member["state"] == "warm" and member["owner"] == "(pool)"
    remote = standin.sandboxes[member["backend_ref"]]
    assert remote.metadata["sbx.pool"] == "e2bwarm"
    # while it waits, E2B ends it by itself at its max_age (plus the grace) if sbx never runs
    assert near(remote.end_at, parse(member["created_at"]) + timedelta(minutes=10)
                + DEADLINE_GRACE)
    assert e2b("ls", "--json").json() == []

    box = e2b.create("--profile", "e2bwarm", "--ttl", "40m")
    assert box["launch"] == "warm" and box["id"] == member["id"]
    # the claim set E2B's timeout to the deadline counted from the claim, once
    assert near(remote.end_at, parse(box["deadline"]) + DEADLINE_GRACE)
    assert near(parse(box["deadline"]), parse(box["started_at"]) + timedelta(minutes=40), 1)
    assert standin.count("timeout", 204) == 1
    said = e2b("exec", box["id"], "--", "echo", "hi")
    assert (said.code, said.out) == (0, "hi\n")
    assert e2b("pool", "ls", "--json").json()[0]["claimed"] == 1
    assert [b["id"] for b in e2b("ls", "--json").json()] == [box["id"]]
    # the next reap makes a new member; drain removes it from E2B
    again = e2b("reap", "--json").json()
    assert [p["action"] for p in again["pools"]] == ["warmed"]
    drained = e2b("pool", "drain", "e2bwarm", "--json")
    assert drained.code == 0 and len(drained.json()["destroyed"]) == 1
    assert [s.state for s in standin.sandboxes.values()].count("running") == 1  # the claimed
