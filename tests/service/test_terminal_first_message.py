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
