"""A sandbox's files from the command line: `sbx cp` (as `docker cp`: a file or a whole tree
either way, `-` for a tar stream on stdin or stdout) and `sbx files ls|cat|stat|rm|mkdir|mv`.
Transfers stream: nothing is held whole here."""

from __future__ import annotations

import re
import sys
from typing import Any

import click

from sandboxer.core.rules.errors import BadInput
from sandboxer_tui.cli.clients import client
from sandboxer_tui.cli.output import JSON_OPTION, command, emit_json, table

# ID:PATH: a sandbox reference (an id, a prefix or a name: no `/`) before the first colon
REMOTE = re.compile(r"^(?P<ref>[^/:]+):(?P<path>.*)$")
TYPES = {"file": "-", "dir": "d", "symlink": "l", "other": "?"}


def _remote(text: str) -> tuple[str, str] | None:
    """(ref, path) of `ID:PATH`; None for a local path (write `./a:b` for a local `a:b`)."""
    found = REMOTE.match(text)
    if found is None or text == "-":
        return None
    if not found["path"]:
        raise BadInput(f"{text!r}: give the path in the sandbox after the colon (ID:/PATH)")
    return found["ref"], found["path"]


@click.command("cp")
@click.argument("src", metavar="SRC")
@click.argument("dst", metavar="DST")
@JSON_OPTION
@command
def cp_command(src: str, dst: str, as_json: bool) -> None:
    """Copy a file or a tree into or out of a sandbox (one side is ID:PATH).

    \b
    sbx cp ./src ID:/work          ./src (a file or a folder) into the sandbox as /work
    sbx cp ID:/work/out.txt .      a file (or a folder) out of it, into .
    tar -c dir | sbx cp - ID:/work a tar stream on stdin, unpacked into /work
    sbx cp ID:/work - | tar -t     /work as a tar stream on stdout
    """
    into, out_of = _remote(dst), _remote(src)
    if (into is None) == (out_of is None):
        raise BadInput("give one side as ID:PATH (the sandbox's) and the other as a local "
                       "path or -")
    with client() as sbx:
        if into is not None:
            box = sbx.get(into[0])
            if src == "-":
                done = box.files.put_tree(into[1], sys.stdin.buffer)  # read a piece at a time
            else:
                done = box.files.upload(src, into[1])
        else:
            box = sbx.get(out_of[0])
            if dst == "-":
                out = sys.stdout.buffer
                for chunk in box.files.get_tree(out_of[1]):
                    out.write(chunk)
                out.flush()
                return
            done = box.files.download(out_of[1], dst)
    doc = done.to_dict()
    if as_json:
        emit_json(doc)
    elif sys.stderr.isatty():
        click.echo(f"copied {doc['bytes']} bytes ({doc['path']})", err=True)


@click.group("files")
def files_group() -> None:
    """A sandbox's files: ls, cat, stat, rm, mkdir, mv (sbx cp copies in and out)."""


def _info_row(info: dict[str, Any]) -> list[Any]:
    name = info["path"] + (f" -> {info['target']}" if info.get("target") else "")
    return [TYPES.get(info["type"], "?") + format(info["mode"] & 0o7777, "04o"),
            info["size"], info["mtime"], name]


@files_group.command("ls")
@click.argument("sandbox_id", metavar="ID")
@click.argument("path", metavar="PATH")
@click.option("--depth", type=click.IntRange(1, 64), default=1, show_default=True,
              help="How many levels down.")
@JSON_OPTION
@command
def ls_files(sandbox_id: str, path: str, depth: int, as_json: bool) -> None:
    """What is in a folder of a sandbox."""
    with client() as sbx:
        infos = [f.to_dict() for f in sbx.get(sandbox_id).files.list(path, depth=depth)]
    if as_json:
        emit_json(infos)
    elif infos:
        click.echo(table([_info_row(i) for i in infos], ["MODE", "SIZE", "MTIME", "PATH"]))


@files_group.command("cat")
@click.argument("sandbox_id", metavar="ID")
@click.argument("path", metavar="PATH")
@command
def cat_file(sandbox_id: str, path: str) -> None:
    """A file's bytes on stdout, as they come."""
    out = sys.stdout.buffer
    with client() as sbx:
        for chunk in sbx.get(sandbox_id).files.stream(path):
            out.write(chunk)
    out.flush()


@files_group.command("stat")
@click.argument("sandbox_id", metavar="ID")
@click.argument("path", metavar="PATH")
@JSON_OPTION
@command
def stat_file(sandbox_id: str, path: str, as_json: bool) -> None:
    """One path's type, size, mode and time (exit 3 when it does not exist)."""
    with client() as sbx:
        info = sbx.get(sandbox_id).files.stat(path).to_dict()
    if as_json:
        emit_json(info)
    else:
        click.echo(table([_info_row(info)], ["MODE", "SIZE", "MTIME", "PATH"]))


@files_group.command("rm")
@click.argument("sandbox_id", metavar="ID")
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@click.option("-r", "--recursive", is_flag=True, help="Folders and all they hold.")
@command
def rm_files(sandbox_id: str, paths: tuple[str, ...], recursive: bool) -> None:
    """Remove files (folders with -r)."""
    with client() as sbx:
        box = sbx.get(sandbox_id)
        for path in paths:
            box.files.remove(path, recursive=recursive)


@files_group.command("mkdir")
@click.argument("sandbox_id", metavar="ID")
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@command
def mkdir_files(sandbox_id: str, paths: tuple[str, ...]) -> None:
    """Make folders, with their parents (one that exists is fine)."""
    with client() as sbx:
        box = sbx.get(sandbox_id)
        for path in paths:
            box.files.mkdir(path, parents=True)


@files_group.command("mv")
@click.argument("sandbox_id", metavar="ID")
@click.argument("src", metavar="SRC")
@click.argument("dst", metavar="DST")
@command
def mv_file(sandbox_id: str, src: str, dst: str) -> None:
    """Rename or move a path in a sandbox."""
    with client() as sbx:
        sbx.get(sandbox_id).files.rename(src, dst)
