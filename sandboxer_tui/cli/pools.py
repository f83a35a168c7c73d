"""`sbx pool`: warm pools (ls, set, drain)."""

from __future__ import annotations

import sys

import click

from sandboxer_tui.cli.clients import client
from sandboxer_tui.cli.output import JSON_OPTION, command, emit_json, human_age, now_iso, table


@click.group("pool")
def pool_group() -> None:
    """Warm pools: sandboxes made ahead, which `sbx create` claims (docs/pools.md)."""


@pool_group.command("ls")
@JSON_OPTION
@command
def pool_ls(as_json: bool) -> None:
    """Each pool: its size, members ready, creates it served since it started, the oldest."""
    now = now_iso()
    with client() as sbx:
        pools = [p.to_dict() for p in sbx.pools()]
    if as_json:
        emit_json(pools)
    elif pools:
        click.echo(table([(p["profile"], p["backend"], str(p["size"]) + ("*" if p["size_set"]
                           else ""), p["ready"], p["starting"], p["claimed"],
                           human_age(p["oldest"], now) if p["oldest"] else None, p["max_age"],
                           p["error"] or ("" if p["declared"] else "removed: emptying"))
                          for p in pools],
                         ["PROFILE", "BACKEND", "SIZE", "READY", "STARTING", "CLAIMED",
                          "OLDEST", "MAX-AGE", "NOTE"]))
        if any(p["size_set"] for p in pools):
            click.echo("* set by sbx pool set (the profile's size does not apply)", err=True)
    else:
        click.echo("no pools (a profile declares one with `pool: {size: N}`)", err=True)


@pool_group.command("set")
@click.argument("profile", metavar="PROFILE")
@click.option("--size", required=True, type=int, metavar="N",
              help="Warm members to keep (0 empties the pool).")
@JSON_OPTION
@command
def pool_set(profile: str, size: int, as_json: bool) -> None:
    """Keep N warm members of PROFILE, whatever its file says: made (or removed) before
    this returns, so the next create is served warm."""
    with client() as sbx:
        pool = sbx.set_pool_size(profile, size).to_dict()
    if as_json:
        emit_json(pool)
    else:
        click.echo(f"pool {pool['profile']}: size {pool['size']}, {pool['ready']} ready")


@pool_group.command("drain")
@click.argument("profile", metavar="PROFILE")
@JSON_OPTION
@command
def pool_drain(profile: str, as_json: bool) -> None:
    """Destroy every warm member of PROFILE's pool now and keep it empty (size 0) until
    `sbx pool set PROFILE --size N`."""
    with client() as sbx:
        result = sbx.drain_pool(profile)
    if as_json:
        emit_json(result)
    else:
        click.echo(f"drained pool {result['profile']}: {len(result['destroyed'])} member(s) "
                   f"destroyed; it stays empty until sbx pool set {result['profile']} --size N")
        for failure in result["failed"]:
            click.echo(f"sbx: {failure['id']}: {failure['error']}", err=True)
    if result["failed"]:
        sys.exit(result["failed"][0]["code"])
