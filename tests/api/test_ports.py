"""A sandbox's ports as URLs (docs/terminals-and-ports.md, "Ports") on the real Docker engine,
through the library in process and as a client of a live `sbx serve`: a profile's `ports:`
published on 127.0.0.1 only, with a host port the engine picks, a busybox httpd reached at
`box.url(8080)`; a port not published is NotFound naming those that are; Docker cannot add a
port while the sandbox runs. The network is the installation's own private bridge (`network:
{mode: full}`), which the client fixture removes by id with the containers; traffic goes to
127.0.0.1 only."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time

import httpx
import pytest
from support import ROOT

import sandboxer
from sandboxer.core.rules.profiles import ProfileLoader
from tests.api.conftest import RUN

pytestmark = pytest.mark.docker

PAGE = "hello from a port of the sandbox\n"
# busybox httpd in the foreground, serving one file from a folder it makes
HTTPD = ["sh", "-c", f"mkdir -p /tmp/www && printf '{PAGE}' > /tmp/www/index.html && "
                     "exec httpd -f -p 8080 -h /tmp/www"]


def web_profile(**more):
    return ProfileLoader().load_mapping({
        "name": "web", "extends": "default", "network": {"mode": "full"}, "ports": [8080],
        "command": HTTPD, **more})


async def get_when_up(url: str, limit_s: float = 30.0) -> httpx.Response:
    """GET `url` until the server in the sandbox answers (it starts with the container)."""
    give_up = time.monotonic() + limit_s
    async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
        while True:
            try:
                return await http.get(url)
            except httpx.TransportError:
                if time.monotonic() > give_up:
                    raise
                await asyncio.sleep(0.1)


async def test_a_declared_port_is_published_on_loopback_and_its_url_reaches_the_server(
        client, docker_api):
    box = await client.create(web_profile(), ttl="10m", labels=RUN)
    url = await box.url(8080)
    assert url.startswith("http://127.0.0.1:"), url
    host_port = int(url.rsplit(":", 1)[1])
    reply = await get_when_up(url + "/index.html")
    assert (reply.status_code, reply.text) == (200, PAGE)
    assert await box.ports() == {8080: url}

    # bound on loopback only, as the engine records it
    info = docker_api.inspect_container(box.backend_ref)
    bindings = info["HostConfig"]["PortBindings"]["8080/tcp"]
    assert [b["HostIp"] for b in bindings] == ["127.0.0.1"]
    published = info["NetworkSettings"]["Ports"]["8080/tcp"]
    assert {b["HostIp"] for b in published} == {"127.0.0.1"}
    assert [int(b["HostPort"]) for b in published] == [host_port]


async def test_a_port_not_published_is_not_found_naming_the_ports_that_are(client):
    box = await client.create(web_profile(), ttl="10m", labels=RUN)
    with pytest.raises(sandboxer.NotFound) as caught:
        await box.url(9090)
    assert "no port 9090" in str(caught.value) and "its ports: 8080" in str(caught.value)
    assert caught.value.exit_code == 3
    with pytest.raises(sandboxer.BadInput):
        await box.url(70000)


async def test_docker_cannot_expose_a_port_while_running_and_says_to_declare_it(client):
    box = await client.create(web_profile(), ttl="10m", labels=RUN)
    before = [e.type for e in await box.events()]
    with pytest.raises(sandboxer.Conflict) as caught:
        await box.expose(9090)
    assert "ports:" in str(caught.value) and "9090" in str(caught.value)
    assert caught.value.exit_code == 4
    assert await box.ports() == {8080: await box.url(8080)}  # nothing changed
    assert [e.type for e in await box.events()] == before
    # a port the profile published is exposed already: its URL, nothing recorded
    assert await box.expose(8080) == await box.url(8080)
    assert [e.type for e in await box.events()] == before


async def test_another_publish_address_is_an_opt_in_of_the_profile(client, docker_api):
    box = await client.create(web_profile(publish_address="0.0.0.0"), ttl="10m", labels=RUN)
    info = docker_api.inspect_container(box.backend_ref)
    assert [b["HostIp"] for b in info["HostConfig"]["PortBindings"]["8080/tcp"]] == ["0.0.0.0"]
    url = await box.url(8080)
    assert url.startswith("http://127.0.0.1:")  # reached from here at loopback
    reply = await get_when_up(url + "/index.html")
    assert reply.text == PAGE


def test_the_documented_example_runs(sbx, tmp_path):
    """docs/terminals-and-ports.md's Python example, as written, on the test's SBX_HOME."""
    section = (ROOT / "docs" / "terminals-and-ports.md").read_text().split("## Ports")[1]
    [example] = re.findall(r"```python\n(.*?)```", section.split("\n## ")[0], re.S)
    done = subprocess.run([sys.executable, "-c", example], env=sbx.env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    url, ports = done.stdout.splitlines()
    assert url.startswith("http://127.0.0.1:") and ports == repr({8080: url})
