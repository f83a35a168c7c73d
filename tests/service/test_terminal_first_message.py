"""A new terminal's first message over the WebSocket must be a JSON text frame
(docs/terminals-and-ports.md, "Over the service: the WebSocket"): a binary frame first, or
a text frame that is not a JSON object, is refused with the error message and a 4400 close,
as any bad first message is, not an internal error (1011) with a traceback in the log."""

from __future__ import annotations

import asyncio
import json

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.service.conftest import Api


@pytest.mark.parametrize("first", [b"\x1b[A keys before the open", "[1, 2]", "null"])
async def test_a_bad_first_message_is_a_4400_with_one_line(live, stub_named, first):
    token = live.key("write", owner="alice")
    api = Api(live.url, token)
    box = api.post("/v1/sandboxes", json={"profile": stub_named}).json()
    url = live.url.replace("http://", "ws://") + f"/v1/sandboxes/{box['id']}/pty"
    try:
        async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            await ws.send(first)
            said = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert said["error"]["kind"] == "bad_input", said
            assert "first message is a JSON object" in said["error"]["message"]
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 30)
            assert closed.value.rcvd.code == 4400
    finally:
        api.http.close()


@pytest.mark.docker
async def test_revoking_the_key_closes_its_open_terminal(live, monkeypatch):
    """A terminal's WebSocket is one long request: revoking the key it came with closes it
    (4401, kind unauthorized) within KEY_CHECK_S, rather than leaving a leaked key a shell
    for as long as the sandbox lives. The session itself runs on (another key reattaches)."""
    import sandboxer
    from sandboxer_tui.service import auth
    from tests.support import RUN_LABEL

    monkeypatch.setattr(auth, "KEY_CHECK_S", 0.5)
    local = sandboxer.Sandboxer(home=live.home, actor="test-setup")
    try:
        record, token = local.create_api_key("write", owner="alice")
    finally:
        local.close()
    api = Api(live.url, token)
    label, value = RUN_LABEL.split("=", 1)
    box = api.post("/v1/sandboxes", json={"profile": "default", "ttl": "10m",
                                          "labels": {label: value}}).json()
    url = live.url.replace("http://", "ws://") + f"/v1/sandboxes/{box['id']}/pty"
    assert box.get("state") == "running", box
    admin = Api(live.url, live.key("admin"))
    try:
        async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            await ws.send(json.dumps({"argv": ["sh"]}))
            assert "session" in json.loads(await asyncio.wait_for(ws.recv(), 30))
            revoked = admin.delete(f"/v1/api-keys/{record['id']}")
            assert revoked.status_code == 200, revoked.text
            said = None
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    message = await asyncio.wait_for(ws.recv(), 30)
                    if isinstance(message, str):
                        said = json.loads(message)
            assert closed.value.rcvd.code == 4401
            assert said is not None and said["error"]["kind"] == "unauthorized", said
    finally:
        admin.delete(f"/v1/sandboxes/{box['id']}")
        admin.http.close()
        api.http.close()
