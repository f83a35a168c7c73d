"""Modal ports (docs/terminals-and-ports.md, "Ports") through the real `modal` SDK against the
stand-in (tests/standins/modal_server.py), with the real `sbx` CLI: the profile's ports are
opened as tunnels at create (`encrypted_ports`) and `sbx port` gives each tunnel's https URL
(`sandbox.tunnels()`); a tunnel cannot be added while the sandbox runs (exit 4, naming the
profile's ports:). No traffic is sent to the tunnels' hosts."""

from __future__ import annotations

import pytest
from standins.modal_server import TUNNEL_DOMAIN
from support import modal_sdk_env, one_json

from tests.backends.test_modal import (  # noqa: F401 (image, standin: fixtures)
    TOKEN_ID,
    TOKEN_SECRET,
    created,
    image,
    profile,
    standin,
)


@pytest.fixture(autouse=True)
def modal_env(standin, monkeypatch, tmp_path):  # noqa: F811
    """The SDK pointed at the stand-in with a good token; afterwards, nothing it lacks was
    called."""
    modal_sdk_env(monkeypatch, standin.url, TOKEN_ID, TOKEN_SECRET, tmp_path / "modal.toml")
    seen = len(standin.unimplemented)
    yield
    assert standin.unimplemented[seen:] == [], "the SDK called RPCs the stand-in lacks"


def test_the_profiles_ports_are_modal_tunnels(sbx, standin, image, tmp_path):  # noqa: F811
    path = profile(tmp_path, image, "network: {mode: full}\nports: [8080, 3000]\n")
    box = sbx.create("--profile-file", path)
    opened = created(standin, box).definition.open_ports.ports
    assert sorted((p.port, p.unencrypted) for p in opened) == [(3000, False), (8080, False)]
    sandbox_id = box["backend_ref"].split("@")[0]
    seen = len(standin.calls)
    one = sbx("port", box["id"], "8080")
    # what docs/modal.md lists for ports
    assert {c.method for c in standin.calls[seen:]} <= {
        "ClientHello", "AuthTokenGet", "SandboxWaitV2", "SandboxGetTunnelsV2"}
    assert "SandboxGetTunnelsV2" in {c.method for c in standin.calls[seen:]}
    assert (one.code, one.out.strip()) == (
        0, f"https://{sandbox_id}-8080.{TUNNEL_DOMAIN}"), one.err
    assert one_json(sbx("port", box["id"], "--json").out) == [
        {"port": port, "url": f"https://{sandbox_id}-{port}.{TUNNEL_DOMAIN}"}
        for port in (3000, 8080)]
    exposed = sbx("port", box["id"], "9000", "--expose")
    assert exposed.code == 4 and "profile's ports:" in exposed.err, exposed.err
    missing = sbx("port", box["id"], "9000")
    assert missing.code == 3 and "its ports: 3000, 8080" in missing.err, missing.err


def test_without_ports_modal_opens_no_tunnel(sbx, standin, image, tmp_path):  # noqa: F811
    box = sbx.create("--profile-file", profile(tmp_path, image, "network: {mode: full}\n"))
    assert list(created(standin, box).definition.open_ports.ports) == []
    listed = sbx("port", box["id"], "--json")
    assert (listed.code, one_json(listed.out)) == (0, []), listed.err
