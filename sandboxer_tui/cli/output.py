"""What every command shows the same way: JSON documents, tables, progress lines, times, and
an error as one line (or one JSON object under --json) with its documented exit code."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable
from typing import Any

import click

from sandboxer.core.rules.errors import ExitCode, classify, one_line
from sandboxer.core.rules.views import encode, encode_list
from sandboxer_tui.formatting import printable

JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")


def emit_json(data: Any) -> None:
    """One JSON document in UTF-8: a list one record per line, as the library writes a
    listing (core/rules/views.py encode_list), anything else indented by two spaces."""
    click.echo(encode_list(data) if isinstance(data, list) else encode(data, indent=True))


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
            sys.exit(ExitCode.INTERRUPTED)
        except Exception as exc:
            fail(exc, bool(kwargs.get("as_json")))

    return wrapper
