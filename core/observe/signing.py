"""Signed supervision evidence (docs/evidence.md): ed25519 keys, and an evidence bundle as an
in-toto Statement v1 inside a DSSE envelope, signed and checked with securesystemslib's DSSE
Envelope and signer (no DSSE or PAE code of our own).

The Statement's subjects are the sandbox's event-chain head and the digest of each exec's
output; its predicate is the whole evidence bundle (sandboxer.core.observe.evidence), so the checks of an
unsigned bundle still run on it, and the signature says who vouches for all of it.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sandboxer.core.rules.errors import BadInput

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://sandboxer.dev/evidence/v1"


# -- keys ------------------------------------------------------------------------------------


def generate_keys(path: str | Path) -> dict[str, str]:
    """An ed25519 key pair: the private key at `path` (PEM, PKCS#8, mode 0600), the public
    key at `path`.pub (PEM). Neither file may exist yet: a key is never overwritten, and a
    refusal writes nothing."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Path(path)
    public = Path(f"{private}.pub")
    for target in (private, public):
        if os.path.lexists(target):
            raise BadInput(f"{target} exists: sbx keys generate never overwrites a key "
                           "(remove it, or choose another path)")
    if not private.parent.is_dir():
        raise BadInput(f"{private.parent} is not a folder: cannot write {private.name} there")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    _write_new(private, private_pem, 0o600)
    try:
        _write_new(public, public_pem, 0o644)
    except BaseException:
        private.unlink(missing_ok=True)  # both or neither
        raise
    return {"private": str(private), "public": str(public), "keyid": keyid(public_pem)}


def _write_new(path: Path, data: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    except OSError as exc:
        raise BadInput(f"{path}: cannot write: {exc.strerror or exc}") from None
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(path, mode)  # whatever the umask said


def _read_key_file(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise BadInput(f"key file {path}: cannot read: {exc.strerror or exc}") from None


def _read_private_key_file(path: str | Path) -> tuple[bytes, int]:
    """The file's bytes and mode, both of the file opened (what is checked is what is read)."""
    try:
        with open(path, "rb") as file:
            return file.read(), os.fstat(file.fileno()).st_mode
    except OSError as exc:
        raise BadInput(f"key file {path}: cannot read: {exc.strerror or exc}") from None


def load_signer(path: str | Path) -> Any:
    """The signer of the ed25519 private key in `path` (BadInput naming what is wrong). A key
    that group or others may read or write is refused, as ssh refuses one: a signature
    vouches for something only while the key is its owner's alone."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import CryptoSigner, SSlibKey

    data, mode = _read_private_key_file(path)
    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError, binascii.Error):
        raise BadInput(f"key file {path}: not an unencrypted PEM private key (make one with "
                       "sbx keys generate PATH)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise BadInput(f"key file {path}: a {type(key).__name__.removeprefix('_')} key; sbx "
                       "signs with ed25519 (sbx keys generate PATH)")
    if mode & 0o077:
        raise BadInput(f"key file {path}: group or others may read or write it (mode "
                       f"{mode & 0o777:04o}); a private key must be yours alone: "
                       f"chmod 600 {shlex.quote(str(path))}")
    return CryptoSigner(key, SSlibKey.from_crypto(key.public_key()))


def load_public_key(key: str | Path | bytes) -> Any:
    """The ed25519 public key in the PEM file `key` (or PEM bytes), as securesystemslib's
    key; BadInput naming what is wrong."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key
    from securesystemslib.signer import SSlibKey

    where = "the key given" if isinstance(key, bytes) else f"key file {key}"
    data = key if isinstance(key, bytes) else _read_key_file(key)
    if b"PRIVATE KEY" in data:
        raise BadInput(f"{where}: a private key; verify with its public half (PATH.pub)")
    try:
        public = load_pem_public_key(data)
    except (ValueError, TypeError, binascii.Error):
        raise BadInput(f"{where}: not a PEM public key (sbx keys generate writes one at "
                       "PATH.pub)") from None
    if not isinstance(public, Ed25519PublicKey):
        raise BadInput(f"{where}: a {type(public).__name__.removeprefix('_')} key; sbx "
                       "evidence is signed with ed25519")
    return SSlibKey.from_crypto(public)


def keyid(public_pem: bytes) -> str:
    """The key's id as securesystemslib computes it (what an envelope's `keyid` says)."""
    return load_public_key(public_pem).keyid


def public_key_pem(private_path: str | Path) -> str:
    """The public half of the private key in `private_path`, as PEM."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    signer = load_signer(private_path)
    public = load_pem_public_key(signer.public_key.keyval["public"].encode()) \
        if signer.public_key.keyval["public"].startswith("-----") else None
    if public is None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        public = Ed25519PublicKey.from_public_bytes(bytes.fromhex(
            signer.public_key.keyval["public"]))
    return public.public_bytes(serialization.Encoding.PEM,
                               serialization.PublicFormat.SubjectPublicKeyInfo).decode()


# -- the statement ---------------------------------------------------------------------------


def subjects(bundle: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What the statement is about: the sandbox's event-chain head (its last event's hash),
    then the SHA-256 of each exec's stdout and stderr, as the event log recorded them."""
    sandbox_id = (bundle.get("sandbox") or {}).get("id")
    events = bundle.get("events") or []
    found = []
    if events:
        head = events[-1]
        found.append({"name": f"{sandbox_id}/events@{head.get('id')}",
                      "digest": {"sha256": head.get("hash")}})
    for record in bundle.get("execs") or []:
        for stream in ("stdout", "stderr"):
            output = record.get(stream) or {}
            if output.get("sha256"):
                found.append({"name": f"{sandbox_id}/exec/{record.get('event_id')}/{stream}",
                              "digest": {"sha256": output["sha256"]},
                              "annotations": {"bytes": output.get("bytes")}})
    return found


def statement(bundle: Mapping[str, Any]) -> dict[str, Any]:
    return {"_type": STATEMENT_TYPE, "subject": subjects(bundle),
            "predicateType": PREDICATE_TYPE, "predicate": dict(bundle)}


def sign(bundle: Mapping[str, Any], key_path: str | Path) -> dict[str, Any]:
    """The bundle as a signed DSSE envelope: `payloadType`, base64 `payload` (the in-toto
    Statement), `signatures` ([{keyid, sig}])."""
    from securesystemslib.dsse import Envelope

    signer = load_signer(key_path)  # read now, when used; kept nowhere
    payload = json.dumps(statement(bundle), sort_keys=True, separators=(",", ":"),
                         ensure_ascii=False).encode()
    envelope = Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    envelope.sign(signer)
    return envelope.to_dict()


def is_envelope(doc: Any) -> bool:
    return isinstance(doc, Mapping) and "payloadType" in doc and "signatures" in doc


# -- checking --------------------------------------------------------------------------------


def open_envelope(doc: Mapping[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """The bundle inside a signed envelope (None if there is none to read), and the problems
    of the envelope and its statement; the signature is not checked here (`verify`)."""
    problems: list[str] = []
    if doc.get("payloadType") != PAYLOAD_TYPE:
        problems.append(f"payloadType is {doc.get('payloadType')!r}, not {PAYLOAD_TYPE}")
    try:
        payload = base64.b64decode(doc.get("payload") or "", validate=True)
        found = json.loads(payload)
    except (binascii.Error, ValueError, TypeError):
        return None, [*problems, "payload is not base64 of a JSON statement"]
    if not isinstance(found, Mapping):
        return None, [*problems, "payload is not a JSON object (an in-toto Statement)"]
    if found.get("_type") != STATEMENT_TYPE:
        problems.append(f"statement _type is {found.get('_type')!r}, not {STATEMENT_TYPE}")
    if found.get("predicateType") != PREDICATE_TYPE:
        problems.append(f"predicateType is {found.get('predicateType')!r}, not "
                        f"{PREDICATE_TYPE}")
    bundle = found.get("predicate")
    if not isinstance(bundle, Mapping):
        return None, [*problems, "the statement has no predicate (the evidence bundle)"]
    problems += _subject_problems(found.get("subject"), bundle)
    return dict(bundle), problems


def _subject_problems(claimed: Any, bundle: Mapping[str, Any]) -> list[str]:
    if not isinstance(claimed, list):
        return ["the statement's subject is not a list"]
    expected = {s["name"]: s for s in subjects(bundle)}
    given = {s.get("name"): s for s in claimed if isinstance(s, Mapping)}
    problems = [f"subject {name} is missing" for name in expected if name not in given]
    problems += [f"subject {name} is not in the evidence" for name in given
                 if name not in expected]
    problems += [f"subject {name}: its digest does not match the evidence"
                 for name, subject in given.items()
                 if name in expected and subject.get("digest") != expected[name]["digest"]]
    return problems


def check_signature(doc: Mapping[str, Any], key: Any) -> list[str]:
    """Whether `key` (load_public_key) signed this envelope as it is: [] when it did, else
    one problem naming what failed (another key, or content altered after signing)."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError

    try:
        envelope = Envelope.from_dict(json.loads(json.dumps(doc)))
    except Exception as exc:  # a signature list of another shape, bad base64
        return [f"not a DSSE envelope securesystemslib can read: {' '.join(str(exc).split())}"]
    keyids = sorted(envelope.signatures)
    if key.keyid not in keyids:
        return [f"signature: signed by another key (keyid {', '.join(k[:16] for k in keyids)}"
                f"{'' if keyids else 'none'}), not by the key given (keyid {key.keyid[:16]})"]
    try:
        envelope.verify([key], 1)
    except VerificationError:
        return [f"signature: key {key.keyid[:16]}'s signature does not match the envelope: "
                "its payload or payloadType was altered after signing"]
    return []


def verify(doc: Mapping[str, Any], key: Any | None) -> list[str]:
    """Every problem of a signed bundle: its signature (when `key` is given), its envelope
    and statement, then the bundle's own checks (sandboxer.core.observe.evidence.verify)."""
    from sandboxer.core.observe.evidence import verify as verify_bundle

    problems = check_signature(doc, key) if key is not None else []
    bundle, found = open_envelope(doc)
    problems += found
    if bundle is not None:
        problems += verify_bundle(bundle)
    return problems
