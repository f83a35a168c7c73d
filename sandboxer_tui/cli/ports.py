"""A sandbox's ports from the command line: `sbx port ID [PORT]` (docs/terminals-and-ports.md,
"Ports"): where each published port is reached from here, locally or through SBX_URL."""

from __future__ import annotations

import click

from sandboxer_tui.cli.clients import client
from sandboxer_tui.cli.output import JSON_OPTION, command, emit_json, table


@click.command("port")
@click.argument("sandbox_id", metavar="ID")
@click.argument("port", type=int, required=False, metavar="[PORT]")
@click.option("--expose", is_flag=True,
              help="Make PORT reachable while the sandbox runs, where its backend can (E2B, "
                   "Modal; Docker publishes only the profile's ports:).")
@JSON_OPTION
@command
def port_command(sandbox_id: str, port: int | None, expose: bool, as_json: bool) -> None:
    """The URL a sandbox's PORT is reached at; without PORT, every published port and its URL.
    Exits 3 when PORT is not published (the message lists those that are)."""
    if expose and port is None:
        raise click.UsageError("--expose needs a PORT")
    with client() as sbx:
        box = sbx.get(sandbox_id)
        if port is not None:
            url = box.expose(port) if expose else box.url(port)
            views = [{"port": port, "url": url}]
        else:
            views = [{"port": p, "url": u} for p, u in box.ports().items()]
    if as_json:
        emit_json(views[0] if port is not None else views)
    elif port is not None:
        click.echo(views[0]["url"])
    elif views:
        click.echo(table([[v["port"], v["url"]] for v in views], ["PORT", "URL"]))
    else:
        click.echo(f"sandbox {sandbox_id} publishes no ports (a profile's ports: publishes "
                   "them)", err=True)
