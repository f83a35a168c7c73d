"""Exec options and background processes over the service (docs/service.md, "Exec",
"Processes"), on the real engine: exec with env, cwd and stdin; a process started, written
to, waited for, signalled, and its output as server-sent events, resumed from the event id
(`STDOUT_OFFSET,STDERR_OFFSET`) after a drop."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from support import RUN_LABEL, query, remove_test_containers, table_rows

from sandboxer_tui.service.schemas import ProcessView
from tests.service.test_service import everything

pytestmark = pytest.mark.docker


def sse(response: httpx.Response) -> list[tuple[str, str | None, dict]]:
    """(event, id, data) of a server-sent event stream, to its end."""
    found, event, event_id, data = [], None, None, None
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
        elif line == "" and event is not None:
            found.append((event, event_id, data))
            if event == "exit":
                break
            event = event_id = data = None
    return found


@pytest.fixture
def box(api, docker_api, sbx_home):
    """A sandbox on the engine; its container is removed after."""
    made = api.post("/v1/sandboxes", json={"profile": "default",
                                           "labels": dict([RUN_LABEL.split("=")])})
    assert made.status_code == 201, made.text
    yield made.json()["id"]
    remove_test_containers(sbx_home)


def test_exec_takes_env_cwd_and_stdin_and_the_event_keeps_env_names_only(api, box,
                                                                         sbx_home):
    answer = api.post(f"/v1/sandboxes/{box}/exec", json={
        "argv": ["sh", "-c", 'echo "$TOKEN in $(pwd)"; cat'],
        "env": {"TOKEN": "s3cr3t-value"}, "cwd": "/tmp",
        "stdin": base64.b64encode(b"from stdin\n").decode()})
    assert answer.status_code == 200, answer.text
    assert answer.json()["stdout"] == "s3cr3t-value in /tmp\nfrom stdin\n"
    assert answer.json()["exit_code"] == 0
    execs = [json.loads(e["payload_json"]) for e in query(
        sbx_home, "SELECT payload_json FROM events WHERE type = 'sandbox.exec' ORDER BY id")]
    assert execs[-1]["env"] == ["TOKEN"] and execs[-1]["cwd"] == "/tmp"
    assert "s3cr3t-value" not in json.dumps(table_rows(sbx_home, "events"))


def test_a_process_runs_in_the_background_takes_stdin_and_its_output_resumes(api, box):
    base = f"/v1/sandboxes/{box}/processes"
    started = api.post(base, json={"argv": ["sh", "-c", 'echo one; read line; '
                                            'echo "got $line"; echo oops >&2; exit 3'],
                                   "stdin": True, "cwd": "/tmp", "env": {"K": "v"}})
    assert started.status_code == 201, started.text
    view = started.json()
    pid = view["pid"]
    assert view["running"] is True and view["stdin"] is True and view["env_names"] == ["K"]
    assert set(view) == set(ProcessView.model_fields)  # as the document says
    assert pid in [p["pid"] for p in api.get(base).json()]

    # the first line, then (the process waits on its stdin) the stream catches up and ends
    with api.stream("GET", f"{base}/{pid}/output", params={"follow": "true"}) as first:
        assert first.status_code == 200
        assert first.headers["content-type"].startswith("text/event-stream")
        lines = first.iter_lines()
        event = next(line for line in lines if line.startswith("event: "))
        event_id = next(lines)
        data = next(lines)
    assert event == "event: stdout" and event_id == "id: 4,0"
    assert json.loads(data[6:]) == {"offset": 0, "data": "one\n"}

    assert api.post(f"{base}/{pid}/stdin", content=b"hello\n").status_code == 204
    assert api.delete(f"{base}/{pid}/stdin").status_code == 204
    waited = api.post(f"{base}/{pid}/wait", params={"timeout": "30"})
    assert waited.status_code == 200, waited.text
    assert waited.json()["running"] is False and waited.json()["exit_code"] == 3

    # a reconnect from the last id it saw: only what came after, then `exit`
    with api.stream("GET", f"{base}/{pid}/output",
                    headers={"Last-Event-ID": "4,0"}) as resumed:
        events = sse(resumed)
    streams = {e: b"".join(d["data"].encode() for ev, _, d in events if ev == e)
               for e in ("stdout", "stderr")}
    assert streams == {"stdout": b"got hello\n", "stderr": b"oops\n"}
    assert events[-1][0] == "exit" and events[-1][2]["exit_code"] == 3
    assert events[-1][1] == "14,5"
    # or from offsets in the query
    with api.stream("GET", f"{base}/{pid}/output",
                    params={"stdout_offset": 8, "stderr_offset": 5}) as tail:
        events = sse(tail)
    assert [(e, d.get("offset"), d.get("data")) for e, _, d in events[:-1]] == [
        ("stdout", 8, "hello\n")]


def test_a_signal_ends_a_process_and_bad_requests_change_nothing(api, box, sbx_home):
    base = f"/v1/sandboxes/{box}/processes"
    pid = api.post(base, json={"argv": ["sleep", "300"]}).json()["pid"]
    before = everything(sbx_home)
    for answer, status in ((api.post(f"{base}/{pid}/signal", json={"signal": 0}), 422),
                           (api.post(f"{base}/{pid}/signal", json={"signal": "TERM"}), 422),
                           (api.get(f"{base}/999999"), 404),
                           (api.get(f"{base}/{pid}/output",
                                    headers={"Last-Event-ID": "junk"}), 400)):
        assert answer.status_code == status, answer.text
        assert "\n" not in answer.json()["error"]["message"]
    assert everything(sbx_home) == before
    assert api.get(f"{base}/{pid}").json()["running"] is True
    killed = api.post(f"{base}/{pid}/signal", json={"signal": 15})
    assert killed.status_code == 200, killed.text
    ended = api.post(f"{base}/{pid}/wait", params={"timeout": "20"}).json()
    assert ended["running"] is False and ended["exit_code"] is not None
