"""Event delivery to the sinks (docs/reliability.md, guarantees 12 and 15), end to end.

A real HTTP receiver listens on 127.0.0.1 (a ThreadingHTTPServer in a thread, port 0); it
records every POST (body, headers, the status it answered), can be told to answer 500 (all,
or only some event ids), and can be shut down and started again on the same port. Given the
secret, it verifies each delivery as a hub would, with the `standardwebhooks` library, and
answers 401 to one that does not verify. The real
`sbx` runs in subprocesses (the `sbx` fixture: its own SBX_HOME and config folder, so the
settings file is <tmp>/xdg-config/sandboxer/settings.toml). Sandboxes are real Docker ones,
except where many events are needed and no sandbox is: those are seeded in this process by a
Manager on the `stub` backend (a test double) over the same SBX_HOME.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import re
import secrets
import signal
import socketserver
import subprocess
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from standardwebhooks import Webhook, WebhookVerificationError
from support import (
    RUN_ID,
    SBX,
    Result,
    install_id_of,
    one_json,
    query,
    table_rows,
    write_profile,
)

pytestmark = pytest.mark.docker

CONTENT_TYPE = "application/cloudevents+json"
TYPE_RE = re.compile(r"^dev\.sandboxer\.(sandbox|checkpoint)\.[a-z][a-z-]*$")
LIFECYCLE = ["sandbox.creating", "sandbox.created", "sandbox.exec", "checkpoint.creating",
             "checkpoint.created", "sandbox.extended", "checkpoint.removed",
             "sandbox.destroying", "sandbox.destroyed"]


# -- the receiver ---------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def server_bind(self) -> None:  # no reverse DNS lookup (HTTPServer's getfqdn)
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class Receiver:
    """A webhook endpoint on 127.0.0.1 that records what it is sent."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[dict] = []  # {"body", "headers" (lower-case keys), "status", "path"}
        self.status = 200  # what to answer
        self.refuse_ids: set[str] = set()  # CloudEvent ids answered 500 whatever `status` says
        self.delay = 0.0  # seconds to wait before answering
        self.secret: str | None = None  # when set, every POST is verified with it
        self.port = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> None:
        """Listen (again) on 127.0.0.1: a free port the first time, the same one after."""
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the sink expects

            def do_POST(self) -> None:  # noqa: N802 (the http.server convention)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    event_id = json.loads(body).get("id")
                except ValueError:
                    event_id = None
                if receiver.delay:
                    time.sleep(receiver.delay)
                headers = {k.lower(): v for k, v in self.headers.items()}
                rejected = None
                if receiver.secret is not None:
                    try:
                        hub_webhook(receiver.secret).verify(body, headers)
                    except WebhookVerificationError as exc:
                        rejected = str(exc)
                with receiver.lock:
                    status = 401 if rejected else \
                        500 if event_id in receiver.refuse_ids else receiver.status
                    receiver.requests.append({
                        "body": body, "status": status, "path": self.path,
                        "headers": headers, "rejected": rejected})
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self._server = _Server(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Shut down: the port then refuses connections until `start` again."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)
            self._server = self._thread = None

    # what arrived
    def snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.requests)

    def docs(self, accepted_only: bool = True) -> list[dict]:
        return [json.loads(r["body"]) for r in self.snapshot()
                if not accepted_only or 200 <= r["status"] < 300]

    def ids(self, accepted_only: bool = True) -> list[str]:
        return [d["id"] for d in self.docs(accepted_only)]

    def replay(self, body: bytes, headers: dict[str, str]) -> int:
        """POST a captured delivery again, as an attacker who recorded it would; the status."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("POST", "/hook", body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()


@pytest.fixture
def receiver():
    r = Receiver()
    r.start()
    yield r
    r.stop()


# -- helpers --------------------------------------------------------------------------------


def new_secret(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(16)}"


def new_hook_secret(size: int = 32) -> str:
    """A Standard Webhooks secret: whsec_ and the base64 of `size` random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(size)).decode()


def hub_webhook(secret: str) -> Webhook:
    """What a hub verifies with: the whsec_ text as it is; a plain secret as its bytes."""
    return Webhook(secret if secret.startswith("whsec_") else secret.encode())


def settings_path(sbx) -> Path:
    return sbx.cwd / "xdg-config" / "sandboxer" / "settings.toml"


def write_settings(sbx, text: str) -> Path:
    path = settings_path(sbx)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def webhook_settings(sbx, receiver: Receiver, *, max_attempts: int = 1000,
                     backoff_s: float = 0, timeout_s: float = 5) -> Path:
    return write_settings(sbx, (
        "[sinks.webhook]\n"
        f'url = "{receiver.url}"\n'
        f"max_attempts = {max_attempts}\n"
        f"backoff_s = {backoff_s}\n"
        f"timeout_s = {timeout_s}\n"))


def deliver(sbx, env: dict[str, str], *extra: str) -> tuple[Result, dict[str, dict]]:
    """`sbx events deliver --json`: the result and the reports by sink name."""
    result = sbx("events", "deliver", "--json", *extra, env=env)
    assert result.code in (0, 1), (result.code, result.out, result.err)
    return result, {r["sink"]: r for r in one_json(result.out)}


def all_events(sbx) -> list[dict]:
    result = sbx("events", "--json")
    assert result.code == 0, result.err
    return result.json()


def undelivered(sbx, env: dict[str, str]) -> list[dict]:
    result = sbx("events", "--undelivered", "--json", env=env)
    assert result.code == 0, result.err
    return one_json(result.out)


def jsonl_lines(home: Path) -> list[bytes]:
    path = home / "events.jsonl"
    return path.read_bytes().splitlines() if path.exists() else []


def check_signature(request: dict, secret: str) -> None:
    """The delivery verifies with the standardwebhooks library, its webhook-id is the
    CloudEvent's id (the event's chain hash), and the old unstamped header is gone."""
    try:
        hub_webhook(secret).verify(request["body"], request["headers"])
    except WebhookVerificationError as exc:
        raise AssertionError(f"{exc} for {request['body'][:80]!r}") from None
    assert request["headers"]["webhook-id"] == json.loads(request["body"])["id"]
    assert "x-sbx-signature" not in request["headers"]


def check_cloudevent(doc: dict, event: dict, install: str) -> None:
    """`doc` is a valid CloudEvents 1.0 structured document for the logged `event`."""
    assert doc["specversion"] == "1.0"
    assert doc["id"] == event["hash"] and len(doc["id"]) == 64
    assert doc["source"] == f"urn:sandboxer:{install}"
    assert TYPE_RE.match(doc["type"]), doc["type"]
    assert doc["type"] == f"dev.sandboxer.{event['type']}"
    assert doc["time"] == event["time"] and doc["time"].endswith("Z")
    datetime.strptime(doc["time"], "%Y-%m-%dT%H:%M:%S.%fZ")  # a real time
    assert doc["subject"] == event["sandbox_id"]
    assert doc["datacontenttype"] == "application/json"
    data = doc["data"]
    assert data["sequence"] == event["id"]
    assert data["hash"] == event["hash"]
    assert data["prev_hash"] == event["prev_hash"]
    assert data["payload"] == event["payload"]


def check_duplicates_identical(receiver: Receiver) -> None:
    """A duplicate is recognisable: every copy of an event has the same id and the same body,
    and one sequence number never comes with two ids."""
    by_id: dict[str, bytes] = {}
    seq_to_id: dict[int, str] = {}
    for request in receiver.snapshot():
        doc = json.loads(request["body"])
        assert by_id.setdefault(doc["id"], request["body"]) == request["body"]
        assert seq_to_id.setdefault(doc["data"]["sequence"], doc["id"]) == doc["id"]


def first_arrivals(ids: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for i in ids:
        seen.setdefault(i, None)
    return list(seen)


def seed_stub_events(tmp_path: Path, sandboxes: int) -> None:
    """In this process, on the test's SBX_HOME: `sandboxes` stub sandboxes, each created,
    exec'd, extended and destroyed (6 events each)."""
    from sandboxer.adapters.stub import StubAdapter
    from sandboxer.core.lifecycle.manager import Manager
    from sandboxer.core.rules.profiles import ProfileLoader

    path = write_profile(tmp_path, "stubby", "backend: stub\nttl: {default: 10m, max: 1h}\n")
    profile = ProfileLoader().load_file(path)
    StubAdapter.reset()

    async def go() -> None:
        mgr = Manager()
        try:
            for _ in range(sandboxes):
                row = await mgr.create(profile, labels={"sbx-test-run": RUN_ID})
                await mgr.exec(row["id"], ["true"])
                await mgr.extend(row["id"], timedelta(minutes=5))
                await mgr.destroy(row["id"])
        finally:
            await mgr.close()

    asyncio.run(go())
    StubAdapter.reset()


def popen(sbx, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([*SBX, *args], cwd=sbx.cwd, env=sbx.env(env), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(predicate, timeout: float, every: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return predicate()


# -- 1. every transition, as a signed CloudEvent, in order, on both sinks -------------------


def test_every_transition_arrives_as_a_signed_cloudevent_in_order(sbx, sbx_home, receiver):
    secret = new_hook_secret()
    receiver.secret = secret  # the receiver verifies every delivery
    env = {"SBX_WEBHOOK_URL": receiver.url, "SBX_WEBHOOK_SECRET": secret}
    box = sbx.create()
    assert sbx("exec", box["id"], "--", "echo", "hi").code == 0
    snapshot = sbx("snapshot", box["id"])
    assert snapshot.code == 0, snapshot.err
    assert sbx("extend", box["id"], "10m", "--json").code == 0
    assert sbx("checkpoint", "rm", snapshot.out.strip()).code == 0  # and its image
    assert sbx("destroy", box["id"], "--yes").code == 0

    result, reports = deliver(sbx, env)
    assert result.code == 0, result.err
    assert reports["webhook"]["delivered"] == 9 and reports["webhook"]["error"] is None
    assert reports["jsonl"]["delivered"] == 9

    events = all_events(sbx)
    assert [e["type"] for e in events] == LIFECYCLE
    install = install_id_of(sbx_home)
    requests = receiver.snapshot()
    assert len(requests) == 9 and all(r["status"] == 200 for r in requests)
    docs = [json.loads(r["body"]) for r in requests]
    for request, doc, event in zip(requests, docs, events, strict=True):
        assert request["path"] == "/hook"
        assert request["headers"]["content-type"] == CONTENT_TYPE
        check_signature(request, secret)
        check_cloudevent(doc, event, install)
        assert doc["subject"] == box["id"]
    sequences = [d["data"]["sequence"] for d in docs]
    assert sequences == sorted(set(sequences)), sequences  # strictly increasing

    # the JSON Lines file holds the very same documents, byte for byte
    assert jsonl_lines(sbx_home) == [r["body"] for r in requests]

    # nothing more to send: a second run sends nothing
    result, reports = deliver(sbx, env)
    assert result.code == 0 and reports["webhook"]["delivered"] == 0
    assert len(receiver.snapshot()) == 9


# -- 2. an outage (500s, then down, then back): nothing lost, in order ---------------------


def test_sink_outage_500_then_down_then_back_loses_nothing(sbx, receiver):
    secret = new_hook_secret()
    receiver.secret = secret  # the receiver verifies every delivery
    webhook_settings(sbx, receiver, max_attempts=1000, backoff_s=0, timeout_s=2)
    env = {"SBX_WEBHOOK_SECRET": secret}
    box = sbx.create()

    receiver.status = 500
    for _ in range(3):
        result, reports = deliver(sbx, env)
        assert result.code == 1, result.out
        assert "500" in reports["webhook"]["error"] and reports["webhook"]["delivered"] == 0
        assert "500" in result.err
    waiting = undelivered(sbx, env)  # retrying, not parked
    assert [(w["sink"], w["event_id"], w["parked"], w["attempts"]) for w in waiting] == \
        [("webhook", 1, False, 3)]
    assert sbx("exec", box["id"], "--", "true").code == 0  # more events during the outage

    receiver.stop()  # down: connection refused
    for _ in range(2):
        result, reports = deliver(sbx, env)
        assert result.code == 1, result.out
        assert reports["webhook"]["error"] and reports["webhook"]["delivered"] == 0
    assert sbx("extend", box["id"], "10m").code == 0

    receiver.status = 200
    receiver.start()  # back, on the same port
    result, reports = deliver(sbx, env)
    assert result.code == 0, result.err
    assert reports["webhook"]["delivered"] == 4
    assert sbx("destroy", box["id"], "--yes").code == 0
    result, reports = deliver(sbx, env)
    assert result.code == 0 and reports["webhook"]["delivered"] == 2

    hashes = [e["hash"] for e in all_events(sbx)]
    assert len(hashes) == 6
    assert receiver.ids() == hashes  # every event accepted exactly once, in order
    refused = [json.loads(r["body"])["id"] for r in receiver.snapshot() if r["status"] == 500]
    assert refused == [hashes[0]] * 3
    check_duplicates_identical(receiver)
    for request in receiver.snapshot():
        check_signature(request, secret)
    assert undelivered(sbx, env) == []


# -- 3. parking after max_attempts, later events flow, redeliver ----------------------------


def test_refused_event_is_parked_later_ones_flow_and_redeliver_sends_it(sbx, receiver):
    secret = new_hook_secret()
    receiver.secret = secret  # the receiver verifies every delivery
    webhook_settings(sbx, receiver, max_attempts=2, backoff_s=0)
    env = {"SBX_WEBHOOK_SECRET": secret}
    box = sbx.create()
    result, reports = deliver(sbx, env)
    assert result.code == 0 and reports["webhook"]["delivered"] == 2

    assert sbx("exec", box["id"], "--", "echo", "poison").code == 0
    assert sbx("extend", box["id"], "10m").code == 0
    events = all_events(sbx)
    poison, after = events[2], events[3]
    assert (poison["type"], after["type"]) == ("sandbox.exec", "sandbox.extended")
    receiver.refuse_ids = {poison["hash"]}

    result, reports = deliver(sbx, env)  # refused once: nothing after it is sent meanwhile
    assert result.code == 1
    assert reports["webhook"]["parked"] == 0 and reports["webhook"]["delivered"] == 0
    assert after["hash"] not in receiver.ids(accepted_only=False)
    assert [(u["event_id"], u["parked"], u["attempts"]) for u in undelivered(sbx, env)] \
        == [(poison["id"], False, 1)]

    result, reports = deliver(sbx, env)  # the second refusal parks it; the next one goes
    assert reports["webhook"]["parked"] == 1 and reports["webhook"]["delivered"] == 1
    assert receiver.ids()[-1] == after["hash"]
    (parked,) = undelivered(sbx, env)
    assert (parked["sink"], parked["event_id"], parked["parked"], parked["attempts"]) == \
        ("webhook", poison["id"], True, 2)
    assert "500" in parked["last_error"]

    assert sbx("exec", box["id"], "--", "true").code == 0  # later events still flow
    later = all_events(sbx)[-1]
    result, reports = deliver(sbx, env)
    assert result.code == 0 and reports["webhook"]["delivered"] == 1
    assert receiver.ids()[-1] == later["hash"]
    assert [u["event_id"] for u in undelivered(sbx, env)] == [poison["id"]]

    # redeliver while the sink still refuses: exit 1, still parked
    result = sbx("events", "redeliver", str(poison["id"]), "--json", env=env)
    assert result.code == 1
    assert [(o["event_id"], o["delivered"]) for o in one_json(result.out)] == [(poison["id"], False)]
    assert [(u["event_id"], u["parked"]) for u in undelivered(sbx, env)] == [(poison["id"], True)]

    receiver.refuse_ids = set()
    result = sbx("events", "redeliver", str(poison["id"]), "--json", env=env)
    assert result.code == 0, result.err
    assert [(o["sink"], o["event_id"], o["delivered"]) for o in one_json(result.out)] == \
        [("webhook", poison["id"], True)]
    assert undelivered(sbx, env) == []
    accepted = receiver.ids()
    assert accepted[-1] == poison["hash"]
    assert Counter(accepted) == Counter(e["hash"] for e in all_events(sbx))  # each once
    check_duplicates_identical(receiver)
    for request in receiver.snapshot():
        check_signature(request, secret)

    result, reports = deliver(sbx, env)  # nothing left, nothing re-sent
    assert result.code == 0 and reports["webhook"]["delivered"] == 0
    assert Counter(receiver.ids()) == Counter(accepted)


# -- 4. kill -9 in the middle of delivery: the next deliverer resumes ----------------------


def test_deliverer_killed_after_a_send_is_resumed_by_the_next(sbx, receiver):
    secret = new_hook_secret()
    receiver.secret = secret  # the receiver verifies every delivery
    webhook_settings(sbx, receiver)
    env = {"SBX_WEBHOOK_SECRET": secret}
    box = sbx.create()
    assert sbx("exec", box["id"], "--", "true").code == 0
    assert sbx("extend", box["id"], "10m").code == 0
    assert sbx("destroy", box["id"], "--yes").code == 0
    hashes = [e["hash"] for e in all_events(sbx)]
    assert len(hashes) == 6

    started = time.monotonic()
    killed = sbx("events", "deliver", "--json",
                 env={**env, "SBX_FAILPOINT": "deliver.after-send", "SBX_LEASE_TTL": "10s"})
    assert killed.code == -signal.SIGKILL, (killed.code, killed.err)
    assert receiver.ids() == hashes[:1]  # it sent one, then died before recording it

    # its lease still holds: another deliverer does not race it, it waits
    result, reports = deliver(sbx, env)
    assert time.monotonic() - started < 10, "too slow to observe the lease; raise SBX_LEASE_TTL"
    assert reports["webhook"]["busy"] and reports["webhook"]["delivered"] == 0
    assert receiver.ids() == hashes[:1]

    # the dead one's lease lapses (at the time it recorded: its start is slow on a busy host)
    (lease,) = query(sbx.home, "SELECT lease_expires_at FROM sink_cursors WHERE sink = ?",
                     "webhook")
    expires = datetime.fromisoformat(lease["lease_expires_at"][:-1]).replace(tzinfo=UTC)
    time.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds() + 0.3))
    result, reports = deliver(sbx, env)
    assert result.code == 0, result.err
    assert not reports["webhook"]["busy"]

    arrived = receiver.ids(accepted_only=False)
    assert set(arrived) == set(hashes)  # every event at least once
    assert first_arrivals(arrived) == hashes  # in order by first arrival
    sequences = [json.loads(r["body"])["data"]["sequence"] for r in receiver.snapshot()]
    firsts = first_arrivals([str(s) for s in sequences])
    assert [int(s) for s in firsts] == sorted(int(s) for s in firsts)
    check_duplicates_identical(receiver)
    assert max(Counter(arrived).values()) <= 2
    for request in receiver.snapshot():
        check_signature(request, secret)

    result, reports = deliver(sbx, env)
    assert result.code == 0 and reports["webhook"]["delivered"] == 0


# -- 5. concurrent deliverers: each event exactly once ---------------------------------------


def test_concurrent_deliverers_send_each_event_exactly_once(sbx, tmp_path, receiver):
    seed_stub_events(tmp_path, 34)  # 204 events
    hashes = [e["hash"] for e in all_events(sbx)]
    assert len(hashes) == 204
    secret = new_hook_secret()
    receiver.secret = secret  # the receiver verifies every delivery
    env = {"SBX_WEBHOOK_URL": receiver.url, "SBX_WEBHOOK_SECRET": secret}
    receiver.delay = 0.002  # the delivery lasts long enough for the others to collide with it

    procs = [popen(sbx, "events", "deliver", "--json", env=env) for _ in range(4)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        results.append(Result(proc.returncode, out, err))
    for result in results:
        assert result.code == 0, (result.code, result.err)
    reports = [{r["sink"]: r for r in one_json(result.out)} for result in results]
    assert sum(r["webhook"]["delivered"] for r in reports) == 204
    assert sum(r["jsonl"]["delivered"] for r in reports) == 204

    arrived = receiver.ids(accepted_only=False)
    twice = [i for i, n in Counter(arrived).items() if n > 1]
    assert not twice, f"{len(twice)} event(s) sent more than once"
    assert arrived == hashes  # each exactly once, in order
    lines = [json.loads(line)["id"] for line in jsonl_lines(sbx.home)]
    assert lines == hashes

    result, reports = deliver(sbx, env)
    assert result.code == 0 and reports["webhook"]["delivered"] == 0
    assert len(receiver.snapshot()) == 204


# -- 6. bad sink settings or input: exit 2, the reason, nothing changed ---------------------

BAD_CASES = {
    # name: (env beyond the good secret (None: unset), settings.toml text or None, argv,
    #        words the message must contain)
    "url-not-http": ({"SBX_WEBHOOK_URL": "ftp://x"}, None, ["events", "deliver"],
                     ["SBX_WEBHOOK_URL", "ftp://x"]),
    "url-not-http-json": ({"SBX_WEBHOOK_URL": "ftp://x"}, None,
                          ["events", "deliver", "--json"], ["SBX_WEBHOOK_URL", "ftp://x"]),
    "url-without-secret": ({"SBX_WEBHOOK_URL": "@URL", "SBX_WEBHOOK_SECRET": None}, None,
                           ["events", "deliver"], ["SBX_WEBHOOK_SECRET"]),
    "since-nope": ({"SBX_WEBHOOK_URL": "@URL"}, None, ["events", "--since", "nope"],
                   ["--since", "nope"]),
    "settings-not-toml": ({}, '[sinks.webhook\nurl = "@URL"\n', ["events", "deliver"],
                          ["settings.toml"]),
    "settings-url-not-http": ({}, '[sinks.webhook]\nurl = "ftp://y"\n', ["events", "deliver"],
                              ["settings.toml", "sinks.webhook.url", "ftp://y"]),
    "settings-max-attempts-zero": ({}, '[sinks.webhook]\nurl = "@URL"\nmax_attempts = 0\n',
                                   ["events", "deliver"], ["settings.toml", "max_attempts"]),
    "settings-backoff-word": ({}, '[sinks.webhook]\nurl = "@URL"\nbackoff_s = "soon"\n',
                              ["events", "deliver"], ["settings.toml", "sinks.webhook"]),
    "settings-timeout-word": ({}, '[sinks.webhook]\nurl = "@URL"\ntimeout_s = "soon"\n',
                              ["events", "deliver"], ["settings.toml", "timeout_s"]),
    "settings-webhook-not-a-table": ({}, '[sinks]\nwebhook = "@URL"\n', ["events", "deliver"],
                                     ["settings.toml", "webhook"]),
    "reap-every-url-not-http": ({"SBX_WEBHOOK_URL": "ftp://x"}, None,
                                ["reap", "--every", "1s"], ["SBX_WEBHOOK_URL", "ftp://x"]),
    # plain http to an address that is not loopback by its name (0.0.0.0 reaches this
    # receiver on Linux, so without the rule the events would arrive)
    "url-plain-http-not-loopback": ({"SBX_WEBHOOK_URL": "http://0.0.0.0:@PORT/hook"}, None,
                                    ["events", "deliver"],
                                    ["SBX_WEBHOOK_URL", "http://0.0.0.0:", "not loopback",
                                     "allow_plain_http", "SBX_WEBHOOK_ALLOW_HTTP=1"]),
    "url-plain-http-not-loopback-json": ({"SBX_WEBHOOK_URL": "http://0.0.0.0:@PORT/hook"},
                                         None, ["events", "deliver", "--json"],
                                         ["SBX_WEBHOOK_URL", "not loopback"]),
    "settings-url-plain-http-not-loopback": (
        {}, '[sinks.webhook]\nurl = "http://0.0.0.0:@PORT/hook"\n', ["events", "deliver"],
        ["settings.toml", "sinks.webhook.url", "http://0.0.0.0:", "not loopback"]),
    "reap-every-url-plain-http": ({"SBX_WEBHOOK_URL": "http://0.0.0.0:@PORT/hook"}, None,
                                  ["reap", "--every", "1s"], ["SBX_WEBHOOK_URL", "not loopback"]),
    "allow-http-variable-word": ({"SBX_WEBHOOK_URL": "http://0.0.0.0:@PORT/hook",
                                  "SBX_WEBHOOK_ALLOW_HTTP": "yes"}, None, ["events", "deliver"],
                                 ["SBX_WEBHOOK_ALLOW_HTTP", "'yes'"]),
    "allow-http-variable-0-overrides-settings": (
        {"SBX_WEBHOOK_ALLOW_HTTP": "0"},
        '[sinks.webhook]\nurl = "http://0.0.0.0:@PORT/hook"\nallow_plain_http = true\n',
        ["events", "deliver"], ["settings.toml", "not loopback"]),
    "settings-allow-plain-http-word": (
        {}, '[sinks.webhook]\nurl = "http://0.0.0.0:@PORT/hook"\nallow_plain_http = "yes"\n',
        ["events", "deliver"], ["settings.toml", "sinks.webhook.allow_plain_http", "'yes'"]),
    "settings-legacy-signature-word": (
        {}, '[sinks.webhook]\nurl = "@URL"\nlegacy_signature = 1\n', ["events", "deliver"],
        ["settings.toml", "sinks.webhook.legacy_signature"]),
    "url-bad-port": ({"SBX_WEBHOOK_URL": "http://127.0.0.1:99999/hook"}, None,
                     ["events", "deliver"], ["SBX_WEBHOOK_URL", "invalid port"]),
    # secrets whose key is shorter than 24 bytes, or not what they claim to be
    "secret-whsec-23-bytes": ({"SBX_WEBHOOK_URL": "@URL",
                               "SBX_WEBHOOK_SECRET": "whsec_" + base64.b64encode(b"k" * 23).decode()},
                              None, ["events", "deliver"],
                              ["SBX_WEBHOOK_SECRET", "23 bytes", "at least 24"]),
    "secret-plain-23-bytes": ({"SBX_WEBHOOK_URL": "@URL",
                               "SBX_WEBHOOK_SECRET": "twenty-three-bytes-long"}, None,
                              ["events", "deliver"], ["SBX_WEBHOOK_SECRET", "23 bytes"]),
    "secret-whsec-not-base64": ({"SBX_WEBHOOK_URL": "@URL",
                                 "SBX_WEBHOOK_SECRET": "whsec_" + "not base64!" * 4}, None,
                                ["events", "deliver"], ["SBX_WEBHOOK_SECRET", "base64"]),
    "reap-every-secret-short": ({"SBX_WEBHOOK_URL": "@URL", "SBX_WEBHOOK_SECRET": "short"},
                                None, ["reap", "--every", "1s"], ["SBX_WEBHOOK_SECRET", "5 bytes"]),
}


@pytest.mark.parametrize("case", list(BAD_CASES), ids=list(BAD_CASES))
def test_bad_delivery_input_exits_2_and_changes_nothing(sbx, sbx_home, tmp_path, receiver, case):
    extra_env, settings_text, argv, words = BAD_CASES[case]
    secret = new_hook_secret()
    receiver.secret = secret  # the receiver verifies every delivery
    good = {"SBX_WEBHOOK_URL": receiver.url, "SBX_WEBHOOK_SECRET": secret}
    seed_stub_events(tmp_path, 1)
    result, reports = deliver(sbx, good)  # the cursors exist and have moved
    assert result.code == 0 and reports["webhook"]["delivered"] == 6
    seed_stub_events(tmp_path, 1)  # and there is more to send

    def state():
        return {"cursors": table_rows(sbx_home, "sink_cursors"),
                "deliveries": table_rows(sbx_home, "deliveries"),
                "events": table_rows(sbx_home, "events"),
                "jsonl": jsonl_lines(sbx_home), "received": len(receiver.snapshot())}

    before = state()
    assert [c[1] for c in before["cursors"]] == [6, 6]
    env = {"SBX_WEBHOOK_SECRET": secret}

    def place(text: str) -> str:
        return text.replace("@URL", receiver.url).replace("@PORT", str(receiver.port))

    env.update({k: place(v) for k, v in extra_env.items() if v is not None})
    env = {k: v for k, v in env.items() if extra_env.get(k, "") is not None}  # None: unset
    if settings_text is not None:
        write_settings(sbx, place(settings_text))
    result = sbx(*argv, env=env, timeout=30)
    assert result.code == 2, (result.code, result.out, result.err)
    if "--json" in argv:
        error = one_json(result.out)["error"]
        assert error["code"] == 2
        message = error["message"]
    else:
        assert result.out == ""
        message = result.err
        assert len(result.err.strip().splitlines()) == 1, result.err
    for word in words:
        assert word in message, (word, message)
    assert secret not in result.out + result.err
    given = extra_env.get("SBX_WEBHOOK_SECRET")
    assert not given or given not in result.out + result.err
    assert state() == before


# -- 7. secrets reach neither the database, nor the event log, nor the sinks ----------------


def test_secrets_never_reach_the_database_the_log_or_the_sinks(sbx, sbx_home, tmp_path,
                                                               receiver):
    value = new_secret("sbx-test-secret")
    hook_secret = new_secret("hook-secret")  # plain text: the key is its bytes
    receiver.secret = hook_secret
    env = {"SBX_TEST_SECRET_VALUE": value, "SBX_WEBHOOK_URL": receiver.url,
           "SBX_WEBHOOK_SECRET": hook_secret}
    profile = write_profile(tmp_path, "secretive",
                            'extends: default\nsecrets:\n  TOKEN: "env:SBX_TEST_SECRET_VALUE"\n')
    box = sbx.create("--profile-file", str(profile), env=env)
    ran = sbx("exec", box["id"], "--", "sh", "-c", 'echo "$TOKEN"', env=env)
    assert ran.code == 0 and ran.out.strip() == value  # the sandbox did get it
    assert sbx("extend", box["id"], "10m", env=env).code == 0
    outputs = []
    result, reports = deliver(sbx, env)
    assert result.code == 0 and reports["webhook"]["delivered"] == 4
    outputs.append(result.out + result.err)
    assert sbx("destroy", box["id"], "--yes", env=env).code == 0
    result, reports = deliver(sbx, env)
    assert result.code == 0 and reports["webhook"]["delivered"] == 2
    outputs.append(result.out + result.err)
    for args in (["show", box["id"], "--json"], ["events", "--json"],
                 ["events", "--undelivered", "--json"], ["ls", "--all", "--json"]):
        shown = sbx(*args, env=env)
        assert shown.code == 0, shown.err
        outputs.append(shown.out + shown.err)

    files = [p for p in sbx_home.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"sbx.db", "events.jsonl"} <= names, names
    assert len(jsonl_lines(sbx_home)) == 6
    requests = receiver.snapshot()
    assert len(requests) == 6
    for needle in (value, hook_secret):
        raw = needle.encode()
        hits = [p.name for p in files if raw in p.read_bytes()]
        assert not hits, f"secret found in {hits}"
        for request in requests:
            assert raw not in request["body"]
            assert needle not in json.dumps(request["headers"])
        for text in outputs:
            assert needle not in text
    for request in requests:
        check_signature(request, hook_secret)  # signed with it, without carrying it


# -- 8. `sbx reap --every` delivers as it goes ----------------------------------------------


def test_reap_every_delivers_new_events_within_seconds(sbx, receiver):
    secret = new_hook_secret()
    receiver.secret = secret  # the receiver verifies every delivery
    env = {"SBX_WEBHOOK_URL": receiver.url, "SBX_WEBHOOK_SECRET": secret}
    box = sbx.create()
    reaper = popen(sbx, "reap", "--every", "1s", env=env)
    hashes, latency, still_running = [], None, False
    try:
        if wait_for(lambda: len(receiver.ids()) >= 2, 60):  # the creation events
            assert sbx("exec", box["id"], "--", "true").code == 0
            assert sbx("extend", box["id"], "10m").code == 0
            made = time.monotonic()
            hashes = [e["hash"] for e in all_events(sbx)]
            if wait_for(lambda: receiver.ids() == hashes, 60):
                latency = time.monotonic() - made
        still_running = reaper.poll() is None
    finally:
        if reaper.poll() is None:
            reaper.send_signal(signal.SIGTERM)
        out, err = reaper.communicate(timeout=30)
    assert hashes, f"the creation events did not arrive within 60 s; sbx reap said: {err!r}"
    assert len(hashes) == 4
    assert latency is not None, (f"not delivered within 60 s: {len(receiver.ids())} of "
                                 f"{len(hashes)}; sbx reap said: {err!r}")
    assert still_running, f"sbx reap --every stopped on its own: {err!r}"
    assert reaper.returncode == 0, (reaper.returncode, err)  # SIGTERM: a clean stop
    assert "sbx reap:" not in err, err  # silent when all is well
    for request in receiver.snapshot():
        check_signature(request, secret)
    # what the long-running process recorded (its cursor) is seen by the next process:
    # nothing is sent again
    result, reports = deliver(sbx, env)
    assert result.code == 0 and reports["webhook"]["delivered"] == 0, result.out
    assert receiver.ids(accepted_only=False) == hashes


# -- 9. Standard Webhooks: any hub verifies; the id holds across retries; replays fail -------


def test_deliveries_verify_with_standardwebhooks_and_old_ones_are_rejected(sbx, tmp_path,
                                                                           receiver):
    secret = new_hook_secret()
    receiver.secret = secret
    webhook_settings(sbx, receiver, backoff_s=0)
    env = {"SBX_WEBHOOK_SECRET": secret}
    seed_stub_events(tmp_path, 1)
    events = all_events(sbx)
    install = install_id_of(sbx.home)
    receiver.refuse_ids = {events[0]["hash"]}  # the first attempt fails: a retry follows
    result, _ = deliver(sbx, env)
    assert result.code == 1
    receiver.refuse_ids = set()
    result, reports = deliver(sbx, env)
    assert result.code == 0 and reports["webhook"]["delivered"] == 6, result.err

    requests = receiver.snapshot()
    assert [r["status"] for r in requests] == [500] + [200] * 6
    assert [r["rejected"] for r in requests] == [None] * 7  # every one verified
    first, retry = requests[0], requests[1]
    assert first["headers"]["webhook-id"] == retry["headers"]["webhook-id"] == events[0]["hash"]
    assert first["body"] == retry["body"]  # a hub de-duplicates the retry by its id
    for request, event in zip(requests[1:], events, strict=True):
        check_signature(request, secret)
        assert request["headers"]["webhook-id"] == event["hash"]
        assert request["headers"]["content-type"] == CONTENT_TYPE
        check_cloudevent(json.loads(request["body"]), event, install)
        assert request["headers"]["webhook-signature"].startswith("v1,")
        assert abs(int(request["headers"]["webhook-timestamp"]) - time.time()) < 120

    # a delivery signed ten minutes ago: what a hub sees when someone replays a recording
    seed_stub_events(tmp_path, 1)
    result, reports = deliver(sbx, {**env, "SBX_CLOCK_OFFSET": "-10m"})
    assert result.code == 1 and "401" in reports["webhook"]["error"]
    old = receiver.snapshot()[-1]
    assert old["status"] == 401 and old["rejected"] == "Message timestamp too old"
    stamp = int(old["headers"]["webhook-timestamp"])
    assert 540 < time.time() - stamp < 720
    genuine = Webhook(secret).sign(old["headers"]["webhook-id"],
                                   datetime.fromtimestamp(stamp, UTC), old["body"].decode())
    assert old["headers"]["webhook-signature"] == genuine  # signed right, refused for its age
    assert receiver.replay(old["body"], old["headers"]) == 401  # replayed as recorded
    assert receiver.snapshot()[-1]["rejected"] == "Message timestamp too old"
    fresh = {**old["headers"], "webhook-timestamp": str(int(time.time()))}
    assert receiver.replay(old["body"], fresh) == 401  # a new stamp breaks the signature
    assert receiver.snapshot()[-1]["rejected"] == "No matching signature found"

    before = len(receiver.snapshot())
    result, reports = deliver(sbx, env)  # now: the same event, the same id, accepted
    assert result.code == 0 and reports["webhook"]["delivered"] == 6, result.err
    later = receiver.snapshot()[before:]
    assert later[0]["headers"]["webhook-id"] == old["headers"]["webhook-id"]
    assert [r["status"] for r in later] == [200] * 6
    assert receiver.ids() == [e["hash"] for e in all_events(sbx)]


def test_legacy_signature_header_is_sent_only_when_asked(sbx, tmp_path, receiver):
    import hashlib
    import hmac

    secret = new_hook_secret()
    receiver.secret = secret
    env = {"SBX_WEBHOOK_SECRET": secret}
    seed_stub_events(tmp_path, 1)
    write_settings(sbx, f'[sinks.webhook]\nurl = "{receiver.url}"\nlegacy_signature = true\n')
    result, reports = deliver(sbx, env)
    assert result.code == 0 and reports["webhook"]["delivered"] == 6, result.err
    for request in receiver.snapshot():
        hub_webhook(secret).verify(request["body"], request["headers"])
        want = "sha256=" + hmac.new(secret.encode(), request["body"], hashlib.sha256).hexdigest()
        assert request["headers"]["x-sbx-signature"] == want


# -- 10. plain http: loopback only, unless the user opts in ---------------------------------


def test_plain_http_goes_to_loopback_and_elsewhere_only_when_opted_in(sbx, tmp_path, receiver):
    secret = new_hook_secret()
    receiver.secret = secret
    env = {"SBX_WEBHOOK_SECRET": secret}
    seed_stub_events(tmp_path, 1)
    result, reports = deliver(sbx, {**env, "SBX_WEBHOOK_URL":
                                    f"http://localhost:{receiver.port}/hook"})
    assert result.code == 0 and reports["webhook"]["delivered"] == 6, result.err

    # 0.0.0.0 is not loopback by name: refused (BAD_CASES), then accepted when opted in
    elsewhere = f"http://0.0.0.0:{receiver.port}/hook"
    seed_stub_events(tmp_path, 1)
    result, reports = deliver(sbx, {**env, "SBX_WEBHOOK_URL": elsewhere,
                                    "SBX_WEBHOOK_ALLOW_HTTP": "1"})
    assert result.code == 0 and reports["webhook"]["delivered"] == 6, result.err
    seed_stub_events(tmp_path, 1)
    write_settings(sbx, f'[sinks.webhook]\nurl = "{elsewhere}"\nallow_plain_http = true\n')
    result, reports = deliver(sbx, env)
    assert result.code == 0 and reports["webhook"]["delivered"] == 6, result.err
    assert receiver.ids() == [e["hash"] for e in all_events(sbx)]
    for request in receiver.snapshot():
        check_signature(request, secret)
