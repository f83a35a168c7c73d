"""The terminal's WebSocket, `/v1/sandboxes/{ref}/pty` (docs/terminals-and-ports.md,
"Terminals"), spoken by a plain WebSocket client against a live service: the protocol (the
session message, binary frames both ways, resize, close, exit), and the refusals, answered
before the WebSocket is accepted as any route answers them (no key 401, a read key 403,
another tenant's sandbox 404 as a missing one), none of which opens anything."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.service.conftest import Api
from tests.support import RUN_LABEL

ws_url = lambda live, ref, query="": (  # noqa: E731
    live.url.replace("http://", "ws://") + f"/v1/sandboxes/{ref}/pty{query}")


def made(api: Api, **body) -> dict:
    answer = api.post("/v1/sandboxes", json=body)
    assert answer.status_code == 201, answer.text
    return answer.json()


def pty_events(api: Api, sandbox_id: str) -> list[dict]:
    events = api.get("/v1/events", params={"sandbox": sandbox_id}).json()
    return [e for e in events if e["type"].startswith("sandbox.pty")]


async def output_until(ws, needle: bytes, within: float = 30.0) -> bytes:
    seen = b""
    deadline = time.monotonic() + within
    while needle not in seen:
        message = await asyncio.wait_for(ws.recv(), max(0.01, deadline - time.monotonic()))
        assert isinstance(message, bytes), message
        seen += message
    return seen


@pytest.mark.docker
async def test_the_protocol_a_shell_typed_into_resized_and_closed(live):
    token = live.key("write", owner="alice")
    api = Api(live.url, token)
    key, value = RUN_LABEL.split("=", 1)
    box = made(api, profile="default", ttl="10m", labels={key: value})
    try:
        async with connect(ws_url(live, box["id"]), compression=None,
                           additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            await ws.send(json.dumps({"argv": ["sh"], "cols": 90, "rows": 20}))
            said = json.loads(await ws.recv())
            assert said["session"].startswith("pty-") and said["offset"] == 0
            assert said["terminal"]["sandbox_id"] == box["id"]
            await ws.send(b"stty size; echo $((6*7))\r")
            await output_until(ws, b"20 90\r\n42")
            await ws.send(json.dumps({"resize": [120, 33]}))
            await ws.send(b"stty size\r")
            await output_until(ws, b"33 120")
            await ws.send(json.dumps({"close": True}))
            ended = None
            while ended is None:
                message = await asyncio.wait_for(ws.recv(), 30)
                if isinstance(message, str):
                    ended = json.loads(message)
            assert set(ended) == {"exit"}  # the program was killed: 137, or not known
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 30)
            assert closed.value.rcvd.code == 1000
        events = pty_events(api, box["id"])
        assert [(e["type"], e["actor"]) for e in events] == [
            ("sandbox.pty.opened", "alice"), ("sandbox.pty.closed", "alice")]
        assert events[1]["payload"]["how"] == "closed"
        assert (events[1]["payload"]["cols"], events[1]["payload"]["rows"]) == (120, 33)
    finally:
        api.delete(f"/v1/sandboxes/{box['id']}")
        api.http.close()


async def test_refused_before_the_accept_and_nothing_is_opened(live, stub_named):
    alice = Api(live.url, live.key("write", owner="alice"))
    hers = made(alice, profile=stub_named)
    missing = "sbx-0000000000000000000000000"

    async def refused(ref: str, token: str | None) -> tuple[int, dict]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        with pytest.raises(InvalidStatus) as answer:
            async with connect(ws_url(live, ref), additional_headers=headers):
                pass
        return answer.value.response.status_code, json.loads(answer.value.response.body)

    status, body = await refused(hers["id"], None)
    assert status == 401 and body["error"]["kind"] == "unauthorized"
    assert "API key" in body["error"]["message"]
    status, body = await refused(hers["id"], "sbxk_not-a-key")
    assert status == 401
    status, body = await refused(hers["id"], live.key("read", owner="alice"))
    assert status == 403 and "write key" in body["error"]["message"]
    bob = live.key("write", owner="bob")
    status, body = await refused(hers["id"], bob)  # another tenant's: as a missing one
    assert (status, body["error"]) == (404, {"code": 3, "kind": "not_found",
                                             "message": f"no sandbox {hers['id']!r}"})
    status, missing_body = await refused(missing, bob)
    assert status == 404 and missing_body["error"]["kind"] == "not_found"

    # a key that may: the stub has no terminals, said after the accept, with close 4409
    async with connect(ws_url(live, hers["id"]), additional_headers={
            "Authorization": f"Bearer {alice.headers['Authorization'].split()[1]}"}) as ws:
        await ws.send(json.dumps({"argv": None}))
        error = json.loads(await ws.recv())["error"]
        assert error == {"code": 4, "kind": "conflict",
                         "message": "the stub backend cannot open a terminal"}
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd.code == 4409
    # a first message that is not one
    async with connect(ws_url(live, hers["id"]), additional_headers={
            "Authorization": f"Bearer {alice.headers['Authorization'].split()[1]}"}) as ws:
        await ws.send("hello")
        error = json.loads(await ws.recv())["error"]
        assert error["kind"] == "bad_input" and "first message" in error["message"]
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd.code == 4400
    assert pty_events(Api(live.url, live.key("admin", owner="ops")), hers["id"]) == []
    alice.http.close()


@pytest.mark.docker
async def test_over_the_unix_socket_without_a_key(sbx_home, stub_named):
    import os
    import uuid

    import sandboxer
    from tests.service.live import LiveService

    path = f"/tmp/sbx-pty-{uuid.uuid4().hex[:8]}.sock"
    live = LiveService(sbx_home, socket_path=path).start()
    try:
        async with sandboxer.AsyncSandboxer(url=f"unix://{path}") as sbx:
            key, value = RUN_LABEL.split("=", 1)
            box = await sbx.create("default", ttl="10m", labels={key: value})
            term = await box.pty(["sh"])
            await term.write("echo over-the-socket-$((6*7)); exit 4\r")
            seen = b""
            while chunk := await asyncio.wait_for(term.read(), 30):
                seen += chunk
            assert b"over-the-socket-42" in seen and term.exit_code == 4
            await box.destroy()
    finally:
        live.stop()
        assert not os.path.exists(path)
