"""The `sbx` command line (docs/cli.md is its contract).

Commands parse, call the library (`sandboxer`), and show. No logic lives here. Heavy modules
load inside the commands that need them, so `sbx ls` and `sbx --help` start fast.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import click

from sandboxer.core.rules.errors import EXIT_BAD_INPUT, BadInput, classify, one_line
from sandboxer_tui.formatting import printable

# -- output ---------------------------------------------------------------------------------


def emit_json(data: Any) -> None:
    """One JSON document. A list puts one record per line: readable, and encoded by the C
    encoder (an indented document takes the pure-Python one, 10x slower over 10,000 rows)."""
    if isinstance(data, list):
        encode = json.JSONEncoder().encode
        click.echo("[\n" + ",\n".join(map(encode, data)) + "\n]" if data else "[]")
    else:
        click.echo(json.dumps(data, indent=2, sort_keys=False))


def progress(message: str) -> None:
    """A line on stderr for slow work, only when a person is watching."""
    if sys.stderr.isatty():
        click.echo(message, err=True)


def table(rows: Iterable[Iterable[Any]], headers: list[str]) -> str:
    body = [[("-" if v is None else printable(v)) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in body]
    return "\n".join(lines)


def error_doc(exc: BaseException) -> dict[str, Any]:
    """The one shape of an error under --json (docs/cli.md), with its one-line message."""
    code, kind = classify(exc)
    return {"error": {"code": code, "kind": kind,
                      "message": one_line(exc)}}


def fail(exc: BaseException, as_json: bool) -> None:
    doc = error_doc(exc)
    if as_json:
        emit_json(doc)
    else:
        click.echo(f"sbx: {doc['error']['message']}", err=True)
    sys.exit(doc["error"]["code"])


def command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn any sbx or backend error into its one-line message and documented exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            sys.exit(130)
        except Exception as exc:
            fail(exc, bool(kwargs.get("as_json")))

    return wrapper


def client():
    """The library client this command uses: the one `sbx server` prepared for this
    process if it fits, else a new one."""
    from sandboxer_tui.server.prepared import take_client

    return take_client()


def now_iso() -> str:
    from sandboxer.core.rules.clock import clock_from_env, to_iso

    return to_iso(clock_from_env().now())


def human_left(seconds: int | None) -> str:
    from sandboxer_tui.formatting import exact_duration

    return exact_duration(seconds)


def human_age(created_iso: str, now: str) -> str:
    from sandboxer.core.rules.clock import from_iso
    from sandboxer_tui.formatting import exact_age

    return exact_age(from_iso(created_iso), from_iso(now))


JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")


# -- the group ------------------------------------------------------------------------------


class DefaultGroup(click.Group):
    """A group that runs `default_command` when the first word is not a subcommand,
    so `sbx events ID` and `sbx events verify` both work."""

    def __init__(self, *args: Any, default_command: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.default_command = default_command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or args[0] not in self.commands:
            if not any(a in ("--help", "-h") for a in args[:1]):
                args = [self.default_command, *args]
        return super().parse_args(ctx, args)


def _use_service(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """`--url`: this command is a client of that service (as SBX_URL says)."""
    if value:
        import os

        os.environ["SBX_URL"] = value


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sandboxer", prog_name="sbx")
@click.option("--url", metavar="URL", expose_value=False, is_eager=True,
              callback=_use_service,
              help="Be a client of the sbx service at URL (default: $SBX_URL; the key in "
                   "$SBX_TOKEN).")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Sandboxer: short-lived sandboxes from profiles, on Docker and other backends.

    On a terminal, `sbx` alone opens the dashboard (as `sbx tui` does); without one it
    prints this help.
    """
    if ctx.invoked_subcommand is None:
        if sys.stdout.isatty() and sys.stdin.isatty():
            ctx.invoke(tui_command)
        else:
            click.echo(ctx.get_help())


# -- the dashboard --------------------------------------------------------------------------


@cli.command("tui")
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


# -- doctor ---------------------------------------------------------------------------------


@cli.command("doctor")
@JSON_OPTION
@command
def doctor_command(as_json: bool) -> None:
    """Backends (reachable? credentials? SDK?), the database and versions."""
    with client() as sbx:
        data = sbx.doctor()
    if as_json:
        emit_json(data)
    else:
        click.echo(f"sbx {data['sbx']}  python {data['python']}  sqlite {data['sqlite']}")
        click.echo(f"home       {data['home']}")
        click.echo(f"install    {data['install']}")
        database = data["database"]
        status = "ok" if database.get("ok") else f"ERROR {database.get('error', '')}"
        mode = f" mode {database['file_mode']}" if "file_mode" in database else ""
        click.echo(f"database   {database['url']} ({database['dialect']}, schema "
                   f"{database.get('schema')}{mode}) {status}")
        click.echo("backends")
        for b in data["backends"]:
            if not b["loaded"]:
                click.echo(f"  {b['name']:<8} NOT LOADED  {b['error']}")
                continue
            tag = "  [test double]" if b["test_double"] else ""
            state = "ok" if b["reachable"] and b["credentials"] else "UNAVAILABLE"
            caps = ",".join(b["capabilities"]) or "-"
            click.echo(f"  {b['name']:<8} {state:<11} {b['detail']}  (capabilities: {caps}){tag}")
        adapters = data.get("adapters") or {}
        if adapters.get("selected") is not None:
            click.echo(f"SBX_ADAPTERS limits backends to: {', '.join(adapters['selected'])}")
        for name in adapters.get("unknown") or []:
            click.echo(f"SBX_ADAPTERS names {name!r}, which no installed package provides")
        for name, packages in (adapters.get("shadowed") or {}).items():
            click.echo(f"backend {name!r} is also registered by {', '.join(packages)}: "
                       "that one is not used")
    if not data["database"].get("ok"):
        sys.exit(5)


# -- profiles -------------------------------------------------------------------------------


@cli.group("profiles")
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
        sys.exit(EXIT_BAD_INPUT)


# -- create / ls / show ---------------------------------------------------------------------


@cli.command("create")
@click.option("--profile", "profile_name", metavar="NAME", help="A profile on the search path.")
@click.option("--profile-file", type=click.Path(dir_okay=False), metavar="FILE",
              help="A profile file (its `extends:` resolves along the search path).")
@click.option("--ttl", metavar="DUR", help="Time to live, e.g. 30m (default from the profile).")
@click.option("--name", metavar="NAME", help="A name you can use instead of the id.")
@click.option("--label", "labels", multiple=True, metavar="K=V", help="A label (repeatable).")
@click.option("--owner", metavar="WHO", help="Who it is for (default: you, user@host).")
@click.option("--task", metavar="WHAT", help="What it is for.")
@JSON_OPTION
@command
def create_command(profile_name, profile_file, ttl, name, labels, owner, task, as_json) -> None:
    """Create a sandbox from a profile (`default` unless told)."""
    from sandboxer import load_profile
    from sandboxer.core.rules.durations import parse_duration
    from sandboxer.core.rules.labels import parse_labels

    if profile_name and profile_file:
        raise BadInput("give --profile or --profile-file, not both")
    ttl_delta = parse_duration(ttl, "--ttl") if ttl is not None else None
    parsed_labels = parse_labels(labels)
    with client() as sbx:
        profile = load_profile(profile_file) if profile_file else sbx.profile(
            profile_name or "default")
        progress(f"creating a sandbox from profile {profile.name} on {profile.backend}...")
        view = sbx.create(profile, ttl=ttl_delta, name=name, labels=parsed_labels,
                          owner=owner, task=task).to_dict()
    if as_json:
        emit_json(view)
    else:
        click.echo(view["id"])


def _ls_rows(views: list[Mapping[str, Any]], now: str) -> list[list[Any]]:
    return [[v["id"], v["name"], v["profile"], v["backend"], v["state"], v["owner"], v["host"],
             human_age(v["created_at"], now), human_left(v["ttl_left_s"])] for v in views]


@cli.command("ls")
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
    with client() as sbx:
        views = [box.to_dict() for box in sbx.list(
            include_destroyed=include_all, state=state, backend=backend, labels=wanted)]
    if as_json:
        emit_json(views)
    elif views:
        click.echo(table(_ls_rows(views, now),
                         ["ID", "NAME", "PROFILE", "BACKEND", "STATE", "OWNER", "HOST", "AGE", "TTL"]))
    else:
        click.echo("no sandboxes" + ("" if include_all else " (sbx ls --all shows destroyed ones)"),
                   err=True)


@cli.command("show")
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
    for key in ("id", "name", "state", "profile", "backend", "backend_ref", "owner", "task",
                "install", "created_at", "started_at", "deadline", "hard_deadline",
                "last_activity_at", "idle_deadline", "ended_at", "error"):
        if view.get(key) is not None:
            click.echo(f"{key:<17} {printable(view[key])}")
    click.echo(f"{'ttl_left':<17} {human_left(view['ttl_left_s'])}")
    labels = ", ".join(f"{k}={v}" for k, v in view["labels"].items()) or "-"
    click.echo(f"{'labels':<17} {printable(labels)}")


# -- exec / logs / destroy ------------------------------------------------------------------


@cli.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("sandbox_id", metavar="ID")
@click.option("--timeout", metavar="DUR", help="Kill the command after this long (exit 124).")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD [ARG...]")
@command
def exec_command(sandbox_id: str, timeout: str | None, argv: tuple[str, ...]) -> None:
    """Run a command in a sandbox; the exit status is the command's own."""
    from sandboxer import OutputChunk
    from sandboxer.core.rules.durations import parse_duration

    limit = parse_duration(timeout, "--timeout") if timeout else None
    outputs = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}
    code = 1
    with client() as sbx:
        for item in sbx.get(sandbox_id).exec_stream(list(argv), timeout=limit):
            if isinstance(item, OutputChunk):  # as it comes, as `docker exec` prints it
                outputs[item.stream].write(item.data)
                outputs[item.stream].flush()
            else:
                code = item.exit_code
    sys.exit(code)


@cli.command("logs")
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


@cli.command("destroy")
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


@cli.command("extend")
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


@cli.command("touch")
@click.argument("sandbox_id", metavar="ID")
@command
def touch_command(sandbox_id: str) -> None:
    """Record activity now (resets the idle clock)."""
    with client() as sbx:
        box = sbx.get(sandbox_id)
        box.touch()
        view = box.to_dict()
    click.echo(f"{view['id']} active at {view['last_activity_at']}")


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
    """5 when a backend was unreachable, else 1 (the operation failed)."""
    return 5 if any(f.get("code") == 5 for f in failed) else 1


def _failure_line(command_name: str, failed: list[dict[str, str]]) -> str:
    first = failed[0]
    more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
    return f"sbx {command_name}: {first['id']}: {first['error']}{more}"


@cli.command("reap")
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
    from sandboxer.core.observe.delivery import load_settings
    from sandboxer_tui.server.prepared import service_url, take_async_client

    if not service_url():
        load_settings()  # a bad sink setting is refused before the first cycle

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
        async with take_async_client() as sbx:
            await sbx.run_reaper(interval, stop=stop, on_report=on_report, timeout=limit,
                                 orphans=orphans)

    asyncio.run(main())


@cli.command("reconcile")
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


# -- events ---------------------------------------------------------------------------------


@cli.group("events", cls=DefaultGroup, default_command="list")
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
        sys.exit(1)


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
        sys.exit(1)


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
        sys.exit(1)


# -- pause, resume, checkpoints -------------------------------------------------------------


@cli.command("pause")
@click.argument("sandbox_id", metavar="ID")
@JSON_OPTION
@command
def pause_command(sandbox_id: str, as_json: bool) -> None:
    """Freeze a sandbox (no CPU while paused); its deadline still holds."""
    _change_state(sandbox_id, "pause", as_json, "paused")


@cli.command("resume")
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


@cli.command("snapshot")
@click.argument("sandbox_id", metavar="ID")
@click.option("--name", metavar="NAME", help="A name for the checkpoint.")
@JSON_OPTION
@command
def snapshot_command(sandbox_id: str, name: str | None, as_json: bool) -> None:
    """Save a sandbox's filesystem as a checkpoint."""
    progress(f"snapshotting {sandbox_id}...")
    with client() as sbx:
        view = sbx.get(sandbox_id).snapshot(name).to_dict()
    if as_json:
        emit_json(view)
    else:
        click.echo(view["id"])


@cli.command("restore")
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


@cli.group("checkpoints", cls=DefaultGroup, default_command="list")
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


@cli.group("checkpoint")
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


# -- metrics --------------------------------------------------------------------------------


def _metric_line(view: Mapping[str, Any]) -> str:
    from sandboxer_tui.formatting import megabytes as mb

    cpu = "-" if view["cpu_pct"] is None else f"{view['cpu_pct']:.1f}%"
    net = ("-" if view["net_rx_bytes"] is None
           else f"rx {view['net_rx_bytes']}B tx {view['net_tx_bytes']}B")
    return (f"{view['time']}  cpu {cpu}  mem {mb(view['memory_bytes'])} / "
            f"{mb(view['memory_limit'])}  pids {view['pids'] if view['pids'] is not None else '-'}"
            f"  net {net}")


@cli.command("metrics")
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
        from sandboxer.core.follow.containermetrics import prometheus_text

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

    from sandboxer_tui.server.prepared import take_async_client

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
        async with take_async_client() as sbx:
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


# -- evidence -------------------------------------------------------------------------------


@cli.group("evidence", cls=DefaultGroup, default_command="export")
def evidence_group() -> None:
    """Supervision evidence: `sbx evidence ID --output FILE`, `sbx evidence verify FILE`."""


@evidence_group.command("export")
@click.argument("sandbox_id", metavar="ID")
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False), metavar="FILE")
@click.option("--sign", "key", type=click.Path(dir_okay=False), metavar="PATH",
              help="Sign it with this ed25519 private key (sbx keys generate): a DSSE "
                   "envelope of an in-toto Statement (docs/evidence.md).")
@click.option("--service-signed", is_flag=True,
              help="As a client of `sbx serve`: signed by the service's own key.")
@command
def evidence_export(sandbox_id: str, output: str, key: str | None = None,
                    service_signed: bool = False) -> None:
    """Write one sandbox's evidence bundle: record, profile, events, execs, summary."""
    with client() as sbx:
        doc = sbx.get(sandbox_id).evidence(output, sign=key, by_service=service_signed)
    if key is None and not service_signed:
        click.echo(f"{output}: {len(doc['events'])} events of {doc['sandbox']['id']}")
        return
    from sandboxer.core.observe.signing import open_envelope

    bundle, _ = open_envelope(doc)
    keyids = ", ".join(s["keyid"][:16] for s in doc["signatures"])
    click.echo(f"{output}: {len(bundle['events'])} events of {bundle['sandbox']['id']}, "
               f"signed (keyid {keyids})")


@evidence_group.command("verify")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--key", type=click.Path(dir_okay=False), metavar="PATH.pub",
              help="Also check its signature: signed by this ed25519 public key, unaltered.")
@JSON_OPTION
@command
def evidence_verify(file: str, as_json: bool, key: str | None = None) -> None:
    """Check a bundle offline; exit 1 naming each altered part or event."""
    from sandboxer import verify_evidence as verify
    from sandboxer.core.observe.signing import is_envelope, open_envelope

    try:
        with open(file) as handle:
            bundle = json.load(handle)
    except OSError as exc:
        raise BadInput(f"{file}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise BadInput(f"{file}: not a JSON evidence bundle: {exc}") from None
    problems = verify(bundle, key=key)
    signed = is_envelope(bundle)
    if signed:
        bundle = open_envelope(bundle)[0] or {}
    signature = ("checked" if key is not None else "not checked") if signed else "none"
    if as_json:
        emit_json({"file": file, "intact": not problems, "problems": problems,
                   "signature": signature})
    elif not problems:
        said = {"checked": f", signed by the key in {key}", "none": "",
                "not checked": "; signed, the signature NOT checked (give --key PATH.pub)"}
        click.echo(f"{file}: intact ({len(bundle.get('events', []))} events){said[signature]}")
    for problem in problems if not as_json else []:
        click.echo(f"sbx: {file}: {problem}", err=True)
    if problems:
        sys.exit(1)


@cli.group("keys")
def keys_group() -> None:
    """Keys that sign evidence: `sbx keys generate PATH`."""


@keys_group.command("generate")
@click.argument("path", type=click.Path(dir_okay=False), metavar="PATH")
@JSON_OPTION
@command
def keys_generate(path: str, as_json: bool) -> None:
    """An ed25519 key pair: the private key at PATH (mode 0600), the public one at PATH.pub."""
    from sandboxer import generate_keys

    made = generate_keys(path)
    if as_json:
        emit_json(made)
    else:
        click.echo(f"{made['private']} (private, mode 0600) and {made['public']} (public); "
                   f"keyid {made['keyid']}")


# -- the store ------------------------------------------------------------------------------


@cli.group("db")
def db_group() -> None:
    """The inventory's store (SQLite by default; PostgreSQL for fleets)."""


@db_group.command("copy")
@click.option("--to", "target", required=True, metavar="URL",
              help="The empty database to copy into, e.g. postgresql+psycopg://USER@HOST/DB.")
@JSON_OPTION
@command
def db_copy_command(target: str, as_json: bool) -> None:
    """Copy every sandbox, checkpoint, event and delivery record into another database.
    Afterwards point SBX_DATABASE_URL at it."""
    with client() as sbx:
        report = sbx.copy_database(target)
    if as_json:
        emit_json(report)
    else:
        rows = ", ".join(f"{n} {t}" for t, n in report["rows"].items())
        click.echo(f"copied into {report['target']}: {rows}; event chain verified "
                   f"({report['events_verified']} events)")


# -- warm pools -----------------------------------------------------------------------------


@cli.group("pool")
def pool_group() -> None:
    """Warm pools: sandboxes made ahead, which `sbx create` claims (docs/pools.md)."""


@pool_group.command("ls")
@JSON_OPTION
@command
def pool_ls(as_json: bool) -> None:
    """Each pool: its size, members ready, creates it served since it started, the oldest."""
    now = now_iso()
    with client() as sbx:
        pools = [p.to_dict() for p in sbx.pools()]
    if as_json:
        emit_json(pools)
    elif pools:
        click.echo(table([(p["profile"], p["backend"], str(p["size"]) + ("*" if p["size_set"]
                           else ""), p["ready"], p["starting"], p["claimed"],
                           human_age(p["oldest"], now) if p["oldest"] else None, p["max_age"],
                           p["error"] or ("" if p["declared"] else "removed: emptying"))
                          for p in pools],
                         ["PROFILE", "BACKEND", "SIZE", "READY", "STARTING", "CLAIMED",
                          "OLDEST", "MAX-AGE", "NOTE"]))
        if any(p["size_set"] for p in pools):
            click.echo("* set by sbx pool set (the profile's size does not apply)", err=True)
    else:
        click.echo("no pools (a profile declares one with `pool: {size: N}`)", err=True)


@pool_group.command("set")
@click.argument("profile", metavar="PROFILE")
@click.option("--size", required=True, type=int, metavar="N",
              help="Warm members to keep (0 empties the pool).")
@JSON_OPTION
@command
def pool_set(profile: str, size: int, as_json: bool) -> None:
    """Keep N warm members of PROFILE, whatever its file says: made (or removed) before
    this returns, so the next create is served warm."""
    with client() as sbx:
        pool = sbx.set_pool_size(profile, size).to_dict()
    if as_json:
        emit_json(pool)
    else:
        click.echo(f"pool {pool['profile']}: size {pool['size']}, {pool['ready']} ready")


@pool_group.command("drain")
@click.argument("profile", metavar="PROFILE")
@JSON_OPTION
@command
def pool_drain(profile: str, as_json: bool) -> None:
    """Destroy every warm member of PROFILE's pool now and keep it empty (size 0) until
    `sbx pool set PROFILE --size N`."""
    with client() as sbx:
        result = sbx.drain_pool(profile)
    if as_json:
        emit_json(result)
    else:
        click.echo(f"drained pool {result['profile']}: {len(result['destroyed'])} member(s) "
                   f"destroyed; it stays empty until sbx pool set {result['profile']} --size N")
        for failure in result["failed"]:
            click.echo(f"sbx: {failure['id']}: {failure['error']}", err=True)
    if result["failed"]:
        sys.exit(result["failed"][0]["code"])


# -- the resident server --------------------------------------------------------------------


@cli.group("server")
def server_group() -> None:
    """A resident process that makes every `sbx` command start fast.

    With a server running for this SBX_HOME, `sbx` hands each command to it; the server
    forks a child that has already imported sbx's libraries. Without one, commands run as usual.
    """


@server_group.command("start")
@click.option("--idle", "idle", default=None, metavar="DURATION",
              help="Exit after this long without a command (default: never).")
@JSON_OPTION
@command
def server_start_command(idle: str | None, as_json: bool) -> None:
    """Start the server in the background (nothing happens if one runs)."""
    from sandboxer.core.rules.durations import parse_duration
    from sandboxer_tui.server import resident

    idle_s = parse_duration(idle, "--idle").total_seconds() if idle else None
    status, new = resident.start(idle_s)
    if as_json:
        emit_json({**status, "started": new})
    else:
        click.echo(f"sbx server {'started' if new else 'already running'} (pid {status['pid']})")


@server_group.command("stop")
@JSON_OPTION
@command
def server_stop_command(as_json: bool) -> None:
    """Stop the server; commands it is running finish first."""
    from sandboxer_tui.server import resident

    status = resident.stop()
    if as_json:
        emit_json({"stopped": status is not None, "pid": status and status["pid"]})
    else:
        click.echo(f"sbx server stopped (pid {status['pid']})" if status else "no sbx server running")


@server_group.command("status")
@JSON_OPTION
@command
def server_status_command(as_json: bool) -> None:
    """Whether a server runs for this SBX_HOME, and how many commands it served."""
    from sandboxer_tui.server import resident

    status = resident.query_status(resident.server_folder())
    running = bool(status and "pid" in status)
    if as_json:
        emit_json({"running": running, **(status or {})})
    elif running:
        click.echo(f"sbx server running (pid {status['pid']}, {status['served']} commands served)")
    else:
        click.echo("no sbx server running")


# -- the HTTP service -----------------------------------------------------------------------


@cli.command("serve")
@click.option("--listen", metavar="HOST:PORT",
              help="Where to listen (default 127.0.0.1:8765, loopback only; beyond loopback "
                   "needs an API key to exist). Without it, --socket alone listens only there.")
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False), metavar="PATH",
              help="Also (or only) a unix socket, mode 0600; requests there need no key.")
@click.option("--reap-every", "reap_every", default="30s", show_default=True, metavar="DUR",
              help="Reconcile, reap and deliver events this often ('0' for never).")
@click.option("--evidence-key", "evidence_key", type=click.Path(dir_okay=False),
              metavar="PATH", help="Sign evidence on request (GET .../evidence?signed=true) "
                                   "with this ed25519 private key (sbx keys generate).")
@command
def serve_command(listen: str | None, socket_path: str | None, reap_every: str,
                  evidence_key: str | None = None) -> None:
    """The library over HTTP, with API keys, streams and metrics (docs/service.md)."""
    from sandboxer.core.rules.durations import parse_duration
    from sandboxer_tui.server.prepared import service_url

    if service_url():
        raise BadInput("sbx serve runs the service itself: unset SBX_URL (or drop --url)")
    every = None if reap_every.strip() == "0" else parse_duration(reap_every, "--reap-every")
    try:  # fastapi and uvicorn load only here
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        from sandboxer.core.rules.errors import Unavailable

        raise Unavailable(f"sbx serve needs {exc.name}: pip install 'sandboxer[service]'"
                          ) from None
    if evidence_key is not None:
        import os

        from sandboxer.core.observe.signing import load_signer

        evidence_key = os.path.abspath(evidence_key)
        load_signer(evidence_key)  # a bad key file is said now (exit 2), not at a request
    from sandboxer_tui.service.server import serve

    serve(listen, socket_path, every, evidence_key)


@cli.group("api-keys")
def api_keys_group() -> None:
    """Keys of the HTTP service: create (shown once), ls, revoke."""


@api_keys_group.command("create")
@click.option("--scope", required=True, type=click.Choice(["read", "write", "admin"]),
              help="read: look; write: also act; admin: also manage keys.")
@click.option("--owner", metavar="WHO", help="Who its requests are recorded as (default: you): "
              "its tenant, whose sandboxes a read or write key alone sees.")
@click.option("--max-sandboxes", type=click.IntRange(min=1), metavar="N",
              help="The owner's quota: live sandboxes at once.")
@click.option("--max-ttl", metavar="DUR", help="The owner's quota: the longest TTL.")
@click.option("--max-execs", type=click.IntRange(min=1), metavar="N",
              help="The owner's quota: commands running at once.")
@JSON_OPTION
@command
def api_keys_create(scope: str, owner: str | None, max_sandboxes: int | None,
                    max_ttl: str | None, max_execs: int | None, as_json: bool) -> None:
    """A new key; printed once (the last word), only its hash is kept."""
    with client() as sbx:
        key, token = sbx.create_api_key(scope, owner=owner, max_sandboxes=max_sandboxes,
                                        max_ttl=max_ttl, max_execs=max_execs)
    if as_json:
        emit_json({**key, "token": token})
    else:
        click.echo(f"{key['id']} ({key['scope']}, owner {key['owner']}); the key, shown only "
                   f"now: {token}")


@api_keys_group.command("ls")
@JSON_OPTION
@command
def api_keys_ls(as_json: bool) -> None:
    """Every key (revoked ones too), never the keys themselves."""
    with client() as sbx:
        keys = sbx.api_keys()
    if as_json:
        emit_json(keys)
    elif keys:
        click.echo(table([(k["id"], k["scope"], k["owner"], k["created_at"], k["created_by"],
                           k["revoked_at"]) for k in keys],
                         ["ID", "SCOPE", "OWNER", "CREATED", "BY", "REVOKED"]))
    else:
        click.echo("no API keys (sbx api-keys create makes one)", err=True)


@api_keys_group.command("revoke")
@click.argument("key_id", metavar="ID")
@JSON_OPTION
@command
def api_keys_revoke(key_id: str, as_json: bool) -> None:
    """Revoke a key: its next request is refused (401)."""
    with client() as sbx:
        key = sbx.revoke_api_key(key_id)
    if as_json:
        emit_json(key)
    else:
        click.echo(f"revoked {key['id']} ({key['scope']}, owner {key['owner']})")


def _not_utf8(arg: str) -> bool:
    """Bytes that were not UTF-8 reach Python as lone surrogates (surrogateescape)."""
    try:
        arg.encode()
    except UnicodeEncodeError:
        return True
    return False


def main(args: list[str] | None = None) -> None:
    """Run sbx. Click's own usage errors follow the same rules as ours: one line (or one
    JSON object under --json) and exit 2."""
    import gc

    args = sys.argv[1:] if args is None else args
    if any(name.startswith("OTEL_") for name in os.environ):
        import logging  # an exporter's retries say nothing; only a batch it gave up on

        logging.getLogger("opentelemetry").setLevel(logging.ERROR)
    for arg in args:
        if not arg.isascii() and _not_utf8(arg):  # ids, names, labels, commands: all UTF-8
            fail(BadInput(f"argument {arg!r} is not UTF-8 text"), "--json" in args)
    try:
        code = cli.main(args=args, prog_name="sbx", standalone_mode=False)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "sbx"
        fail(BadInput(f"{exc.format_message()} (see {where} --help)"), "--json" in args)
    except click.Abort:
        click.echo("sbx: aborted", err=True)
        code = 1
    except click.ClickException as exc:
        fail(BadInput(exc.format_message()), "--json" in args)
    finally:
        if "sandboxer.core.observe.telemetry" in sys.modules:  # the command's spans and metrics go out now
            sys.modules["sandboxer.core.observe.telemetry"].shutdown()
        gc.freeze()  # nothing left to collect: skip the costly sweep at interpreter exit
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
