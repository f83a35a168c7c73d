"""Signed supervision evidence (docs/evidence.md): `sbx keys generate`, `sbx evidence ID -o
FILE --sign KEY` (a DSSE envelope of an in-toto Statement v1), `sbx evidence verify FILE
--key KEY.pub`, the library and the service. An independent check (plain ed25519 over DSSE's
PAE, computed here with `cryptography`) accepts what sbx signs."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from support import RUN_LABEL

PAYLOAD_TYPE = "application/vnd.in-toto+json"


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding, from the DSSE specification (not sbx's code)."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def independently_verified(envelope: dict, public_pem: bytes) -> bool:
    key = load_pem_public_key(public_pem)
    assert isinstance(key, Ed25519PublicKey)
    payload = base64.b64decode(envelope["payload"])
    for signature in envelope["signatures"]:
        try:
            key.verify(base64.b64decode(signature["sig"]), pae(envelope["payloadType"], payload))
            return True
        except Exception:
            continue
    return False


def statement_of(envelope: dict) -> dict:
    return json.loads(base64.b64decode(envelope["payload"]))


def resigned(envelope: dict, statement: dict) -> dict:
    """The envelope with another payload and its old signatures (an alteration)."""
    altered = copy.deepcopy(envelope)
    altered["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    return altered


@pytest.fixture
def keys(sbx, tmp_path):
    made = sbx("keys", "generate", str(tmp_path / "signer"), "--json")
    assert made.code == 0, made.err
    other = sbx("keys", "generate", str(tmp_path / "stranger"))
    assert other.code == 0, other.err
    return tmp_path / "signer", tmp_path / "stranger", made.json()["keyid"]


def test_keys_generate_writes_a_private_key_0600_and_its_public_pem(sbx, tmp_path):
    path = tmp_path / "evidence-key"
    made = sbx("keys", "generate", str(path), "--json")
    assert made.code == 0, made.err
    doc = made.json()
    assert doc["private"] == str(path) and doc["public"] == f"{path}.pub"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    public = Path(f"{path}.pub").read_bytes()
    assert isinstance(load_pem_public_key(public), Ed25519PublicKey)
    assert len(doc["keyid"]) == 64

    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    again = sbx("keys", "generate", str(path))
    assert again.code == 2
    assert again.err.strip() == (f"sbx: {path} exists: sbx keys generate never overwrites a "
                                 "key (remove it, or choose another path)")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    nowhere = sbx("keys", "generate", str(tmp_path / "no-such-folder" / "key"))
    assert nowhere.code == 2 and "is not a folder" in nowhere.err
    assert not (tmp_path / "no-such-folder").exists()


@pytest.mark.docker
def test_signed_evidence_is_a_dsse_envelope_of_an_in_toto_statement(sbx, keys, tmp_path):
    signer, _, keyid = keys
    box = sbx.create("--task", "signed task", "--owner", "agent-7")
    ran = sbx("exec", box["id"], "--", "sh", "-c", "echo out; echo err >&2")
    assert ran.code == 0
    assert sbx("snapshot", box["id"]).code == 0
    out = tmp_path / "evidence.dsse.json"
    made = sbx("evidence", box["id"], "-o", str(out), "--sign", str(signer))
    assert made.code == 0, made.err
    assert "signed (keyid" in made.out
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    envelope = json.loads(out.read_text())
    assert envelope["payloadType"] == PAYLOAD_TYPE
    (signature,) = envelope["signatures"]
    assert signature["keyid"] == keyid and base64.b64decode(signature["sig"])
    statement = statement_of(envelope)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://sandboxer.dev/evidence/v1"
    events = sbx("events", box["id"], "--json").json()
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    head = events[-1]
    assert subjects[f"{box['id']}/events@{head['id']}"] == head["hash"]
    (exec_event,) = [e for e in events if e["type"] == "sandbox.exec"]
    assert subjects[f"{box['id']}/exec/{exec_event['id']}/stdout"] == hashlib.sha256(
        b"out\n").hexdigest()
    assert subjects[f"{box['id']}/exec/{exec_event['id']}/stderr"] == hashlib.sha256(
        b"err\n").hexdigest()
    predicate = statement["predicate"]
    assert predicate["sandbox"]["owner"] == "agent-7"  # who
    assert predicate["summary"]["task"] == "signed task"  # what task
    assert predicate["sandbox"]["backend"] == "docker" and predicate["sandbox"]["host"]  # where
    assert predicate["summary"]["created_at"] == box["created_at"]  # when
    assert predicate["profile"]["name"] == "default"  # which profile
    assert predicate["execs"][0]["argv"] == ["sh", "-c", "echo out; echo err >&2"]
    assert len(predicate["checkpoints"]) == 1
    assert "peak_memory_bytes" in predicate["summary"]["metrics"]

    public = Path(f"{signer}.pub").read_bytes()
    assert independently_verified(envelope, public)
    checked = sbx("evidence", "verify", str(out), "--key", f"{signer}.pub")
    assert checked.code == 0, checked.err
    assert checked.out.strip() == (f"{out}: intact ({len(events)} events), signed by the key "
                                   f"in {signer}.pub")
    assert sbx("destroy", box["id"]).code == 0


@pytest.mark.docker
def test_an_altered_or_foreign_bundle_is_refused_naming_what_failed(sbx, keys, tmp_path):
    from sandboxer.core.observe.signing import sign

    signer, stranger, _ = keys
    box = sbx.create("--task", "honest")
    assert sbx("exec", box["id"], "--", "echo", "hello").code == 0
    out = tmp_path / "good.json"
    assert sbx("evidence", box["id"], "-o", str(out), "--sign", str(signer)).code == 0
    good = json.loads(out.read_text())
    statement = statement_of(good)

    task_changed = copy.deepcopy(statement)
    task_changed["predicate"]["summary"]["task"] = "something else"
    subject_changed = copy.deepcopy(statement)
    subject_changed["subject"][-1]["digest"]["sha256"] = "0" * 64
    event_changed = copy.deepcopy(statement["predicate"])
    event_changed["events"][0]["actor"] = "someone-else"
    cases = {
        "payload": (resigned(good, task_changed),
                    ["does not match the envelope", "part 'summary' was altered"]),
        "subject": (resigned(good, subject_changed),
                    ["does not match the envelope", "its digest does not match"]),
        "payloadType": ({**good, "payloadType": "application/json"},
                        ["does not match the envelope", "payloadType is 'application/json'"]),
        "sig": ({**good, "signatures": [{**good["signatures"][0], "sig": base64.b64encode(
            b"\0" * 64).decode()}]}, ["does not match the envelope"]),
        "keyid": ({**good, "signatures": [{**good["signatures"][0], "keyid": "f" * 64}]},
                  ["signed by another key"]),
        "other key": (sign(statement["predicate"], stranger), ["signed by another key"]),
        # signed by the right key, but its event no longer matches the chain's hash
        "event": (sign(event_changed, signer), [f"event {event_changed['events'][0]['id']} "
                                                "(sandbox.creating) was altered"]),
    }
    for what, (doc, said) in cases.items():
        path = tmp_path / f"bad-{what.replace(' ', '-')}.json"
        path.write_text(json.dumps(doc))
        checked = sbx("evidence", "verify", str(path), "--key", f"{signer}.pub")
        assert checked.code == 1, (what, checked.out, checked.err)
        for fragment in said:
            assert fragment in checked.err, (what, checked.err)
        assert checked.out == ""
        # DSSE signs payloadType and payload: the plain check refuses every other change but
        # the keyid (a hint DSSE leaves unsigned; sbx wants it to be the key's) and the bundle
        # re-signed with the right key (whose content no longer matches its own chain)
        assert independently_verified(doc, Path(f"{signer}.pub").read_bytes()) is (
            what in ("keyid", "event")), what
    as_json = sbx("evidence", "verify", str(tmp_path / "bad-keyid.json"), "--key",
                  f"{signer}.pub", "--json")
    assert as_json.code == 1 and as_json.json()["intact"] is False
    assert sbx("destroy", box["id"]).code == 0


@pytest.mark.docker
def test_bad_key_files_are_bad_input(sbx, keys, tmp_path):
    signer, _, _ = keys
    box = sbx.create()
    out = tmp_path / "signed.json"
    assert sbx("evidence", box["id"], "-o", str(out), "--sign", str(signer)).code == 0
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a key\n")
    for key, said in ((tmp_path / "missing.pub", "cannot read: No such file or directory"),
                      (signer, "a private key; verify with its public half"),
                      (garbage, "not a PEM public key")):
        checked = sbx("evidence", "verify", str(out), "--key", str(key))
        assert checked.code == 2, checked.err
        assert checked.err.strip() == f"sbx: key file {key}: {said}" or said in checked.err
    target = tmp_path / "never-written.json"
    for key in (f"{signer}.pub", str(garbage), str(tmp_path / "missing")):
        refused = sbx("evidence", box["id"], "-o", str(target), "--sign", key)
        assert refused.code == 2, refused.err
        assert not target.exists()
    assert sbx("destroy", box["id"]).code == 0


@pytest.mark.docker
def test_unsigned_bundles_work_as_before(sbx, keys, tmp_path):
    signer, _, _ = keys
    box = sbx.create()
    out = tmp_path / "plain.json"
    assert sbx("evidence", box["id"], "-o", str(out)).code == 0
    bundle = json.loads(out.read_text())
    assert bundle["format"] == "sandboxer-evidence/1"
    checked = sbx("evidence", "verify", str(out))
    assert (checked.code, checked.out.strip()) == (0, f"{out}: intact "
                                                      f"({len(bundle['events'])} events)")
    with_key = sbx("evidence", "verify", str(out), "--key", f"{signer}.pub")
    assert with_key.code == 1
    assert "not signed: a plain evidence bundle" in with_key.err
    signed = tmp_path / "signed.json"
    assert sbx("evidence", box["id"], "-o", str(signed), "--sign", str(signer)).code == 0
    unkeyed = sbx("evidence", "verify", str(signed))
    assert unkeyed.code == 0 and "the signature NOT checked" in unkeyed.out
    assert sbx("destroy", box["id"]).code == 0


@pytest.mark.docker
def test_the_library_signs_and_verifies(sbx_home, tmp_path):
    import sandboxer

    made = sandboxer.generate_keys(tmp_path / "lib-key")
    with sandboxer.Sandboxer() as client:
        box = client.create(labels=dict([RUN_LABEL.split("=")]), task="library")
        try:
            box.exec(["echo", "from the library"])
            envelope = box.evidence(tmp_path / "lib.json", sign=made["private"])
        finally:
            box.destroy()
    assert envelope == json.loads((tmp_path / "lib.json").read_text())
    assert envelope["signatures"][0]["keyid"] == made["keyid"]
    assert sandboxer.verify_evidence(envelope, key=made["public"]) == []
    assert sandboxer.verify_evidence(envelope, key=Path(made["public"]).read_bytes()) == []
    other = sandboxer.generate_keys(tmp_path / "other-key")
    assert sandboxer.verify_evidence(envelope, key=other["public"])[0].startswith(
        "signature: signed by another key")
    with pytest.raises(sandboxer.BadInput, match="a private key"):
        sandboxer.verify_evidence(envelope, key=made["private"])
    assert independently_verified(envelope, Path(made["public"]).read_bytes())
