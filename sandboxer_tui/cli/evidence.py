"""`sbx evidence`: export one sandbox's evidence bundle (signed, if asked), verify one."""

from __future__ import annotations

import json
import sys

import click

from sandboxer.core.rules.errors import BadInput, ExitCode
from sandboxer_tui.cli.clients import client
from sandboxer_tui.cli.groups import DefaultGroup
from sandboxer_tui.cli.output import JSON_OPTION, command, emit_json


@click.group("evidence", cls=DefaultGroup, default_command="export")
def evidence_group() -> None:
    """Supervision evidence: `sbx evidence ID --output FILE`, `sbx evidence verify FILE`."""


@evidence_group.command("export")
@click.argument("sandbox_id", metavar="ID")
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False), metavar="FILE")
@click.option("--sign", "key", type=click.Path(dir_okay=False), metavar="PATH",
              help="Sign it with this ed25519 private key (sbx keys generate): a DSSE "
                   "envelope of an in-toto Statement (docs/evidence.md).")
@click.option("--service-signed", is_flag=True,
              help="As a client of `sbx serve`: signed by the service's own key.")
@command
def evidence_export(sandbox_id: str, output: str, key: str | None = None,
                    service_signed: bool = False) -> None:
    """Write one sandbox's evidence bundle: record, profile, events, execs, summary."""
    with client() as sbx:
        doc = sbx.get(sandbox_id).evidence(output, sign=key, by_service=service_signed)
    if key is None and not service_signed:
        click.echo(f"{output}: {len(doc['events'])} events of {doc['sandbox']['id']}")
        return
    from sandboxer.evidence import open_envelope

    bundle, _ = open_envelope(doc)
    keyids = ", ".join(s["keyid"][:16] for s in doc["signatures"])
    click.echo(f"{output}: {len(bundle['events'])} events of {bundle['sandbox']['id']}, "
               f"signed (keyid {keyids})")


@evidence_group.command("verify")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--key", type=click.Path(dir_okay=False), metavar="PATH.pub",
              help="Also check its signature: signed by this ed25519 public key, unaltered.")
@JSON_OPTION
@command
def evidence_verify(file: str, as_json: bool, key: str | None = None) -> None:
    """Check a bundle offline; exit 1 naming each altered part or event."""
    from sandboxer import verify_evidence as verify
    from sandboxer.evidence import is_envelope, open_envelope

    try:
        with open(file) as handle:
            bundle = json.load(handle)
    except OSError as exc:
        raise BadInput(f"{file}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise BadInput(f"{file}: not a JSON evidence bundle: {exc}") from None
    problems = verify(bundle, key=key)
    signed = is_envelope(bundle)
    if signed:
        bundle = open_envelope(bundle)[0] or {}
    signature = ("checked" if key is not None else "not checked") if signed else "none"
    if as_json:
        emit_json({"file": file, "intact": not problems, "problems": problems,
                   "signature": signature})
    elif not problems:
        said = {"checked": f", signed by the key in {key}", "none": "",
                "not checked": "; signed, the signature NOT checked (give --key PATH.pub)"}
        click.echo(f"{file}: intact ({len(bundle.get('events', []))} events){said[signature]}")
    for problem in problems if not as_json else []:
        click.echo(f"sbx: {file}: {problem}", err=True)
    if problems:
        sys.exit(ExitCode.FAILED)
