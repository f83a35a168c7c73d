"""`sbx api-keys`: the HTTP service's keys (create, ls, revoke)."""

from __future__ import annotations

import click

from sandboxer_tui.cli.clients import client
from sandboxer_tui.cli.output import JSON_OPTION, command, emit_json, table


@click.group("api-keys")
def api_keys_group() -> None:
    """Keys of the HTTP service: create (shown once), ls, revoke."""


@api_keys_group.command("create")
@click.option("--scope", required=True, type=click.Choice(["read", "write", "admin"]),
              help="read: look; write: also act; admin: also manage keys.")
@click.option("--owner", metavar="WHO", help="Who its requests are recorded as (default: you): "
              "its tenant, whose sandboxes a read or write key alone sees.")
@click.option("--max-sandboxes", type=click.IntRange(min=1), metavar="N",
              help="The owner's quota: live sandboxes at once.")
@click.option("--max-ttl", metavar="DUR", help="The owner's quota: the longest TTL.")
@click.option("--max-execs", type=click.IntRange(min=1), metavar="N",
              help="The owner's quota: commands running at once.")
@JSON_OPTION
@command
def api_keys_create(scope: str, owner: str | None, max_sandboxes: int | None,
                    max_ttl: str | None, max_execs: int | None, as_json: bool) -> None:
    """A new key; printed once (the last word), only its hash is kept."""
    with client() as sbx:
        key, token = sbx.create_api_key(scope, owner=owner, max_sandboxes=max_sandboxes,
                                        max_ttl=max_ttl, max_execs=max_execs)
    if as_json:
        emit_json({**key, "token": token})
    else:
        click.echo(f"{key['id']} ({key['scope']}, owner {key['owner']}); the key, shown only "
                   f"now: {token}")


@api_keys_group.command("ls")
@JSON_OPTION
@command
def api_keys_ls(as_json: bool) -> None:
    """Every key (revoked ones too), never the keys themselves."""
    with client() as sbx:
        keys = sbx.api_keys()
    if as_json:
        emit_json(keys)
    elif keys:
        click.echo(table([(k["id"], k["scope"], k["owner"], k["created_at"], k["created_by"],
                           k["revoked_at"]) for k in keys],
                         ["ID", "SCOPE", "OWNER", "CREATED", "BY", "REVOKED"]))
    else:
        click.echo("no API keys (sbx api-keys create makes one)", err=True)


@api_keys_group.command("revoke")
@click.argument("key_id", metavar="ID")
@JSON_OPTION
@command
def api_keys_revoke(key_id: str, as_json: bool) -> None:
    """Revoke a key: its next request is refused (401)."""
    with client() as sbx:
        key = sbx.revoke_api_key(key_id)
    if as_json:
        emit_json(key)
    else:
        click.echo(f"revoked {key['id']} ({key['scope']}, owner {key['owner']})")
