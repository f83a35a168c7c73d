"""WebSockets (a terminal's, the proxy's, a preview link's) are capped as connections are
(docs/security.md, "The service's limits"): at most half of SBX_SERVE_MAX_CONNECTIONS are
WebSockets, the next one is refused (503) before it opens, and plain requests still get
the rest. Before, WebSockets were not counted against the cap yet took its slots, so a
write key's terminals, or anyone holding a preview link to a sandbox that keeps its
WebSockets open, made every route of every tenant 503. Against a live sbx serve."""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.service.conftest import Api
from tests.service.live import LiveService


async def test_websockets_take_at_most_half_of_the_connections(sbx_home, stub_named,
                                                                monkeypatch):
    monkeypatch.setenv("SBX_SERVE_MAX_CONNECTIONS", "8")
    live = LiveService(sbx_home).start()
    opened = []
    try:
        token = live.key("write", owner="alice")
        api = Api(live.url, token)
        box = api.post("/v1/sandboxes", json={"profile": stub_named}).json()
        api.http.close()
        url = live.url.replace("http://", "ws://") + f"/v1/sandboxes/{box['id']}/pty"
        key = {"Authorization": f"Bearer {token}"}
        for _ in range(4):  # a terminal's socket waits for its first message: held open
            opened.append(await connect(url, additional_headers=key))
        with pytest.raises(InvalidStatus) as refused:
            opened.append(await connect(url, additional_headers=key))
        assert refused.value.response.status_code == 503
        said = json.loads(refused.value.response.body)["error"]
        assert said["kind"] == "unavailable" and "SBX_SERVE_MAX_CONNECTIONS" in said["message"]
        async with httpx.AsyncClient(base_url=live.url, headers=key) as http:
            listed = await http.get("/v1/sandboxes")
            assert listed.status_code == 200, listed.text
        await opened.pop().close()  # one closed: its slot is free again
        opened.append(await connect(url, additional_headers=key))
    finally:
        for ws in opened:
            await ws.close()
        live.stop()
