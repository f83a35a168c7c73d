"""`sbx tui` (and `sbx` alone on a terminal): opens the dashboard (sandboxer_tui/dashboard)."""

from __future__ import annotations

import sys

import click

from sandboxer_tui.cli.output import command


@click.command("tui")
@click.option("--read-only", is_flag=True, help="Hide every action that changes anything.")
@click.option("--refresh", type=click.FloatRange(min=0.2, max=60), default=1.0,
              show_default=True, metavar="SECONDS", help="How often the inventory is read.")
@click.option("--extend-by", "extend_by", default="30m", show_default=True, metavar="DUR",
              help="What `t` adds to a deadline.")
@command
def tui_command(read_only: bool = False, refresh: float = 1.0, extend_by: str = "30m") -> None:
    """The dashboard: every sandbox, live, one key per action (docs/dashboard.md)."""
    import os

    from sandboxer.core.rules.durations import parse_duration

    step = parse_duration(extend_by, "--extend-by")
    from sandboxer.core.rules.settings import sbx_home

    sbx_home()  # a state folder it refuses is said in one line, before the terminal is taken
    from sandboxer_tui.dashboard.app import run as run_dashboard  # textual loads only here

    code = run_dashboard(read_only=read_only, refresh=refresh, extend_step=step)
    sys.stdout.flush()
    sys.stderr.flush()
    # a backend call still blocked in a worker thread (a hung engine) must not hold the exit
    os._exit(code)
