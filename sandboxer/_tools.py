"""What the library offers without a client: profile files, their schema and trust, and the
offline check of an evidence bundle. All of it is local to this machine."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandboxer.core.rules.profiles import Profile


def load_profile(path: str | Path) -> Profile:
    """A profile file, resolved (its `extends:` along the search path); BadInput naming the
    file, the field and the reason when it cannot be used (`.problems` lists them all)."""
    from sandboxer.core.rules.profiles import ProfileLoader

    return ProfileLoader().load_file(Path(path))


def profile_schema() -> dict[str, Any]:
    """The JSON Schema of a profile file (docs/profile.schema.json)."""
    from sandboxer.core.rules.profiles import json_schema

    return json_schema()


def trust_profiles(folder: str | Path | None = None) -> tuple[Path, list[str], str]:
    """Use the profiles in `folder` (default ./.sbx/profiles) as they are now: (the folder,
    its profile names, the digest recorded). A change to them leaves them out again."""
    from sandboxer.core.rules.profiles import trust

    return trust(None if folder is None else Path(folder))


def untrust_profiles(folder: str | Path | None = None) -> tuple[Path, bool]:
    """Stop using the profiles in `folder`: (the folder, whether it was trusted)."""
    from sandboxer.core.rules.profiles import untrust

    return untrust(None if folder is None else Path(folder))


def verify_evidence(bundle: Mapping[str, Any],
                    key: str | Path | bytes | None = None) -> list[str]:
    """Check an evidence bundle offline: the problems found, each naming the altered part or
    event; empty when intact. A signed bundle (a DSSE envelope) is checked the same way
    inside, and with `key` (the public key's PEM file, or PEM bytes) its signature too: a
    bundle signed by another key, or altered after signing, is named. Without `key` a
    signature is not checked. BadInput for a key that is not an ed25519 public key."""
    from sandboxer.core.observe import signing
    from sandboxer.core.observe.evidence import verify

    if signing.is_envelope(bundle):
        public = None if key is None else signing.load_public_key(
            key if isinstance(key, bytes) else Path(key))
        return signing.verify(bundle, public)
    if key is not None:
        signing.load_public_key(key if isinstance(key, bytes) else Path(key))  # a bad key: 2
        return ["not signed: a plain evidence bundle, not a DSSE envelope (sign one with "
                "sbx evidence ID -o FILE --sign KEY)"]
    return verify(bundle)


def generate_keys(path: str | Path) -> dict[str, str]:
    """An ed25519 key pair for signing evidence: the private key at `path` (mode 0600) and
    the public key at `path`.pub, both PEM; `{"private", "public", "keyid"}`. BadInput when
    either file exists (a key is never overwritten)."""
    from sandboxer.core.observe.signing import generate_keys as generate

    return generate(path)
