"""`sbx events --follow` shows events written by other processes as they happen."""

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from support import SBX

pytestmark = pytest.mark.docker


def test_follow_shows_another_process_events_as_they_happen(sbx):
    """The follower prints another process's event while it runs (the test waits for it
    with a generous limit, never for a fixed time: the suite runs on busy machines too)."""
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
        with ThreadPoolExecutor(1) as reader:
            line = reader.submit(follower.stdout.readline).result(timeout=60)
        delay = time.monotonic() - written
        event = json.loads(line)
        assert event["type"] == "sandbox.extended" and event["sandbox_id"] == box["id"]
        assert delay < 60, f"the follower saw the event after {delay:.2f}s"
    finally:
        follower.terminate()
        follower.wait(timeout=60)
