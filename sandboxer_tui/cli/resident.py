"""`sbx server`: start, stop and ask the resident server (sandboxer_tui/resident), which
loads only when one of these runs."""

from __future__ import annotations

import click

from sandboxer_tui.cli.output import JSON_OPTION, command, emit_json


@click.group("server")
def server_group() -> None:
    """A resident process that makes every `sbx` command start fast.

    With a server running for this SBX_HOME, `sbx` hands each command to it; the server
    forks a child that has already imported sbx's libraries. Without one, commands run as usual.
    """


@server_group.command("start")
@click.option("--idle", "idle", default=None, metavar="DURATION",
              help="Exit after this long without a command (default: never).")
@JSON_OPTION
@command
def server_start_command(idle: str | None, as_json: bool) -> None:
    """Start the server in the background (nothing happens if one runs)."""
    from sandboxer.core.rules.durations import parse_duration
    from sandboxer_tui.resident import control

    idle_s = parse_duration(idle, "--idle").total_seconds() if idle else None
    status, new = control.start(idle_s)
    if as_json:
        emit_json({**status, "started": new})
    else:
        click.echo(f"sbx server {'started' if new else 'already running'} (pid {status['pid']})")


@server_group.command("stop")
@JSON_OPTION
@command
def server_stop_command(as_json: bool) -> None:
    """Stop the server; commands it is running finish first."""
    from sandboxer_tui.resident import control

    status = control.stop()
    if as_json:
        emit_json({"stopped": status is not None, "pid": status and status["pid"]})
    else:
        click.echo(f"sbx server stopped (pid {status['pid']})" if status else "no sbx server running")


@server_group.command("status")
@JSON_OPTION
@command
def server_status_command(as_json: bool) -> None:
    """Whether a server runs for this SBX_HOME, and how many commands it served."""
    from sandboxer_tui.resident import control

    status = control.query_status(control.server_folder())
    running = bool(status and "pid" in status)
    if as_json:
        emit_json({"running": running, **(status or {})})
    elif running:
        click.echo(f"sbx server running (pid {status['pid']}, {status['served']} commands served)")
    else:
        click.echo("no sbx server running")
