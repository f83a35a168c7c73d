"""Where a published port is reached (docs/terminals-and-ports.md, "Ports"), as pure rules: the
URL of an Endpoint, the address Docker's binding is reached at from this host, and E2B's
`get_host` answer read as an Endpoint."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sandboxer.adapters.base import Endpoint
from sandboxer.adapters.docker import DockerAdapter
from sandboxer.adapters.e2b import TRAFFIC_TOKEN_HEADER, _endpoint


@pytest.mark.parametrize("endpoint, url", [
    (Endpoint(8080, "127.0.0.1", 49153), "http://127.0.0.1:49153"),
    (Endpoint(8080, "::1", 49153), "http://[::1]:49153"),
    (Endpoint(8080, "8080-abc.e2b.app", 443, "https"), "https://8080-abc.e2b.app"),
    (Endpoint(80, "example.test", 80), "http://example.test"),
])
def test_an_endpoints_url(endpoint, url):
    assert endpoint.url == url


@pytest.mark.parametrize("engine, bound, reached", [
    ("unix:///var/run/docker.sock", "127.0.0.1", "127.0.0.1"),
    ("unix:///var/run/docker.sock", "0.0.0.0", "127.0.0.1"),  # every address: loopback here
    ("unix:///var/run/docker.sock", "::", "::1"),
    ("unix:///var/run/docker.sock", "192.0.2.7", "192.0.2.7"),
    ("tcp://engine.example:2376", "0.0.0.0", "engine.example"),  # a remote engine's host
    ("ssh://me@engine.example", "0.0.0.0", "engine.example"),
    ("tcp://engine.example:2376", "127.0.0.1", "127.0.0.1"),  # that host's loopback, as bound
])
def test_the_address_a_docker_binding_is_reached_at(engine, bound, reached):
    assert DockerAdapter(engine)._reach(bound) == reached


def sandbox(host: str, token: str | None = None):
    return SimpleNamespace(get_host=lambda port: host, traffic_access_token=token)


def test_e2b_get_host_as_an_endpoint():
    public = _endpoint(sandbox("8080-abc.e2b.app"), 8080)
    assert (public.url, public.headers) == ("https://8080-abc.e2b.app", {})
    debug = _endpoint(sandbox("localhost:8080"), 8080)  # E2B_DEBUG: plain http on localhost
    assert debug.url == "http://localhost:8080"
    guarded = _endpoint(sandbox("8080-abc.e2b.app", "tok"), 8080)
    assert guarded.headers == {TRAFFIC_TOKEN_HEADER: "tok"}
    assert "tok" not in repr(guarded)  # headers are credentials: never in a log line
