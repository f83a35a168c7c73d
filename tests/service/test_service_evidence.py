"""The service and signed evidence (docs/evidence.md, docs/service.md): `sbx serve
--evidence-key PATH` signs with its own key on request; the service never reads a key path
from a request."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from support import SBX

from tests.events.test_evidence_signing import independently_verified
from tests.service.live import LiveService, start_process, stop_process


def test_the_service_signs_with_its_own_key(sbx_home, stub_named, tmp_path, keys_for_service):
    signer = keys_for_service
    live = LiveService(sbx_home, evidence_key=str(signer)).start()
    try:
        headers = {"Authorization": f"Bearer {live.key('write', owner='svc-user')}"}
        box = httpx.post(f"{live.url}/v1/sandboxes", json={"profile": stub_named},
                         headers=headers).json()
        plain = httpx.get(f"{live.url}/v1/sandboxes/{box['id']}/evidence", headers=headers)
        assert plain.json()["format"] == "sandboxer-evidence/1"
        signed = httpx.get(f"{live.url}/v1/sandboxes/{box['id']}/evidence",
                           params={"signed": "true"}, headers=headers).json()
        public = Path(f"{signer}.pub").read_bytes()
        assert independently_verified(signed, public)
        import sandboxer

        assert sandboxer.verify_evidence(signed, key=public) == []
        key_doc = httpx.get(f"{live.url}/v1/evidence/key", headers=headers).json()
        assert key_doc["public_key"].encode() == public
        assert key_doc["keyid"] == signed["signatures"][0]["keyid"]
        client = sandboxer.Sandboxer(url=live.url, token=headers["Authorization"][7:])
        try:  # the library over the service: the service's key, or the caller's own
            by_service = client.get(box["id"]).evidence(by_service=True)
            mine = client.get(box["id"]).evidence(sign=str(signer))
        finally:
            client.close()
        assert sandboxer.verify_evidence(by_service, key=public) == []
        assert sandboxer.verify_evidence(mine, key=public) == []
    finally:
        live.stop()
    unkeyed = LiveService(sbx_home).start()
    try:
        headers = {"Authorization": f"Bearer {unkeyed.key('read', owner='svc-user')}"}
        refused = httpx.get(f"{unkeyed.url}/v1/sandboxes/{box['id']}/evidence",
                            params={"signed": "true"}, headers=headers)
        assert refused.status_code == 409
        assert "--evidence-key" in refused.json()["error"]["message"]
    finally:
        unkeyed.stop()


@pytest.fixture
def keys_for_service(tmp_path):
    from sandboxer.core.observe.signing import generate_keys

    return Path(generate_keys(tmp_path / "service-key")["private"])


def test_sbx_serve_refuses_a_bad_evidence_key(sbx, tmp_path):
    bad = tmp_path / "bad-key"
    bad.write_text("nope\n")
    served = sbx("serve", "--listen", "127.0.0.1:0", "--evidence-key", str(bad), timeout=60)
    assert served.code == 2
    assert served.err.strip() == (f"sbx: key file {bad}: not an unencrypted PEM private key "
                                  "(make one with sbx keys generate PATH)")


def test_sbx_serve_with_an_evidence_key_signs_for_a_cli_client(sbx, tmp_path,
                                                                keys_for_service):
    """The real `sbx serve --evidence-key`, and `sbx --url ... evidence ID --service-signed`."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "stubby.yaml").write_text("backend: stub\nttl: {default: 10m, max: 1h}\n")
    env = sbx.env({"SBX_PROFILE_PATH": str(profiles)})
    key = sbx("api-keys", "create", "--scope", "write", "--json").json()["token"]
    proc, url = start_process(SBX, env, "--evidence-key", str(keys_for_service), cwd=tmp_path)
    try:
        client_env = {"SBX_URL": url, "SBX_TOKEN": key}
        box = sbx("create", "--profile", "stubby", "--json", env=client_env).json()
        out = tmp_path / "served.json"
        made = sbx("evidence", box["id"], "-o", str(out), "--service-signed", env=client_env)
        assert made.code == 0, made.err
        checked = sbx("evidence", "verify", str(out), "--key", f"{keys_for_service}.pub")
        assert checked.code == 0, checked.err
    finally:
        stop_process(proc)
    assert out.exists()
