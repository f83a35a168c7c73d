"""`sbx db`: the inventory's store."""

from __future__ import annotations

import click

from sandboxer_tui.cli.clients import client
from sandboxer_tui.cli.output import JSON_OPTION, command, emit_json


@click.group("db")
def db_group() -> None:
    """The inventory's store (SQLite by default; PostgreSQL for fleets)."""


@db_group.command("copy")
@click.option("--to", "target", required=True, metavar="URL",
              help="The empty database to copy into, e.g. postgresql+psycopg://USER@HOST/DB.")
@JSON_OPTION
@command
def db_copy_command(target: str, as_json: bool) -> None:
    """Copy every sandbox, checkpoint, event and delivery record into another database.
    Afterwards point SBX_DATABASE_URL at it."""
    with client() as sbx:
        report = sbx.copy_database(target)
    if as_json:
        emit_json(report)
    else:
        rows = ", ".join(f"{n} {t}" for t, n in report["rows"].items())
        click.echo(f"copied into {report['target']}: {rows}; event chain verified "
                   f"({report['events_verified']} events)")
