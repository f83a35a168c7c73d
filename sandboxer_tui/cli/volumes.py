"""Volumes (docs/volumes.md): `sbx volume create|ls|show|rm`, and files into and out of a
volume without a sandbox, `sbx volume put|get` (as `sbx cp`: a file or a tree, `-` for a tar
stream on stdin or stdout)."""

from __future__ import annotations

import sys
from typing import Any

import click

from sandboxer_tui.cli.clients import client
from sandboxer_tui.cli.groups import DefaultGroup
from sandboxer_tui.cli.output import JSON_OPTION, command, emit_json, table


@click.group("volume", cls=DefaultGroup, default_command="ls")
def volume_group() -> None:
    """Volumes that outlive a sandbox: create, ls, show, rm, put, get."""


def _rows(views: list[dict[str, Any]]) -> str:
    return table([(v["id"], v["name"], v["owner"], v["backend"],
                   "shared" if v["shared"] else "-", v["size_bytes"],
                   len(v["mounted_by"]), v["created_at"], v["expires_at"]) for v in views],
                 ["ID", "NAME", "OWNER", "BACKEND", "SHARING", "BYTES", "MOUNTS", "CREATED",
                  "EXPIRES"])


@volume_group.command("create")
@click.argument("name", metavar="NAME")
@click.option("--backend", metavar="NAME", help="The backend that keeps it (default docker).")
@click.option("--label", "labels", multiple=True, metavar="K=V", help="A label (repeatable).")
@click.option("--ttl", metavar="DUR", help="Removed once this has passed (never while a live "
                                           "sandbox mounts it); default: kept until rm.")
@click.option("--shared", is_flag=True, help="More than one sandbox may mount it read-write.")
@click.option("--owner", metavar="WHO")
@JSON_OPTION
@command
def volume_create(name, backend, labels, ttl, shared, owner, as_json) -> None:
    """Make an empty volume; a profile's `volumes:` (or `sbx create --volume`) mounts it."""
    from sandboxer.core.rules.durations import parse_duration
    from sandboxer.core.rules.labels import parse_labels

    ttl_delta = parse_duration(ttl, "--ttl") if ttl else None
    with client() as sbx:
        view = sbx.create_volume(name, backend=backend, labels=parse_labels(labels),
                                 ttl=ttl_delta, shared=shared, owner=owner).to_dict()
    if as_json:
        emit_json(view)
    else:
        click.echo(view["id"])


@volume_group.command("ls")
@JSON_OPTION
@command
def volume_ls(as_json: bool) -> None:
    """Volumes, oldest first."""
    with client() as sbx:
        views = [v.to_dict() for v in sbx.volumes()]
    if as_json:
        emit_json(views)
    elif views:
        click.echo(_rows(views))
    else:
        click.echo("no volumes", err=True)


@volume_group.command("show")
@click.argument("ref", metavar="VOLUME")
@JSON_OPTION
@command
def volume_show(ref: str, as_json: bool) -> None:
    """One volume (its size asked of the backend now) and the live sandboxes mounting it."""
    with client() as sbx:
        view = sbx.volume(ref).to_dict()
    if as_json:
        emit_json(view)
        return
    click.echo(_rows([view]))
    for m in view["mounted_by"]:
        click.echo(f"mounted by {m['sandbox']} at {m['path']}"
                   f"{' (read-only)' if m['read_only'] else ''}")


@volume_group.command("rm")
@click.argument("refs", nargs=-1, required=True, metavar="VOLUME...")
@command
def volume_rm(refs: tuple[str, ...]) -> None:
    """Remove volumes and what they hold (refused while a live sandbox mounts one)."""
    with client() as sbx:
        found = [sbx.volume(ref) for ref in refs]  # all known before any goes
        for vol in found:
            sbx.remove_volume(vol.id)
            click.echo(f"removed {vol.id}")


@volume_group.command("put")
@click.argument("ref", metavar="VOLUME")
@click.argument("src", metavar="SRC")
@click.argument("path", metavar="PATH", default="/")
@JSON_OPTION
@command
def volume_put(ref: str, src: str, path: str, as_json: bool) -> None:
    """Copy a local file or folder (or a tar stream on stdin, `-`) into the folder PATH of
    a volume (/ is its root), without a sandbox."""
    with client() as sbx:
        if src == "-":
            done = sbx.put_volume_tree(ref, path, sys.stdin.buffer)
        else:
            done = sbx.upload_to_volume(ref, src, path)
    if as_json:
        emit_json(done.to_dict())
    else:
        click.echo(f"{done.bytes} bytes into {ref}:{path}")


@volume_group.command("get")
@click.argument("ref", metavar="VOLUME")
@click.argument("path", metavar="PATH")
@click.argument("dest", metavar="DEST", default=".")
@command
def volume_get(ref: str, path: str, dest: str) -> None:
    """Copy the file or folder PATH of a volume into the local folder DEST (or, with `-`,
    as a tar stream on stdout), without a sandbox."""
    with client() as sbx:
        if dest == "-":
            out = sys.stdout.buffer
            for chunk in sbx.get_volume_tree(ref, path):
                out.write(chunk)
            out.flush()
            return
        made = sbx.download_from_volume(ref, path, dest)
    click.echo(str(made))
