"""The proxy's fast path keeps a key the database verified for TTL_S (1 s) at most
(service/proxy_asgi.py): a key revoked while its requests go through the proxy is refused
within that second, and from then on; on the real Docker engine and a live `sbx serve`."""

from __future__ import annotations

import time

import pytest

from sandboxer_tui.service.proxy_asgi import TTL_S
from tests.service.test_port_proxy import Service, service, when_up  # noqa: F401 (fixture)

pytestmark = pytest.mark.docker


def test_a_revoked_key_is_refused_by_the_proxy_within_a_second(service: Service) -> None:  # noqa: F811
    record, token = service.live.new_key("write", owner="writer")
    with service.http(token) as http, service.http(service.live.key("admin")) as admin:
        box = service.sandbox(http)
        hello = f"/v1/sandboxes/{box['id']}/ports/8080/hello"
        assert when_up(http, hello).status_code == 200
        for _ in range(5):  # the key kept by the proxy
            assert http.get(hello).status_code == 200
        assert admin.delete(f"/v1/api-keys/{record['id']}").status_code == 200
        revoked = time.monotonic()
        while (answer := http.get(hello)).status_code == 200:
            assert time.monotonic() - revoked < 30, "the revoked key still opens the proxy"
        took = time.monotonic() - revoked
        assert answer.status_code == 401, answer.text
        assert "revoked" in answer.json()["error"]["message"]
        assert took <= TTL_S + 1.0, f"refused only {took:.2f} s after the revocation"
        for _ in range(3):  # and from then on
            assert http.get(hello).status_code == 401
