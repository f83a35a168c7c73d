"""A private evidence key that group or others may read or write is refused, as ssh refuses
such a key (docs/evidence.md): `sbx evidence --sign KEY` and `sbx serve --evidence-key KEY`
exit 2 with one line naming the file and the chmod that fixes it, before anything is signed
or written. Mode 0600 (what `sbx keys generate` writes) signs."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from support import write_profile


@pytest.fixture
def key(sbx, tmp_path) -> Path:
    made = sbx("keys", "generate", str(tmp_path / "signer"))
    assert made.code == 0, made.err
    path = tmp_path / "signer"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # what keys generate writes
    return path


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_evidence_sign_refuses_a_key_others_may_read_and_writes_nothing(sbx, key, tmp_path,
                                                                       mode):
    box = sbx.create("--profile-file", str(write_profile(tmp_path, "stubby", "backend: stub\n")))
    key.chmod(mode)
    out = tmp_path / "evidence.json"

    refused = sbx("evidence", box["id"], "-o", str(out), "--sign", str(key))

    assert refused.code == 2, (refused.out, refused.err)
    assert refused.err.strip() == (
        f"sbx: key file {key}: group or others may read or write it (mode {mode:04o}); a "
        f"private key must be yours alone: chmod 600 {key}")
    assert not out.exists() and refused.out == ""

    key.chmod(0o600)
    signed = sbx("evidence", box["id"], "-o", str(out), "--sign", str(key))
    assert signed.code == 0, signed.err
    assert json.loads(out.read_text())["signatures"]


def test_serve_refuses_an_evidence_key_others_may_read(sbx, key):
    key.chmod(0o644)
    served = sbx("serve", "--listen", "127.0.0.1:0", "--evidence-key", str(key), timeout=60)
    assert served.code == 2, (served.out, served.err)
    lines = served.err.strip().splitlines()
    assert len(lines) == 1 and str(key) in lines[0] and f"chmod 600 {key}" in lines[0]
