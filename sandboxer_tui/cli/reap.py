"""`sbx reap` (once, or every DUR) and `sbx reconcile`."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from sandboxer.core.rules.errors import ExitCode
from sandboxer_tui.cli.clients import async_client, client, service_url
from sandboxer_tui.cli.output import JSON_OPTION, command, emit_json, error_doc, fail


def _reap_report_lines(report: dict[str, Any]) -> list[str]:
    lines = [f"destroyed {i}" for i in report["destroyed"]]
    lines += [f"removed orphan {i}" for i in report["orphans"]]
    lines += [f"reconciled {r['id'] or r['ref']}: {r['action']}"
              + (f" -> {r['state']}" if r.get("state") else "") for r in report["reconciled"]]
    lines += [f"warned {i} (sandbox.expiring)" for i in report["warned"]]
    lines += [f"{p['action']} {p['id']} (pool {p['pool']}"
              + (f": {p['reason']})" if p.get("reason") else ")") for p in report.get("pools", [])]
    lines += [f"skipped {s['id']}: {s['error']}" for s in report["skipped"]]
    lines += [f"would {p['action']} {p['id'] or p['ref']}" + (f" ({p['reason']})" if p["reason"]
              else "") for p in report.get("planned", [])]
    return lines


def _cycle_once(timeout, as_json: bool = False, **options: Any) -> dict[str, Any]:
    """One reap (or reconcile) cycle through the library; a cycle past `timeout` leaves at
    once (see _exit_now)."""
    from sandboxer.core.rules.errors import TimedOut

    sbx = client()
    try:
        if options.pop("reconcile", False):
            return sbx.reconcile(**options).to_dict()
        return sbx.reap(timeout=timeout, **options).to_dict()
    except TimedOut as exc:
        _exit_now(exc, as_json)
    finally:
        sbx.close()


def _exit_now(exc: BaseException, as_json: bool) -> None:
    """Leave at once: a backend call may still block a worker thread, and waiting for it
    breaks the bound. Leases taken lapse; the next run completes."""
    import os

    try:
        fail(exc, as_json)
    except SystemExit as stop:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(stop.code)


def _failure_code(failed: list[dict[str, Any]]) -> int:
    """UNAVAILABLE when a backend was unreachable, else FAILED (the operation failed)."""
    if any(f.get("code") == ExitCode.UNAVAILABLE for f in failed):
        return ExitCode.UNAVAILABLE
    return ExitCode.FAILED


def _failure_line(command_name: str, failed: list[dict[str, str]]) -> str:
    first = failed[0]
    more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
    return f"sbx {command_name}: {first['id']}: {first['error']}{more}"


@click.command("reap")
@click.option("--dry-run", is_flag=True, help="Show what would be done; change nothing.")
@click.option("--orphans", is_flag=True,
              help="Also remove this installation's backend objects past their hard deadline, "
                   "even with no database.")
@click.option("--timeout", metavar="DUR", help="Give up after DUR (exit 1).")
@click.option("--every", metavar="DUR", help="Keep running, a cycle every DUR (stop: SIGTERM).")
@click.option("--verbose", "-v", is_flag=True, help="Say what was done (silent otherwise).")
@JSON_OPTION
@command
def reap_command(dry_run, orphans, timeout, every, verbose, as_json) -> None:
    """Reconcile, then destroy every sandbox past its deadline or idle limit. Cron-safe:
    silent on success, one line and a non-zero exit on failure."""
    from sandboxer.core.rules.durations import parse_duration

    limit = parse_duration(timeout, "--timeout") if timeout else None
    interval = parse_duration(every, "--every") if every else None

    def show(report: dict[str, Any]) -> None:
        if as_json:
            click.echo(json.dumps(report) if interval else json.dumps(report, indent=2))
        elif verbose or dry_run:
            for line in _reap_report_lines(report):
                click.echo(line)
        if report["failed"]:
            click.echo(_failure_line("reap", report["failed"]), err=True)

    if interval is None:
        report = _cycle_once(limit, as_json, orphans=orphans, dry_run=dry_run)
        show(report)
        if report["failed"]:
            sys.exit(_failure_code(report["failed"]))
        return
    _reap_forever(interval, limit, orphans, show, as_json)


def _reap_forever(interval, limit, orphans, show, as_json) -> None:
    import asyncio
    import signal

    from sandboxer import Error
    from sandboxer.delivery import check_settings

    if not service_url():
        check_settings()  # a bad sink setting is refused before the first cycle

    def on_report(outcome) -> None:
        if isinstance(outcome, Error):
            doc = error_doc(outcome)
            if as_json:
                click.echo(json.dumps(doc))
            click.echo(f"sbx reap: {doc['error']['message']}", err=True)
        else:
            show(outcome.to_dict())

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with async_client() as sbx:
            await sbx.run_reaper(interval, stop=stop, on_report=on_report, timeout=limit,
                                 orphans=orphans)

    asyncio.run(main())


@click.command("reconcile")
@click.option("--dry-run", is_flag=True, help="Show what would be done; change nothing.")
@JSON_OPTION
@command
def reconcile_command(dry_run: bool, as_json: bool) -> None:
    """Diff the backends (by this installation's label) with the database and repair: adopt,
    destroy or mark lost; complete interrupted operations."""
    report = _cycle_once(None, as_json, reconcile=True, dry_run=dry_run)
    if as_json:
        emit_json(report)
    else:
        for line in _reap_report_lines(report):
            click.echo(line)
    if report["failed"]:
        click.echo(_failure_line("reconcile", report["failed"]), err=True)
        sys.exit(_failure_code(report["failed"]))
