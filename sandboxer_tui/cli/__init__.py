"""The `sbx` command line (docs/cli.md is its contract): the root group and `main()` here, one
module per command group beside them, and what they share in output.py (printing, errors and
exit codes), clients.py (the library client) and groups.py.

Commands parse, call the library (`sandboxer`), and show. No logic lives here. Heavy modules
load inside the commands that need them, so `sbx ls` and `sbx --help` start fast. The `sbx`
entry point is sandboxer_tui/resident/launcher.py, which runs `main()` when no `sbx server`
takes the command.
"""

from __future__ import annotations

import os
import sys

import click

from sandboxer.core.rules.errors import BadInput, ExitCode
from sandboxer_tui.cli import (
    api_keys,
    checkpoints,
    db,
    doctor,
    events,
    evidence,
    files,
    keys,
    mcp,
    metrics,
    pools,
    ports,
    processes,
    profiles,
    reap,
    resident,
    sandboxes,
    serve,
    terminals,
    tui,
    volumes,
)
from sandboxer_tui.cli.output import fail


def _use_service(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """`--url`: this command is a client of that service (as SBX_URL says)."""
    if value:
        os.environ["SBX_URL"] = value


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sandboxer", prog_name="sbx")
@click.option("--url", metavar="URL", expose_value=False, is_eager=True,
              callback=_use_service,
              help="Be a client of the sbx service at URL (default: $SBX_URL; the key in "
                   "$SBX_TOKEN).")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Sandboxer: short-lived sandboxes from profiles, on Docker and other backends.

    On a terminal, `sbx` alone opens the dashboard (as `sbx tui` does); without one it
    prints this help.
    """
    if ctx.invoked_subcommand is None:
        if sys.stdout.isatty() and sys.stdin.isatty():
            ctx.invoke(tui.tui_command)
        else:
            click.echo(ctx.get_help())


for _command in (
    tui.tui_command,
    doctor.doctor_command,
    profiles.profiles_group,
    sandboxes.create_command,
    sandboxes.ls_command,
    sandboxes.show_command,
    sandboxes.exec_command,
    processes.ps_command,
    processes.attach_command,
    processes.kill_command,
    terminals.shell_command,
    ports.port_command,
    files.cp_command,
    files.files_group,
    sandboxes.logs_command,
    sandboxes.destroy_command,
    sandboxes.extend_command,
    sandboxes.touch_command,
    sandboxes.pause_command,
    sandboxes.resume_command,
    reap.reap_command,
    reap.reconcile_command,
    events.events_group,
    checkpoints.snapshot_command,
    checkpoints.restore_command,
    checkpoints.checkpoints_group,
    checkpoints.checkpoint_group,
    metrics.metrics_command,
    evidence.evidence_group,
    keys.keys_group,
    db.db_group,
    pools.pool_group,
    resident.server_group,
    serve.serve_command,
    mcp.mcp_command,
    api_keys.api_keys_group,
    volumes.volume_group,
):
    cli.add_command(_command)


def _not_utf8(arg: str) -> bool:
    """Bytes that were not UTF-8 reach Python as lone surrogates (surrogateescape)."""
    try:
        arg.encode()
    except UnicodeEncodeError:
        return True
    return False


def main(args: list[str] | None = None) -> None:
    """Run sbx. Click's own usage errors follow the same rules as ours: one line (or one
    JSON object under --json) and exit 2."""
    import gc

    args = sys.argv[1:] if args is None else args
    if any(name.startswith("OTEL_") for name in os.environ):
        import logging  # an exporter's retries say nothing; only a batch it gave up on

        logging.getLogger("opentelemetry").setLevel(logging.ERROR)
    for arg in args:
        if not arg.isascii() and _not_utf8(arg):  # ids, names, labels, commands: all UTF-8
            fail(BadInput(f"argument {arg!r} is not UTF-8 text"), "--json" in args)
    try:
        code = cli.main(args=args, prog_name="sbx", standalone_mode=False)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "sbx"
        fail(BadInput(f"{exc.format_message()} (see {where} --help)"), "--json" in args)
    except click.Abort:
        click.echo("sbx: aborted", err=True)
        code = ExitCode.FAILED
    except click.ClickException as exc:
        fail(BadInput(exc.format_message()), "--json" in args)
    finally:
        telemetry = sys.modules.get("sandboxer.core.observe.telemetry")
        if telemetry is not None:  # loaded by an operation: its spans and metrics go out now
            telemetry.shutdown()
        gc.freeze()  # nothing left to collect: skip the costly sweep at interpreter exit
    sys.exit(code if isinstance(code, int) else ExitCode.OK)
