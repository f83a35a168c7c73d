"""The unmodified `e2b` SDK's snapshots and fork against `sbx serve` on the real Docker
engine (docs/e2b-api.md, "Snapshots and fork"): a snapshot is an sbx checkpoint of the
sandbox's filesystem; creating from its id (or name) restores it; a fork is a checkpoint
taken now and a sandbox restored from it per copy."""

from __future__ import annotations

import pytest
from support import RUN_LABEL

pytestmark = pytest.mark.docker

LABEL_KEY, LABEL_VALUE = RUN_LABEL.split("=")


def test_a_snapshot_restores_files_lists_forks_and_is_deleted(e2b_env, live):
    from e2b import Sandbox, SandboxException

    box = Sandbox.create("default", timeout=120, metadata={LABEL_KEY: LABEL_VALUE})
    made: list[Sandbox] = []
    try:
        box.files.write("/srv/state.txt", "before")
        snap = box.create_snapshot(name="e2b-snap")
        assert snap.snapshot_id.startswith("ckpt-") and snap.names == ["e2b-snap"]
        box.files.write("/srv/state.txt", "after")  # the snapshot keeps what was
        for template in (snap.snapshot_id, "e2b-snap"):
            made.append(Sandbox.create(template, timeout=120,
                                       metadata={LABEL_KEY: LABEL_VALUE}))
            assert made[-1].files.read("/srv/state.txt") == "before"
        listed = Sandbox.list_snapshots(sandbox_id=box.sandbox_id).next_items()
        assert [s.snapshot_id for s in listed] == [snap.snapshot_id]
        with pytest.raises(SandboxException, match="snapshots with memory"):
            box.create_snapshot(mode="full")
        forks = box.fork(count=2)
        assert len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks)
        made += forks
        assert {f.files.read("/srv/state.txt") for f in forks} == {"after"}
        forks[0].files.write("/srv/state.txt", "mine")  # each fork has its own copy
        assert forks[1].files.read("/srv/state.txt") == "after"
        assert forks[1].get_info().metadata[LABEL_KEY] == LABEL_VALUE
    finally:
        for sandbox in [box, *made]:
            sandbox.kill()
        ours = Sandbox.list_snapshots(sandbox_id=box.sandbox_id).next_items()
    assert len(ours) == 2  # the snapshot and the fork's checkpoint, removed by id
    other = live.key("write", owner="someone-else")  # another tenant sees none of them
    assert Sandbox.list_snapshots(api_key=other).next_items() == []
    assert Sandbox.delete_snapshot(ours[0].snapshot_id, api_key=other) is False
    for snapshot in ours:
        assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True
        assert Sandbox.delete_snapshot(snapshot.snapshot_id) is False
    assert Sandbox.list_snapshots().next_items() == []
