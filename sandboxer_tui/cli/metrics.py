"""`sbx metrics`: CPU, memory, pids and network, live, stored, or of every running sandbox."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import click

from sandboxer.core.rules.errors import BadInput
from sandboxer_tui.cli.clients import async_client, client
from sandboxer_tui.cli.output import JSON_OPTION, command, emit_json


def _metric_line(view: Mapping[str, Any]) -> str:
    from sandboxer_tui.formatting import megabytes as mb

    cpu = "-" if view["cpu_pct"] is None else f"{view['cpu_pct']:.1f}%"
    net = ("-" if view["net_rx_bytes"] is None
           else f"rx {view['net_rx_bytes']}B tx {view['net_tx_bytes']}B")
    return (f"{view['time']}  cpu {cpu}  mem {mb(view['memory_bytes'])} / "
            f"{mb(view['memory_limit'])}  pids {view['pids'] if view['pids'] is not None else '-'}"
            f"  net {net}")


@click.command("metrics")
@click.argument("sandbox_id", metavar="ID", required=False)
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing samples (one a second); with --all, storing them, until "
                   "Ctrl-C or SIGTERM.")
@click.option("--history", is_flag=True, help="The stored samples instead of a live one.")
@click.option("--all", "all_running", is_flag=True,
              help="Every running sandbox: one reading each, then exit (--follow: keep on).")
@click.option("--format", "output_format", type=click.Choice(["prometheus"]),
              help="With --all: one reading of every running sandbox in the Prometheus text "
                   "format (node-exporter's textfile collector), then exit.")
@JSON_OPTION
@command
def metrics_command(sandbox_id: str | None, follow: bool, history: bool, all_running: bool,
                    as_json: bool, output_format: str | None = None) -> None:
    """CPU, memory, pids and network of a sandbox, live from its backend."""
    if output_format == "prometheus":
        if not all_running or sandbox_id or follow or history or as_json:
            raise BadInput("--format prometheus goes with --all alone: sbx metrics --all "
                           "--format prometheus")
        from sandboxer.metrics import prometheus_text

        with client() as sbx:
            click.echo(prometheus_text(sbx.current_metrics()), nl=False)
        return
    if all_running:
        if sandbox_id or history:
            raise BadInput("--all reads every running sandbox: give no ID or --history")
        if follow:
            _follow_all(as_json)
        else:
            _read_all(as_json)
        return
    if not sandbox_id:
        raise BadInput("give a sandbox ID, or --all")
    if history:
        with client() as sbx:
            rows = [m.to_dict() for m in sbx.get(sandbox_id).metric_history()]
        if as_json:
            emit_json(rows)
        for row in rows if not as_json else []:
            click.echo(_metric_line(row))
        if not rows and not as_json:
            click.echo("no sample yet", err=True)
        return
    seen = 0
    with client() as sbx:
        box = sbx.get(sandbox_id)
        if box.isolation == "gvisor" and not as_json:
            from sandboxer.core.rules.views import GVISOR_METRICS_NOTE

            click.echo(GVISOR_METRICS_NOTE, err=True)
        samples = box.follow_metrics() if follow else [box.metrics()]
        for sample in samples:
            if sample is None:
                continue
            seen += 1
            view = sample.to_dict()
            if as_json and not follow:
                emit_json(view)
            else:
                click.echo(json.dumps(view) if as_json else _metric_line(view))
    if seen == 0:
        if as_json and not follow:  # --follow --json stays JSON Lines of samples only
            emit_json({"sandbox_id": sandbox_id, "sample": None, "message": "no sample yet"})
        else:
            click.echo("no sample yet", err=True)


def _read_all(as_json: bool) -> None:
    """One reading of every running sandbox (a sandbox with none within 10 s is left out)."""
    from sandboxer import MetricSample

    with client() as sbx:
        views = [MetricSample.from_dict(doc).to_dict() for doc in sbx.current_metrics()]
    if as_json:
        emit_json(views)
        return
    for view in views:
        click.echo(f"{view['sandbox_id']}  {_metric_line(view)}")
    if not views:
        click.echo("no running sandbox gave a reading", err=True)


def _follow_all(as_json: bool) -> None:
    import asyncio
    import contextlib
    import signal

    def show(view: Mapping[str, Any]) -> None:
        click.echo(json.dumps(view) if as_json else f"{view['sandbox_id']}  {_metric_line(view)}")

    async def follow(sbx) -> None:
        async for sample in sbx.follow_all_metrics():
            show(sample.to_dict())

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with async_client() as sbx:
            task = asyncio.create_task(follow(sbx))
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
            for pending in (task, stopped):
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending
            if task.done() and not task.cancelled() and task.exception():
                raise task.exception()

    asyncio.run(main())
