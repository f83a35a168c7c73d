"""`sbx port ID [PORT]` (docs/terminals-and-ports.md, "Ports") with the real `sbx` on the real
engine: the URL of a profile's port, the same locally and through a real `sbx serve`
(SBX_URL), reached with an HTTP GET on 127.0.0.1; a port not published is exit 3 naming those
that are; Docker cannot expose one while running (exit 4); a profile that cannot publish
(network none, a backend without ports) is refused at create, exit 2, changing nothing.

The network is the installation's own private bridge (`network: {mode: full}`); the `sbx`
fixture removes it and the containers by id. Traffic goes to 127.0.0.1 only."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from support import SBX, containers_of, install_id_of, one_json, table_rows, write_profile

pytestmark = pytest.mark.docker

PAGE = "served from inside\n"
WEB = ("extends: default\nnetwork: {mode: full}\nports: [8080]\n"
       "command: [sh, -c, \"mkdir -p /tmp/www && printf 'served from inside\\\\n' > "
       "/tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www\"]\n")


def fetch(url: str, limit_s: float = 30.0) -> str:
    """The body of GET `url` once the server in the sandbox answers (no proxy: loopback)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    give_up = time.monotonic() + limit_s
    while True:
        try:
            with opener.open(url, timeout=5) as reply:
                return reply.read().decode()
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > give_up:
                raise
            time.sleep(0.1)


def snapshot(home: Path, docker_api) -> dict:
    install = install_id_of(home)
    return {"sandboxes": table_rows(home, "sandboxes"), "events": table_rows(home, "events"),
            "containers": sorted(c["Id"] for c in containers_of(docker_api, install))
            if install else []}


def test_sbx_port_prints_the_url_locally_and_through_a_service(sbx, docker_api, tmp_path):
    from tests.service.live import start_process, stop_process

    profile = write_profile(tmp_path, "web", WEB)
    token = sbx("api-keys", "create", "--scope", "admin", "--owner", "agent").out.split()[-1]
    proc, service = start_process(SBX, sbx.env(), cwd=tmp_path)
    remote = {"SBX_URL": service, "SBX_TOKEN": token}
    try:
        box = sbx.create("--profile-file", str(profile), env=remote)["id"]
        local = sbx("port", box, "8080")
        assert local.code == 0, local.err
        url = local.out.strip()
        assert url.startswith("http://127.0.0.1:") and url.count("\n") == 0, url
        assert fetch(url + "/index.html") == PAGE

        through = sbx("port", box, "8080", env=remote)
        assert (through.code, through.out.strip()) == (0, url), through.err
        listed = sbx("port", box, "--json", env=remote)
        assert one_json(listed.out) == [{"port": 8080, "url": url}], listed.err
        table = sbx("port", box)
        assert table.out.split() == ["PORT", "URL", "8080", url], table.out
        assert one_json(sbx("port", box, "8080", "--json").out) == {"port": 8080, "url": url}

        # the engine bound it on loopback only
        ref = json.loads(sbx("show", box, "--json").out)["backend_ref"]
        bound = docker_api.inspect_container(ref)["NetworkSettings"]["Ports"]["8080/tcp"]
        assert {b["HostIp"] for b in bound} == {"127.0.0.1"}
        assert url.endswith(f":{bound[0]['HostPort']}")

        before = snapshot(sbx.home, docker_api)
        for env in (None, remote):
            missing = sbx("port", box, "9090", env=env)
            assert missing.code == 3, missing.err
            assert "no port 9090" in missing.err and "its ports: 8080" in missing.err
            assert missing.err.count("\n") == 1 and "Traceback" not in missing.err
            exposed = sbx("port", box, "9090", "--expose", env=env)
            assert exposed.code == 4, exposed.err
            assert "ports:" in exposed.err and exposed.err.count("\n") == 1, exposed.err
            bad = sbx("port", box, "0", env=env)
            assert bad.code == 2 and bad.err.count("\n") == 1, bad.err
        assert snapshot(sbx.home, docker_api) == before
    finally:
        stop_process(proc)


@pytest.mark.parametrize("body, mentions", [
    ("extends: default\nports: [8080]\n",  # the default profile's network is none
     ["network is {mode: none}", "network: {mode: full}"]),
    ("backend: stub\nnetwork: {mode: full}\nports: [8080]\n",
     ["the stub backend cannot publish ports", "ports: [8080]"]),
    ("backend: ssh\nnetwork: {mode: full}\nports: [8080]\n",
     ["the ssh backend cannot publish ports", "ports: [8080]"]),
    ("extends: default\nnetwork: {mode: full}\nports: [8080, 8080]\n",
     ["port 8080 is listed twice"]),
    ("extends: default\nnetwork: {mode: full}\nports: [65536]\n", ["ports[0]"]),
    ("extends: default\nnetwork: {mode: full}\nports: [80]\npublish_address: anywhere\n",
     ["'anywhere' is not an IP address"]),
])
def test_a_profile_that_cannot_publish_is_refused_exit_2_changing_nothing(
        sbx, docker_api, tmp_path, body, mentions):
    sbx.create()
    before = snapshot(sbx.home, docker_api)
    profile = write_profile(tmp_path, "cannot", body)
    for argv in (["create", "--profile-file", str(profile)],
                 ["profiles", "validate", str(profile)]):
        result = sbx(*argv)
        assert result.code == 2, (argv, result.err)
        assert len(result.err.strip().splitlines()) == 1, result.err
        for mention in mentions:
            assert mention in result.err, (mention, result.err)
    assert snapshot(sbx.home, docker_api) == before


def test_a_backend_without_ports_refuses_sbx_port_exit_4(sbx, tmp_path):
    box = sbx.create("--profile-file", str(write_profile(tmp_path, "stubby", "backend: stub\n")))
    result = sbx("port", box["id"])
    assert result.code == 4, result.err
    assert "the stub backend cannot publish ports" in result.err
    assert result.err.count("\n") == 1
