"""`sbx`: the entry point pip's script runs, and `python -m sandboxer_tui`. The command goes
to a running `sbx server` when there is one (sandboxer_tui/resident/launcher.py, built-in
modules only); else it runs here, in the CLI (sandboxer_tui/cli), and with
SBX_SERVER_AUTOSTART=1 a server is started behind it for the commands that follow. The one
module that joins the two rooms, so that neither imports the other."""

from __future__ import annotations

import os
import sys

from sandboxer_tui.resident import launcher


def main() -> None:
    args = sys.argv[1:]
    if launcher.wants_server(args):
        code = launcher.through_server(args)
        if code is not None:
            sys.stderr.flush()
            os._exit(code)  # skips the interpreter's teardown (~3 ms): nothing here needs it
        if launcher.autostart_idle_s() is not None and not launcher.is_remote(args):
            from sandboxer_tui.resident.control import autostart

            autostart()
    from sandboxer_tui.cli import main as run_cli

    run_cli(args)


if __name__ == "__main__":
    main()
