"""One sandbox's life: `sbx create`, `ls`, `show`, `exec` (with `--detach`, a background
process: processes.py has the rest), `logs`, `destroy`, `extend`, `touch`, `pause`, `resume`."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import click

from sandboxer.core.rules.errors import BadInput, ExitCode
from sandboxer_tui.cli.clients import client
from sandboxer_tui.cli.output import (
    JSON_OPTION,
    command,
    emit_json,
    human_age,
    human_left,
    now_iso,
    progress,
    table,
)
from sandboxer_tui.formatting import printable


@click.command("create")
@click.option("--profile", "profile_name", metavar="NAME", help="A profile on the search path.")
@click.option("--profile-file", type=click.Path(dir_okay=False), metavar="FILE",
              help="A profile file (its `extends:` resolves along the search path).")
@click.option("--ttl", metavar="DUR", help="Time to live, e.g. 30m (default from the profile).")
@click.option("--name", metavar="NAME", help="A name you can use instead of the id.")
@click.option("--label", "labels", multiple=True, metavar="K=V", help="A label (repeatable).")
@click.option("--owner", metavar="WHO", help="Who it is for (default: you, user@host).")
@click.option("--task", metavar="WHAT", help="What it is for.")
@click.option("--volume", "volumes", multiple=True, metavar="NAME:PATH[:ro]",
              help="Mount a volume (sbx volume create) at PATH, read-only with :ro "
                   "(repeatable).")
@JSON_OPTION
@command
def create_command(profile_name, profile_file, ttl, name, labels, owner, task, volumes,
                   as_json) -> None:
    """Create a sandbox from a profile (`default` unless told)."""
    from sandboxer import load_profile
    from sandboxer.core.rules.durations import parse_duration
    from sandboxer.core.rules.labels import parse_labels

    if profile_name and profile_file:
        raise BadInput("give --profile or --profile-file, not both")
    ttl_delta = parse_duration(ttl, "--ttl") if ttl is not None else None
    parsed_labels = parse_labels(labels)
    # a named profile goes by its name: the library (or the service) loads it where it
    # creates, once; a file is loaded here, where it is
    profile = load_profile(profile_file) if profile_file else (profile_name or "default")
    with client() as sbx:
        progress(f"creating a sandbox from profile {profile}..." if isinstance(profile, str)
                 else f"creating a sandbox from profile {profile.name} on {profile.backend}...")
        view = sbx.create(profile, ttl=ttl_delta, name=name, labels=parsed_labels,
                          owner=owner, task=task,
                          volumes=[_volume_mount(v) for v in volumes]).to_dict()
    if as_json:
        emit_json(view)
    else:
        click.echo(view["id"])


def _volume_mount(text: str) -> dict[str, Any]:
    """`--volume NAME:PATH[:ro]` as a mount (docs/volumes.md)."""
    name, _, rest = text.partition(":")
    path, read_only = (rest[:-3], True) if rest.endswith(":ro") else (rest, False)
    if not name or not path:
        raise BadInput(f"--volume {text!r}: give NAME:PATH or NAME:PATH:ro")
    return {"name": name, "path": path, "read_only": read_only}


def _ls_rows(views: list[Mapping[str, Any]], now: str) -> list[list[Any]]:
    return [[v["id"], v["name"], v["profile"], v["backend"], v["state"], v["owner"], v["host"],
             human_age(v["created_at"], now), human_left(v["ttl_left_s"])] for v in views]


@click.command("ls")
@click.option("--all", "include_all", is_flag=True, help="Include destroyed sandboxes.")
@click.option("--state", metavar="S", help="Only sandboxes in this state.")
@click.option("--backend", metavar="B", help="Only sandboxes on this backend.")
@click.option("--label", "labels", multiple=True, metavar="K=V", help="Only with this label.")
@JSON_OPTION
@command
def ls_command(include_all=False, state=None, backend=None, labels=(), as_json=False) -> None:
    """The inventory: sandboxes that are not destroyed (all with --all)."""
    from sandboxer.core.rules.labels import parse_labels

    wanted = parse_labels(labels)
    now = now_iso()
    filters = dict(include_destroyed=include_all, state=state, backend=backend, labels=wanted)
    with client() as sbx:
        if as_json:  # the library's document as it is: no record made per sandbox
            click.echo(sbx.list_json(**filters))
            return
        views = [box.to_dict() for box in sbx.list(**filters)]
    if views:
        click.echo(table(_ls_rows(views, now),
                         ["ID", "NAME", "PROFILE", "BACKEND", "STATE", "OWNER", "HOST", "AGE", "TTL"]))
    else:
        click.echo("no sandboxes" + ("" if include_all else " (sbx ls --all shows destroyed ones)"),
                   err=True)


@click.command("show")
@click.argument("sandbox_id", metavar="ID")
@JSON_OPTION
@command
def show_command(sandbox_id: str, as_json: bool) -> None:
    """One sandbox: state, deadlines, labels, the resolved profile."""
    with client() as sbx:
        box = sbx.get(sandbox_id)
        resolved = box.profile_resolved()
        view = {**box.to_dict(), "profile_resolved": resolved}
    if as_json:
        emit_json(view)
        return
    for key in ("id", "name", "state", "profile", "backend", "backend_ref", "isolation", "owner",
                "task",
                "install", "created_at", "started_at", "deadline", "hard_deadline",
                "last_activity_at", "idle_deadline", "ended_at", "error"):
        if view.get(key) is not None:
            click.echo(f"{key:<17} {printable(view[key])}")
    click.echo(f"{'ttl_left':<17} {human_left(view['ttl_left_s'])}")
    labels = ", ".join(f"{k}={v}" for k, v in view["labels"].items()) or "-"
    click.echo(f"{'labels':<17} {printable(labels)}")


# -- exec / logs / destroy ------------------------------------------------------------------


@click.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("sandbox_id", metavar="ID")
@click.option("--timeout", metavar="DUR", help="Kill the command after this long (exit 124).")
@click.option("-e", "--env", "env", multiple=True, metavar="K=V",
              help="Set an environment variable (repeatable); events record the name only.")
@click.option("-w", "--workdir", metavar="DIR", help="Run in this folder of the sandbox.")
@click.option("-u", "--user", metavar="USER", help="Run as this user.")
@click.option("-i", "--interactive", is_flag=True, help="Send stdin to the command.")
@click.option("--detach", "-d", is_flag=True,
              help="Start it in the background and print its process id (sbx ps, attach, "
                   "kill).")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD [ARG...]")
@command
def exec_command(sandbox_id: str, timeout: str | None, env: tuple[str, ...],
                 workdir: str | None, user: str | None, interactive: bool, detach: bool,
                 argv: tuple[str, ...]) -> None:
    """Run a command in a sandbox; the exit status is the command's own."""
    from sandboxer import OutputChunk
    from sandboxer.core.rules.durations import parse_duration

    limit = parse_duration(timeout, "--timeout") if timeout else None
    variables = _env(env)
    if detach and (interactive or limit):
        raise BadInput("--detach starts the command in the background: it takes no -i or "
                       "--timeout (sbx kill ends it)")
    if not interactive and not detach:
        _hint_unread_stdin()
    options: dict[str, Any] = {"env": variables, "cwd": workdir, "user": user}
    with client() as sbx:
        box = sbx.get(sandbox_id)
        if detach:
            proc = box.processes.start(list(argv), stdin=False, **options)
            click.echo(proc.pid)
            return
        outputs = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}
        code = ExitCode.FAILED  # no exit status came: the command's stream broke off
        stdin = sys.stdin.buffer if interactive else None
        for item in box.exec_stream(list(argv), timeout=limit, stdin=stdin, **options):
            if isinstance(item, OutputChunk):  # as it comes, as `docker exec` prints it
                outputs[item.stream].write(item.data)
                outputs[item.stream].flush()
            else:
                code = item.exit_code
    sys.exit(code)


def _env(pairs: tuple[str, ...]) -> dict[str, str] | None:
    """-e K=V pairs; a bare K takes this shell's value of K (as docker exec -e does)."""
    import os

    env: dict[str, str] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not name or not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise BadInput(f"bad -e {pair.split('=')[0][:40]!r}: K=V with K a variable name "
                           "(letters, digits, _)")
        if not eq:
            if name not in os.environ:
                raise BadInput(f"bad -e {name}: not set here; give -e {name}=VALUE")
            value = os.environ[name]
        env[name] = value
    return env or None


def _hint_unread_stdin() -> None:
    """Input piped to `sbx exec` without -i is not sent: say so on stderr, once, rather
    than drop it silently (a terminal or an empty stdin gets no hint)."""
    import os
    import select
    import stat

    try:
        fd = sys.stdin.fileno()
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode):
            waiting = os.fstat(fd).st_size > os.lseek(fd, 0, os.SEEK_CUR)
        elif stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            waiting = bool(select.select([fd], [], [], 0)[0]) and bool(os.read(fd, 1))
        else:
            waiting = False
    except (OSError, ValueError, AttributeError):
        return
    if waiting:
        click.echo("sbx: stdin is not sent to the command without -i (sbx exec -i ID -- CMD)",
                   err=True)


@click.command("logs")
@click.argument("sandbox_id", metavar="ID")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new output.")
@click.option("--tail", type=click.IntRange(min=0), metavar="N", help="Only the last N lines.")
@command
def logs_command(sandbox_id: str, follow: bool, tail: int | None) -> None:
    """The sandbox's output (its main process)."""
    with client() as sbx:
        for chunk in sbx.get(sandbox_id).logs(follow=follow, tail=tail):
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()


@click.command("destroy")
@click.argument("sandbox_ids", nargs=-1, required=True, metavar="ID...")
@click.option("--yes", "-y", is_flag=True, help="Do not ask (asked only on a terminal).")
@JSON_OPTION
@command
def destroy_command(sandbox_ids: tuple[str, ...], yes: bool, as_json: bool) -> None:
    """Destroy sandboxes. Already destroyed counts as done."""
    with client() as sbx:
        refs = list(sandbox_ids)
        if not yes and sys.stdin.isatty() and not as_json:
            boxes = [sbx.get(ref) for ref in refs]  # all known before any is touched
            names = ", ".join(b.id + (f" ({b.name})" if b.name else "") for b in boxes)
            click.confirm(f"destroy {names}?", abort=True, err=True)
            refs = [b.id for b in boxes]
        result = sbx.destroy(*refs)  # resolves every ref before it touches any
    if as_json:
        emit_json(result)
    else:
        for sid in result["destroyed"]:
            click.echo(f"destroyed {sid}")
        for sid in result["already_destroyed"]:
            click.echo(f"{sid} was already destroyed")
        for failure in result["failed"]:
            click.echo(f"sbx: {failure['id']}: {failure['error']}", err=True)
    if result["failed"]:
        sys.exit(result["failed"][0]["code"])


# -- deadlines ------------------------------------------------------------------------------


@click.command("extend")
@click.argument("sandbox_id", metavar="ID")
@click.argument("duration", metavar="DUR")
@JSON_OPTION
@command
def extend_command(sandbox_id: str, duration: str, as_json: bool) -> None:
    """Add DUR to the deadline, capped at the hard deadline (never shortens)."""
    from sandboxer.core.rules.durations import parse_duration

    by = parse_duration(duration, "duration")
    with client() as sbx:
        box = sbx.get(sandbox_id)
        capped = box.extend(by)
        view = {**box.to_dict(), "capped": capped}
    if as_json:
        emit_json(view)
        return
    click.echo(f"{view['id']} deadline {view['deadline']} ({human_left(view['ttl_left_s'])} left)")
    if view["capped"]:
        click.echo(f"sbx: capped at the hard deadline {view['hard_deadline']}", err=True)


@click.command("touch")
@click.argument("sandbox_id", metavar="ID")
@command
def touch_command(sandbox_id: str) -> None:
    """Record activity now (resets the idle clock)."""
    with client() as sbx:
        box = sbx.get(sandbox_id)
        box.touch()
        view = box.to_dict()
    click.echo(f"{view['id']} active at {view['last_activity_at']}")


# -- pause, resume, checkpoints -------------------------------------------------------------


@click.command("pause")
@click.argument("sandbox_id", metavar="ID")
@JSON_OPTION
@command
def pause_command(sandbox_id: str, as_json: bool) -> None:
    """Freeze a sandbox (no CPU while paused); its deadline still holds."""
    _change_state(sandbox_id, "pause", as_json, "paused")


@click.command("resume")
@click.argument("sandbox_id", metavar="ID")
@JSON_OPTION
@command
def resume_command(sandbox_id: str, as_json: bool) -> None:
    """Unfreeze a paused sandbox."""
    _change_state(sandbox_id, "resume", as_json, "resumed")


def _change_state(sandbox_id: str, verb: str, as_json: bool, done: str) -> None:
    with client() as sbx:
        box = sbx.get(sandbox_id)
        getattr(box, verb)()
        view = box.to_dict()
    if as_json:
        emit_json(view)
    else:
        click.echo(f"{done} {view['id']}")
