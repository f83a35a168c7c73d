"""Signed evidence bundles for tools beside the library (the `sbx` CLI, a verifier): whether a
document is a signed envelope, the bundle inside one, and a signing key checked before it is
needed. `AsyncSandbox.evidence()` writes bundles and `sandboxer.verify_evidence` checks them;
the format is docs/evidence.md."""

from __future__ import annotations

from pathlib import Path

from sandboxer.core.observe.signing import is_envelope, open_envelope


def check_signing_key(path: str | Path) -> None:
    """Raise `BadInput` saying what is wrong unless `path` holds an ed25519 private key only
    its owner may read (`sandboxer.generate_keys` makes one): a service that signs on request
    refuses a bad key when it starts, not at the first request."""
    from sandboxer.core.observe.signing import load_signer

    load_signer(path)


__all__ = ["check_signing_key", "is_envelope", "open_envelope"]
