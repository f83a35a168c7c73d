"""A sandbox's background processes from the command line: `sbx ps`, `sbx attach` and
`sbx kill` (`sbx exec --detach` starts one)."""

from __future__ import annotations

import sys
from typing import Any

import click

from sandboxer.core.rules.errors import BadInput, ExitCode
from sandboxer_tui.cli.clients import client
from sandboxer_tui.cli.output import JSON_OPTION, command, emit_json, table


def signal_number(text: str) -> int:
    """`TERM`, `SIGTERM`, `term` or `15`."""
    import signal

    if text.isdigit():
        number = int(text)
        if 1 <= number <= 64:
            return number
    else:
        name = text.upper()
        found = getattr(signal, name if name.startswith("SIG") else f"SIG{name}", None)
        if isinstance(found, signal.Signals):
            return int(found)
    raise BadInput(f"bad --signal {text[:20]!r}: a signal name (TERM, KILL, INT) or number")


def _state(view: dict[str, Any]) -> str:
    return "running" if view["running"] else f"exited {view['exit_code']}"


@click.command("ps")
@click.argument("sandbox_id", metavar="ID")
@JSON_OPTION
@command
def ps_command(sandbox_id: str, as_json: bool) -> None:
    """A sandbox's background processes (started with sbx exec --detach)."""
    from sandboxer_tui.formatting import printable

    with client() as sbx:
        views = [p.to_dict() for p in sbx.get(sandbox_id).processes.list()]
    if as_json:
        emit_json(views)
    elif views:
        click.echo(table([[v["pid"], _state(v), v["started_at"],
                           printable(" ".join(v["argv"]))] for v in views],
                         ["PID", "STATE", "STARTED", "COMMAND"]))
    else:
        click.echo("no background processes (sbx exec --detach starts one)", err=True)


@click.command("attach")
@click.argument("sandbox_id", metavar="ID")
@click.argument("pid", type=int, metavar="PID")
@click.option("--stdout-offset", type=click.IntRange(min=0), default=0,
              help="Start at this byte of its stdout (default: all that is kept).")
@click.option("--stderr-offset", type=click.IntRange(min=0), default=0,
              help="Start at this byte of its stderr.")
@click.option("--no-follow", is_flag=True, help="Print what is there, then stop.")
@command
def attach_command(sandbox_id: str, pid: int, stdout_offset: int, stderr_offset: int,
                   no_follow: bool) -> None:
    """A background process's output (what is kept of it, then as it comes); exits with
    its exit status once it ends."""
    outputs = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}
    with client() as sbx:
        proc = sbx.get(sandbox_id).processes.get(pid)
        for item in proc.output(stdout_offset=stdout_offset, stderr_offset=stderr_offset,
                                follow=not no_follow):
            outputs[item.stream].write(item.data)
            outputs[item.stream].flush()
        code = proc.exit_code
    if no_follow and code is None:
        return
    sys.exit(ExitCode.FAILED if code is None else code)


@click.command("kill")
@click.argument("sandbox_id", metavar="ID")
@click.argument("pid", type=int, metavar="PID")
@click.option("-s", "--signal", "sig", default="KILL", show_default=True, metavar="SIGNAL",
              help="A signal name or number.")
@JSON_OPTION
@command
def kill_command(sandbox_id: str, pid: int, sig: str, as_json: bool) -> None:
    """Send a signal to a background process."""
    number = signal_number(sig)
    with client() as sbx:
        proc = sbx.get(sandbox_id).processes.get(pid)
        proc.kill(number)
        view = proc.to_dict()
    if as_json:
        emit_json(view)
    else:
        click.echo(f"{pid} {_state(view)}")
