"""The ports routes of `sbx serve` (docs/service.md; docs/terminals-and-ports.md, "Ports") over
real HTTP on the real engine: a write key lists its sandbox's published ports and gets one
(`?port=N`), a port not published is 404 naming those that are, exposing on Docker is 409, a
sandbox of another tenant is 404 as a missing one (nothing about it leaks), a read key cannot
expose (403), a backend without ports is 409. The network is the installation's own bridge,
removed with the containers by the `sbx` fixture; nothing is sent to the sandbox here."""

from __future__ import annotations

import pytest

from tests.service.conftest import Api
from tests.service.test_tenants import made, not_found_like_a_missing_one
from tests.support import RUN_LABEL

pytestmark = pytest.mark.docker

RUN = dict([RUN_LABEL.split("=", 1)])


@pytest.fixture
def web(tmp_path):
    """`web`, a Docker profile publishing 8080, beside `stubby` on the search path."""
    (tmp_path / "profiles" / "web.yaml").write_text(
        "extends: default\nnetwork: {mode: full}\nports: [8080]\n"
        "command: [httpd, -f, -p, '8080', -h, /tmp]\n")
    return "web"


def test_ports_routes_for_the_owner_another_tenant_and_a_read_key(
        live, sbx, stub_named, web):
    alice = Api(live.url, live.key("write", owner="alice"))
    bob = Api(live.url, live.key("write", owner="bob"))
    bob_reader = Api(live.url, live.key("read", owner="bob"))
    box = made(alice, profile=web, labels=RUN)
    ports = f"/v1/sandboxes/{box['id']}/ports"

    listed = alice.get(ports)
    assert listed.status_code == 200, listed.text
    [view] = listed.json()
    assert view["port"] == 8080 and view["url"].startswith("http://127.0.0.1:"), view
    assert alice.get(ports, params={"port": 8080}).json() == [view]

    missing = alice.get(ports, params={"port": 9090})
    assert missing.status_code == 404, missing.text
    assert "no port 9090" in missing.json()["error"]["message"]
    assert "its ports: 8080" in missing.json()["error"]["message"]
    for bad in ("0", "70000", "http"):
        refused = alice.get(ports, params={"port": bad})
        assert refused.status_code in (400, 422) and refused.json()["error"]["code"] == 2, bad

    exposed = alice.post(f"{ports}/9090")
    assert exposed.status_code == 409, exposed.text
    assert "ports:" in exposed.json()["error"]["message"]
    assert alice.post(f"{ports}/8080").json() == view  # published already: its URL

    for answer in (bob.get(ports), bob.get(ports, params={"port": 8080}),
                   bob.post(f"{ports}/8080"), bob_reader.get(ports)):
        not_found_like_a_missing_one(answer, box["id"])
    assert bob_reader.post(f"{ports}/8080").status_code == 403

    stubbed = made(alice, profile=stub_named)
    answer = alice.get(f"/v1/sandboxes/{stubbed['id']}/ports")
    assert answer.status_code == 409, answer.text
    assert "the stub backend cannot publish ports" in answer.json()["error"]["message"]
    for api in (alice, bob, bob_reader):
        api.http.close()
