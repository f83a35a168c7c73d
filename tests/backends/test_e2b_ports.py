"""E2B ports (docs/terminals-and-ports.md, "Ports") through the real `e2b` SDK against the
stand-in (tests/standins/e2b_server.py), with the real `sbx` CLI: a profile's port is at the
host the SDK's `get_host(port)` gives (https on E2B's domain); `--expose` adds another while
the sandbox runs, recorded once as `sandbox.port` and listed from then on by any process; a port
neither declared nor exposed is exit 3. No traffic is sent to E2B's domain."""

from __future__ import annotations

import pytest
from support import events_of, one_json, write_profile

from tests.backends.test_e2b import e2b, e2b_env, standin  # noqa: F401 (fixtures)


def test_ports_are_the_sdks_get_host_and_expose_adds_one(e2b, tmp_path):  # noqa: F811
    profile = write_profile(tmp_path, "e2b-web",
                            "extends: e2b\nnetwork: {mode: full}\nports: [8080]\n")
    box = e2b.create("--profile-file", str(profile))
    sandbox_id = box["backend_ref"].split("@")[0]
    declared = e2b("port", box["id"], "8080")
    assert (declared.code, declared.out.strip()) == (
        0, f"https://8080-{sandbox_id}.e2b.app"), declared.err

    missing = e2b("port", box["id"], "3000")
    assert missing.code == 3 and "its ports: 8080" in missing.err, missing.err
    exposed = e2b("port", box["id"], "3000", "--expose")
    assert (exposed.code, exposed.out.strip()) == (
        0, f"https://3000-{sandbox_id}.e2b.app"), exposed.err
    assert e2b("port", box["id"], "3000", "--expose").code == 0  # again: nothing new recorded

    listed = one_json(e2b("port", box["id"], "--json").out)  # a new process sees both
    assert listed == [{"port": 3000, "url": f"https://3000-{sandbox_id}.e2b.app"},
                      {"port": 8080, "url": f"https://8080-{sandbox_id}.e2b.app"}]
    recorded = [e["payload"] for e in events_of(e2b.sbx, box["id"])
                if e["type"] == "sandbox.port"]
    assert recorded == [{"port": 3000, "scheme": "https"}]


@pytest.mark.parametrize("body", ["extends: e2b\nports: [8080]\n"])  # e2b's network is none
def test_a_port_without_a_network_is_refused_on_e2b(e2b, tmp_path, body):  # noqa: F811
    result = e2b("create", "--profile-file", str(write_profile(tmp_path, "closed", body)))
    assert result.code == 2 and "network is {mode: none}" in result.err, result.err
