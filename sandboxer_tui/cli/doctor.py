"""`sbx doctor`: backends, the database and versions."""

from __future__ import annotations

import sys

import click

from sandboxer.core.rules.errors import ExitCode
from sandboxer_tui.cli.clients import client
from sandboxer_tui.cli.output import JSON_OPTION, command, emit_json


@click.command("doctor")
@JSON_OPTION
@command
def doctor_command(as_json: bool) -> None:
    """Backends (reachable? credentials? SDK?), the database and versions."""
    with client() as sbx:
        data = sbx.doctor()
    if as_json:
        emit_json(data)
    else:
        click.echo(f"sbx {data['sbx']}  python {data['python']}  sqlite {data['sqlite']}")
        click.echo(f"home       {data['home']}")
        click.echo(f"install    {data['install']}")
        database = data["database"]
        status = "ok" if database.get("ok") else f"ERROR {database.get('error', '')}"
        mode = f" mode {database['file_mode']}" if "file_mode" in database else ""
        click.echo(f"database   {database['url']} ({database['dialect']}, schema "
                   f"{database.get('schema')}{mode}) {status}")
        click.echo("backends")
        for b in data["backends"]:
            if not b["loaded"]:
                click.echo(f"  {b['name']:<8} NOT LOADED  {b['error']}")
                continue
            tag = "  [test double]" if b["test_double"] else ""
            state = "ok" if b["reachable"] and b["credentials"] else "UNAVAILABLE"
            caps = ",".join(b["capabilities"]) or "-"
            click.echo(f"  {b['name']:<8} {state:<11} {b['detail']}  (capabilities: {caps}){tag}")
            if b.get("isolation"):  # each level a profile may ask for (docs/security.md)
                click.echo("           isolation: " + "; ".join(
                    f"{level} {'ok' if said['available'] else 'NO: ' + said['detail']}"
                    for level, said in b["isolation"].items()))
        adapters = data.get("adapters") or {}
        if adapters.get("selected") is not None:
            click.echo(f"SBX_ADAPTERS limits backends to: {', '.join(adapters['selected'])}")
        for name in adapters.get("unknown") or []:
            click.echo(f"SBX_ADAPTERS names {name!r}, which no installed package provides")
        for name, packages in (adapters.get("shadowed") or {}).items():
            click.echo(f"backend {name!r} is also registered by {', '.join(packages)}: "
                       "that one is not used")
    if not data["database"].get("ok"):
        sys.exit(ExitCode.UNAVAILABLE)
