"""`sbx profiles`: list, show, validate, trust."""

from __future__ import annotations

import json
import sys

import click

from sandboxer.core.rules.errors import BadInput, ExitCode
from sandboxer_tui.cli.clients import client
from sandboxer_tui.cli.output import JSON_OPTION, command, emit_json, table


@click.group("profiles")
def profiles_group() -> None:
    """List, show, validate profiles; trust a working folder's."""


@profiles_group.command("list")
@JSON_OPTION
@command
def profiles_list(as_json: bool) -> None:
    """Every profile on the search path."""
    with client() as sbx:
        rows = [info.to_dict() for info in sbx.profiles()]
    if as_json:
        emit_json(rows)
    else:
        click.echo(table(
            [(r["name"], r["backend"] or "INVALID", r.get("error") or r["description"],
              r["source"]) for r in rows], ["NAME", "BACKEND", "DESCRIPTION", "SOURCE"]))


@profiles_group.command("show")
@click.argument("name")
@JSON_OPTION
@command
def profiles_show(name: str, as_json: bool) -> None:
    """The resolved profile (after `extends`); secrets shown as references."""
    import yaml

    from sandboxer.core.rules.profiles import dump

    with client() as sbx:
        data = dump(sbx.profile(name))
        source = next(i.source for i in sbx.profiles() if i.name == name)
    if as_json:
        emit_json({**data, "source": source})
    else:
        click.echo(f"# source: {source}")
        click.echo(yaml.safe_dump(data, sort_keys=False).rstrip())


@profiles_group.command("schema")
@command
def profiles_schema() -> None:
    """The JSON Schema a profile file follows (for editors and CI checks)."""
    from sandboxer import profile_schema

    click.echo(json.dumps(profile_schema(), indent=2))


@profiles_group.command("trust")
@click.argument("folder", required=False, type=click.Path(file_okay=False))
@command
def profiles_trust(folder: str | None) -> None:
    """Use the profiles in FOLDER (default ./.sbx/profiles) as they are now; a change to
    them leaves them out again until trusted anew."""
    from sandboxer import trust_profiles

    where, names, digest = trust_profiles(folder)
    click.echo(f"trusted {where}: {', '.join(names)} ({digest[:19]}...); "
               "used until a file there changes")


@profiles_group.command("untrust")
@click.argument("folder", required=False, type=click.Path(file_okay=False))
@command
def profiles_untrust(folder: str | None) -> None:
    """Stop using the profiles in FOLDER (default ./.sbx/profiles)."""
    from sandboxer import untrust_profiles

    where, was = untrust_profiles(folder)
    click.echo(f"untrusted {where}" if was else f"{where} was not trusted")


@profiles_group.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@command
def profiles_validate(files: tuple[str, ...]) -> None:
    """Exit 0 when every file is valid; 2 with one line per problem otherwise."""
    from sandboxer import load_profile

    problems: list[str] = []
    with client() as sbx:  # the rules create applies, the backend's included
        for file in files:
            try:
                profile = load_profile(file)
            except BadInput as exc:
                problems += getattr(exc, "problems", [str(exc)])
                continue
            try:
                sbx.check_profile(profile)
                click.echo(f"{file}: ok ({profile.name}, backend {profile.backend})")
            except BadInput as exc:
                problems.append(f"{file}: {exc}")
    for line in problems:
        click.echo(line, err=True)
    if problems:
        sys.exit(ExitCode.BAD_INPUT)
