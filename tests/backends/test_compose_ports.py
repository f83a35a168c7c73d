"""A compose sandbox's ports (docs/terminals-and-ports.md, "Ports"): what the compose file
publishes (with `compose: {allow: [ports]}`) is what `sbx port` reports, with the host port
the engine picked, reached with an HTTP GET on 127.0.0.1; the profile's own `ports:` is refused
on compose (exit 2, naming the compose file's ports:), changing nothing. The real Docker
Compose on the real engine; the project's network is its own, labelled and removed by the
`sbx` fixture with its containers."""

from __future__ import annotations

import pytest
from support import containers_of, install_id_of, one_json, table_rows

from tests.backends.test_compose import stack
from tests.cli.test_ports_cli import fetch

pytestmark = pytest.mark.docker

WEB_ONLY = {"services": {"web": {
    "image": "sandboxer/base:busybox", "init": True,
    "command": ["sh", "-c", "mkdir -p /www && echo hello from compose > /www/index.html"
                " && exec httpd -f -p 8080 -h /www"],
    "ports": ["127.0.0.1::8080"]}}}  # loopback, the host port the engine's choice


def test_sbx_port_reports_what_the_compose_file_publishes(sbx, docker_api, tmp_path):
    env = stack(tmp_path / "profiles", WEB_ONLY,
                compose={"service": "web", "allow": ["ports"]}, extra="network: {mode: full}\n")
    box = sbx.create("--profile", "stack", "--ttl", "10m", env=env)
    listed = sbx("port", box["id"], "--json", env=env)
    assert listed.code == 0, listed.err
    [view] = one_json(listed.out)
    assert view["port"] == 8080 and view["url"].startswith("http://127.0.0.1:"), view
    assert fetch(view["url"] + "/index.html") == "hello from compose\n"
    one = sbx("port", box["id"], "8080", env=env)
    assert (one.code, one.out.strip()) == (0, view["url"]), one.err
    exposed = sbx("port", box["id"], "9090", "--expose", env=env)
    assert exposed.code == 4 and "compose file's ports:" in exposed.err, exposed.err


def test_the_profiles_own_ports_are_refused_on_compose(sbx, docker_api, tmp_path):
    env = stack(tmp_path / "profiles", WEB_ONLY, compose={"service": "web", "allow": ["ports"]},
                extra="network: {mode: full}\nports: [8080]\n")
    result = sbx("create", "--profile", "stack", env=env)
    assert result.code == 2, result.err
    assert "compose file's ports:" in result.err and "ports: [8080]" in result.err
    assert len(result.err.strip().splitlines()) == 1, result.err
    install = install_id_of(sbx.home)
    assert table_rows(sbx.home, "sandboxes") == []
    assert install is None or containers_of(docker_api, install) == []
