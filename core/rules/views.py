"""The public shapes of records (docs/cli.md, "JSON output"), shared by every front end."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NotRequired, TypedDict

from sandboxer.core.rules.clock import from_iso
from sandboxer.core.rules.states import ON_THE_CLOCK

# The columns sandbox_view reads: a listing fetches only these (not the stored profile), and
# sandbox_views takes a row as a tuple of them in this order.
VIEW_COLUMNS = ("id", "name", "profile", "backend", "backend_ref", "state", "owner", "task",
                "labels_json", "install_id", "host", "created_at", "started_at", "deadline",
                "hard_deadline", "last_activity_at", "idle_timeout_s", "ended_at", "error",
                "pool", "launch", "isolation")


class SandboxView(TypedDict):
    """A sandbox as every front end shows it, in `sandbox_view`'s order: the one shape the
    library's SandboxRecord reads and the service's document derives its models from
    (tests/service/test_documented_shapes.py checks that it names what is sent)."""

    id: str
    name: str | None
    profile: str
    backend: str
    backend_ref: str | None
    isolation: str  # how it is contained: container | gvisor (docs/security.md)
    state: str
    owner: str
    task: str | None
    labels: dict[str, str]
    install: str
    host: str | None
    created_at: str
    started_at: str | None
    deadline: str
    hard_deadline: str
    last_activity_at: str
    idle_timeout_s: int | None
    idle_deadline: str | None
    ended_at: str | None
    error: str | None
    launch: str | None
    pool: str | None
    ttl_left_s: NotRequired[int | None]  # only when read with a `now`


# What `sbx metrics` tells a person about a sandbox under gVisor (docs/security.md): the engine
# measures the gVisor kernel's host process, not the sandbox's own processes (the docker
# backend leaves pids out).
GVISOR_METRICS_NOTE = ("under gVisor: pids is not read (the engine sees gVisor's own threads, "
                       "not the sandbox's processes); CPU and memory include gVisor's kernel")

# ... and about its snapshots: gVisor keeps /tmp in its own memory, which the engine's commit
# does not see
GVISOR_SNAPSHOT_NOTE = ("under gVisor: /tmp is gVisor's own memory, not in the checkpoint; the "
                        "rest of the filesystem is")


def sandbox_view(row: Mapping[str, Any], now_iso: str | None = None) -> dict[str, Any]:
    """The row as a `SandboxView`."""
    return _view_maker(now_iso)(tuple(map(row.get, VIEW_COLUMNS)))


def sandbox_views(records: Iterable[Sequence[Any]], now_iso: str | None = None,
                  ) -> list[dict[str, Any]]:
    """A listing's rows, each a tuple of VIEW_COLUMNS in their order (what
    inventory.list_sandboxes gives with `as_tuples`), as `SandboxView`s: each view built
    once from its row, with no dict of the row on the way (issue 36)."""
    return list(map(_view_maker(now_iso), records))


def _view_maker(now_iso: str | None) -> Callable[[Sequence[Any]], dict[str, Any]]:
    """What builds one view from a row's VIEW_COLUMNS, with what every row of a listing
    shares worked out once: the time, and the label sets seen (a fleet's labels repeat; each
    view gets its own dict). Times are compared and added as the fixed-width UTC strings the
    store keeps (clock.to_iso): the strings sort as the times do, so no aware datetime is
    made per row; the results equal ttl.idle_deadline's and ttl.effective_deadline's
    (tests/unit/test_views.py)."""
    now = None if now_iso is None else _micros(_naive(now_iso))
    seen_labels: dict[str, dict[str, str]] = {}

    def make(record: Sequence[Any]) -> dict[str, Any]:
        (sandbox_id, name, profile, backend, backend_ref, state, owner, task, labels_json,
         install_id, host, created_at, started_at, deadline, hard_deadline, last_activity_at,
         idle_timeout_s, ended_at, error, pool, launch, isolation) = record
        if not labels_json or labels_json == "{}":
            labels: dict[str, str] = {}
        else:
            known = seen_labels.get(labels_json)
            if known is None:
                known = seen_labels[labels_json] = json.loads(labels_json)
            labels = dict(known)
        idle = None
        if idle_timeout_s:
            idle = (_naive(last_activity_at) + timedelta(seconds=idle_timeout_s)
                    ).isoformat(timespec="microseconds") + "Z"
        view = {
            "id": sandbox_id,
            "name": name,
            "profile": profile,
            "backend": backend,
            "backend_ref": backend_ref,
            "isolation": isolation or "container",
            "state": state,
            "owner": owner,
            "task": task,
            "labels": labels,
            "install": install_id,
            "host": host,
            "created_at": created_at,
            "started_at": started_at,
            "deadline": deadline,
            "hard_deadline": hard_deadline,
            "last_activity_at": last_activity_at,
            "idle_timeout_s": idle_timeout_s,
            "idle_deadline": idle,
            "ended_at": ended_at,
            "error": error,
            # how its create was served: "warm" (a pool member claimed) or "cold"; None for a
            # pool member nobody has claimed
            "launch": launch or (None if pool else "cold"),
            "pool": pool,
        }
        if now is not None:
            view["ttl_left_s"] = _seconds_left(ttl_end_us(view), now)
        return view

    return make


def with_ttl_left(entries: Iterable[tuple[dict[str, Any], int | None, Any]], now_iso: str,
                  copy: bool = True) -> list[dict[str, Any]]:
    """The views of a listing kept between reads (core/follow/watch.py InventoryMirror), each
    entry (view, `ttl_end_us`, ...) as read, as `sandbox_view` makes them with `now_iso`: a
    copy of each (its labels too), with `ttl_left_s` last, counting down to the earlier of
    its deadline and idle deadline while on the clock; the ends worked out when the rows
    were read, so that a listing of 10,000 parses no time. `copy=False`: the views
    themselves are given `ttl_left_s`, for a caller that keeps them no longer."""
    now = _micros(_naive(now_iso))
    made = []
    for view, end, _ in entries:
        if copy:
            view = dict(view)
            view["labels"] = dict(view["labels"])
        view["ttl_left_s"] = _seconds_left(end, now)
        made.append(view)
    return made


def encode(doc: Any, *, indent: bool = False) -> bytes:
    """A JSON document as sbx writes one: UTF-8, compact (indented by two spaces with
    `indent`), keys that are not strings written as strings, as the standard library writes
    them. orjson encodes it, in a tenth of the standard library's time (issue 36). A string
    orjson refuses, a lone surrogate (a file name that is not UTF-8, which sbx carries with
    surrogateescape), is written as the standard library writes it: escaped, `\\udcff`."""
    import orjson

    option = orjson.OPT_NON_STR_KEYS | (orjson.OPT_INDENT_2 if indent else 0)
    try:
        return orjson.dumps(doc, option=option)
    except orjson.JSONEncodeError:
        if indent:
            return json.dumps(doc, indent=2).encode()
        return json.dumps(doc, separators=(",", ":")).encode()


def json_array(encoded: list[bytes]) -> bytes:
    """Encoded documents as one JSON array, one per line: how sbx writes a list (docs/cli.md,
    "JSON output")."""
    return b"[\n" + b",\n".join(encoded) + b"\n]" if encoded else b"[]"


def encode_list(docs: Iterable[Any]) -> bytes:
    """Documents as one JSON array, one per line (json_array): a listing's views, say."""
    return json_array(list(map(encode, docs)))


def view_fragment(view: Mapping[str, Any]) -> bytes:
    """A view made without a `now`, encoded, its closing brace left off: what a listing kept
    between reads holds for each row, to complete with `ttl_left_s` as of each read
    (kept_views_json)."""
    return encode(view)[:-1]


def kept_views_json(entries: Iterable[tuple[Any, int | None, bytes]], now_iso: str) -> bytes:
    """The listing document of views kept between reads, as of `now_iso`, from each one's
    (view, `ttl_end_us`, `view_fragment`): encode_list's document of the views with
    `ttl_left_s`, with no view copied or encoded again."""
    now = _micros(_naive(now_iso))
    null = b',"ttl_left_s":null}'
    return json_array([
        fragment + (null if end is None else b',"ttl_left_s":%d}' % _seconds_left(end, now))
        for _view, end, fragment in entries])


def ttl_end_us(view: Mapping[str, Any]) -> int | None:
    """When a view's `ttl_left_s` reaches 0, in microseconds since the epoch: the earlier of
    its deadline and idle deadline (stored times, which sort as the times do); None off the
    clock."""
    if view["state"] not in ON_THE_CLOCK:
        return None
    idle, deadline = view["idle_deadline"], view["deadline"]
    return _micros(_naive(idle if idle is not None and idle < deadline else deadline))


def _seconds_left(end: int | None, now: int) -> int | None:
    """Whole seconds from `now` to `end` (ttl_end_us), at least 0; None off the clock."""
    return None if end is None else (end - now) // 1_000_000 if end > now else 0


_EPOCH = datetime(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)


def _micros(naive: datetime) -> int:
    """A naive UTC time as whole microseconds since the epoch: exact, as a float is not."""
    return (naive - _EPOCH) // _MICROSECOND


def _naive(text: str) -> datetime:
    """A stored time (clock.to_iso's form) as a naive datetime in UTC: what from_iso reads,
    without the time zone each aware datetime costs."""
    if len(text) != 27 or text[-1] != "Z" or text[10] != "T":
        from_iso(text)  # raises its error for anything to_iso did not write
    return datetime.fromisoformat(text[:-1])


def event_view(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "time": row["time"], "sandbox_id": row["sandbox_id"],
            "type": row["type"], "actor": row["actor"], "reason": row["reason"],
            "payload": json.loads(row["payload_json"] or "{}"),
            "prev_hash": row["prev_hash"], "hash": row["hash"]}
