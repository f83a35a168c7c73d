"""`sbx keys`: the ed25519 keys that sign evidence."""

from __future__ import annotations

import click

from sandboxer_tui.cli.output import JSON_OPTION, command, emit_json


@click.group("keys")
def keys_group() -> None:
    """Keys that sign evidence: `sbx keys generate PATH`."""


@keys_group.command("generate")
@click.argument("path", type=click.Path(dir_okay=False), metavar="PATH")
@JSON_OPTION
@command
def keys_generate(path: str, as_json: bool) -> None:
    """An ed25519 key pair: the private key at PATH (mode 0600), the public one at PATH.pub."""
    from sandboxer import generate_keys

    made = generate_keys(path)
    if as_json:
        emit_json(made)
    else:
        click.echo(f"{made['private']} (private, mode 0600) and {made['public']} (public); "
                   f"keyid {made['keyid']}")
