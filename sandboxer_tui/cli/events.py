"""`sbx events`: the event log, its delivery to sinks, its hash chain."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

import click

from sandboxer.core.rules.errors import ExitCode
from sandboxer_tui.cli.clients import client
from sandboxer_tui.cli.groups import DefaultGroup
from sandboxer_tui.cli.output import JSON_OPTION, command, emit_json, table


@click.group("events", cls=DefaultGroup, default_command="list")
def events_group() -> None:
    """The event log: `sbx events [ID]`, `sbx events verify`."""


def _event_line(view: Mapping[str, Any]) -> str:
    data = " ".join(f"{k}={json.dumps(v)}" for k, v in view["payload"].items())
    reason = f" reason={view['reason']}" if view["reason"] else ""
    return (f"{view['time']}  {view['sandbox_id'] or '-'}  {view['type']}  "
            f"by {view['actor']}{reason}  {data}").rstrip()


@events_group.command("list")
@click.argument("sandbox_id", required=False, metavar="[ID]")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events.")
@click.option("--since", metavar="DUR", help="Only events from the last DUR.")
@click.option("--undelivered", is_flag=True,
              help="Events a sink refused: waiting for a retry, or parked.")
@JSON_OPTION
@command
def events_list(sandbox_id: str | None, follow: bool, since: str | None, undelivered: bool,
                as_json: bool) -> None:
    """Events, oldest first (of one sandbox with ID)."""
    if undelivered:
        _show_undelivered(as_json)
        return

    from sandboxer.core.rules.durations import parse_duration

    since_delta = parse_duration(since, "--since") if since else None
    with client() as sbx:
        sid = sbx.get(sandbox_id).id if sandbox_id else None
        views = [e.to_dict() for e in sbx.events(sid, since=since_delta)]
        if as_json and not follow:
            emit_json(views)
            return
        last = views[-1]["id"] if views else 0
        for view in views:
            click.echo(json.dumps(view) if as_json else _event_line(view))
        if follow:  # JSON Lines when following with --json
            for event in sbx.follow_events(sid, after=last):
                view = event.to_dict()
                click.echo(json.dumps(view) if as_json else _event_line(view))


def _show_undelivered(as_json: bool) -> None:
    with client() as sbx:
        rows = sbx.undelivered()
    if as_json:
        emit_json(rows)
    elif rows:
        click.echo(table([(r["sink"], r["event_id"], "parked" if r["parked"] else "retrying",
                           r["attempts"], r["last_error"]) for r in rows],
                         ["SINK", "EVENT", "STATE", "ATTEMPTS", "LAST ERROR"]))
    else:
        click.echo("every event was delivered", err=True)


@events_group.command("deliver")
@JSON_OPTION
@command
def events_deliver(as_json: bool) -> None:
    """Deliver pending events to the sinks now (the JSON Lines file, the webhook)."""
    with client() as sbx:
        reports = sbx.deliver_events()
    if as_json:
        emit_json(reports)
    else:
        for r in reports:
            state = "busy (another deliverer)" if r["busy"] else (r["error"] or "up to date")
            click.echo(f"{r['sink']}: {r['delivered']} delivered, {r['parked']} parked; {state}")
    failing = [r for r in reports if r["error"]]
    if failing:
        click.echo(f"sbx events deliver: {failing[0]['sink']}: {failing[0]['error']}", err=True)
        sys.exit(ExitCode.FAILED)


@events_group.command("redeliver")
@click.argument("event_ids", nargs=-1, type=int, metavar="[EVENT...]")
@JSON_OPTION
@command
def events_redeliver(event_ids: tuple[int, ...], as_json: bool) -> None:
    """Send parked events again (all of them, or the ones named)."""
    with client() as sbx:
        outcome = sbx.redeliver(list(event_ids) or None)
    if as_json:
        emit_json(outcome)
    else:
        for o in outcome:
            click.echo(f"{o['sink']} event {o['event_id']}: "
                       + ("delivered" if o["delivered"] else f"refused again: {o['error']}"))
    if any(not o["delivered"] for o in outcome):
        sys.exit(ExitCode.FAILED)


@events_group.command("verify")
@JSON_OPTION
@command
def events_verify(as_json: bool) -> None:
    """Check the hash chain; name the first broken link (exit 1)."""
    with client() as sbx:
        report = sbx.verify_events()
    if as_json:
        emit_json(report)
    elif report["intact"]:
        click.echo(f"{report['checked']} events, chain intact")
    else:
        click.echo(f"sbx: event chain broken at event {report['broken_at']}: "
                   f"{report['problem']} ({report['checked']} events before it verified)",
                   err=True)
    if not report["intact"]:
        sys.exit(ExitCode.FAILED)
