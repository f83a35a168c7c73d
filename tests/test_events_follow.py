"""`sbx events --follow` shows events written by other processes within a second."""

import json
import subprocess
import time

import pytest
from support import SBX

pytestmark = pytest.mark.docker


def test_follow_shows_another_process_events_within_a_second(sbx):
    box = sbx.create("--ttl", "30m")
    follower = subprocess.Popen([*SBX, "events", "--follow", "--json"], cwd=sbx.cwd,
                                env=sbx.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        seen = [json.loads(follower.stdout.readline()) for _ in range(2)]  # creating, created
        assert [e["type"] for e in seen] == ["sandbox.creating", "sandbox.created"]
        result = sbx("extend", box["id"], "5m")
        written = time.monotonic()
        assert result.code == 0, result.err
        line = follower.stdout.readline()
        delay = time.monotonic() - written
        event = json.loads(line)
        assert event["type"] == "sandbox.extended" and event["sandbox_id"] == box["id"]
        assert delay < 1.0, f"the follower saw the event after {delay:.2f}s"
    finally:
        follower.terminate()
        follower.wait(timeout=60)
