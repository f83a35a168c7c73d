"""Checkpoints: `sbx snapshot`, `restore`, `checkpoints` (list, prune) and `checkpoint`
(rm, export, import)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from sandboxer_tui.cli.clients import client
from sandboxer_tui.cli.groups import DefaultGroup
from sandboxer_tui.cli.output import JSON_OPTION, command, emit_json, progress, table


@click.command("snapshot")
@click.argument("sandbox_id", metavar="ID")
@click.option("--name", metavar="NAME", help="A name for the checkpoint.")
@JSON_OPTION
@command
def snapshot_command(sandbox_id: str, name: str | None, as_json: bool) -> None:
    """Save a sandbox's filesystem as a checkpoint."""
    progress(f"snapshotting {sandbox_id}...")
    with client() as sbx:
        box = sbx.get(sandbox_id)
        view = box.snapshot(name).to_dict()
    if box.isolation == "gvisor":  # docs/security.md, "Isolation levels"
        from sandboxer.core.rules.views import GVISOR_SNAPSHOT_NOTE

        click.echo(GVISOR_SNAPSHOT_NOTE, err=True)
    if as_json:
        emit_json(view)
    else:
        click.echo(view["id"])


@click.command("restore")
@click.argument("checkpoint_id", metavar="CHECKPOINT")
@click.option("--ttl", metavar="DUR", help="Time to live (default from the profile).")
@click.option("--name", metavar="NAME", help="A name for the new sandbox.")
@click.option("--label", "labels", multiple=True, metavar="K=V", help="A label (repeatable).")
@click.option("--owner", metavar="WHO")
@click.option("--task", metavar="WHAT")
@click.option("--profile", "profile_name", metavar="NAME",
              help="A profile of this host to run under (an import's default: the local "
                   "profile of the name it records).")
@JSON_OPTION
@command
def restore_command(checkpoint_id, ttl, name, labels, owner, task, profile_name,
                    as_json) -> None:
    """A new sandbox from a checkpoint (many may come from one: a fork)."""
    from sandboxer.core.rules.durations import parse_duration
    from sandboxer.core.rules.labels import parse_labels

    ttl_delta = parse_duration(ttl, "--ttl") if ttl else None
    parsed = parse_labels(labels)
    with client() as sbx:
        view = sbx.checkpoint(checkpoint_id).restore(ttl=ttl_delta, name=name, labels=parsed,
                                                     owner=owner, task=task,
                                                     profile=profile_name).to_dict()
    if as_json:
        emit_json(view)
    else:
        click.echo(view["id"])


@click.group("checkpoints", cls=DefaultGroup, default_command="list")
def checkpoints_group() -> None:
    """Checkpoints: `sbx checkpoints [ID] [--tree]`, `prune`."""


def _tree_lines(nodes: list[Mapping[str, Any]], depth: int = 0) -> list[str]:
    lines = []
    for node in nodes:
        label = f" {node['name']}" if node["name"] else ""
        lines.append(f"{'   ' * depth}{'└─ ' if depth else ''}{node['id']}{label}  "
                     f"from {node['sandbox_id'] or 'an import'}  {node['created_at']}  "
                     f"{node['state']}")
        lines += _tree_lines(node["children"], depth + 1)
    return lines


@checkpoints_group.command("list")
@click.argument("sandbox_id", required=False, metavar="[ID]")
@click.option("--tree", is_flag=True, help="Show lineage (restored-from) as a tree.")
@JSON_OPTION
@command
def checkpoints_list(sandbox_id: str | None, tree: bool, as_json: bool) -> None:
    """Checkpoints, oldest first (of one sandbox with ID)."""
    from sandboxer import lineage

    with client() as sbx:
        checkpoints = sbx.checkpoints(sbx.get(sandbox_id).id if sandbox_id else None)
    rows = [c.to_dict() for c in checkpoints]
    if tree:
        nodes = lineage(checkpoints)
        if as_json:
            emit_json(nodes)
        else:
            click.echo("\n".join(_tree_lines(nodes)) or "no checkpoints")
        return
    if as_json:
        emit_json(rows)
    elif rows:
        click.echo(table([(r["id"], r["name"], r["sandbox_id"], r["kind"], r["state"],
                           r["size_bytes"], r["created_at"], r["expires_at"]) for r in rows],
                         ["ID", "NAME", "SANDBOX", "KIND", "STATE", "BYTES", "CREATED",
                          "EXPIRES"]))
    else:
        click.echo("no checkpoints", err=True)


@checkpoints_group.command("prune")
@JSON_OPTION
@command
def checkpoints_prune(as_json: bool) -> None:
    """Remove expired checkpoints and those past each profile's `keep`."""
    with client() as sbx:
        removed = sbx.prune_checkpoints()
    if as_json:
        emit_json({"removed": removed})
    for ckpt in removed if not as_json else []:
        click.echo(f"removed {ckpt}")


@click.group("checkpoint")
def checkpoint_group() -> None:
    """One checkpoint: rm, export, import."""


@checkpoint_group.command("rm")
@click.argument("checkpoint_ids", nargs=-1, required=True, metavar="CHECKPOINT...")
@command
def checkpoint_rm(checkpoint_ids: tuple[str, ...]) -> None:
    """Remove checkpoints and their backend artifacts."""
    with client() as sbx:
        found = [sbx.checkpoint(ref) for ref in checkpoint_ids]  # all known before any goes
        for ckpt in found:
            ckpt.remove()
            click.echo(f"removed {ckpt.id}")


@checkpoint_group.command("export")
@click.argument("checkpoint_id", metavar="CHECKPOINT")
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False), metavar="FILE")
@command
def checkpoint_export(checkpoint_id: str, output: str) -> None:
    """Write a checkpoint to a portable archive (.tar.gz)."""
    with client() as sbx:
        ckpt = sbx.checkpoint(checkpoint_id)
        ckpt.export(output)
    click.echo(f"{output}: {ckpt.id}")
    if ckpt.volumes:  # docs/volumes.md: named in the archive, their data not in it
        click.echo("sbx: warning: the archive holds no volume data; its sandbox mounted "
                   + ", ".join(f"{v['name']} at {v['path']}" for v in ckpt.volumes), err=True)


@checkpoint_group.command("import")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--name", metavar="NAME", help="Its name here (default: the archive's; a name "
                                             "already used here is refused).")
@JSON_OPTION
@command
def checkpoint_import(file: str, name: str | None, as_json: bool) -> None:
    """Bring in a checkpoint archive made by `sbx checkpoint export`."""
    with client() as sbx:
        view = sbx.import_checkpoint(file, name=name).to_dict()
    if as_json:
        emit_json(view)
    else:
        click.echo(view["id"])
