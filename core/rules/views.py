"""The public shapes of records (docs/cli.md, "JSON output"), shared by every front end."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

from sandboxer.core.rules.clock import from_iso, to_iso
from sandboxer.core.rules.states import ON_THE_CLOCK
from sandboxer.core.rules.ttl import effective_deadline, idle_deadline

# The columns sandbox_view reads: a listing fetches only these (not the stored profile).
VIEW_COLUMNS = ("id", "name", "profile", "backend", "backend_ref", "state", "owner", "task",
                "labels_json", "install_id", "host", "created_at", "started_at", "deadline",
                "hard_deadline", "last_activity_at", "idle_timeout_s", "ended_at", "error",
                "pool", "launch")


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
    view = {
        "id": row["id"],
        "name": row["name"],
        "profile": row["profile"],
        "backend": row["backend"],
        "backend_ref": row["backend_ref"],
        "isolation": row.get("isolation") or "container",
        "state": row["state"],
        "owner": row["owner"],
        "task": row["task"],
        "labels": json.loads(row["labels_json"] or "{}"),
        "install": row["install_id"],
        "host": row.get("host"),
        "created_at": row["created_at"],
        "started_at": row["started_at"],
        "deadline": row["deadline"],
        "hard_deadline": row["hard_deadline"],
        "last_activity_at": row["last_activity_at"],
        "idle_timeout_s": row.get("idle_timeout_s"),
        "idle_deadline": to_iso(idle_deadline(row)),
        "ended_at": row["ended_at"],
        "error": row["error"],
        # how its create was served: "warm" (a pool member claimed) or "cold"; None for a
        # pool member nobody has claimed
        "launch": row.get("launch") or (None if row.get("pool") else "cold"),
        "pool": row.get("pool"),
    }
    if now_iso is not None:
        left = None
        if row["state"] in ON_THE_CLOCK:
            left = max(0, int((effective_deadline(row) - from_iso(now_iso)).total_seconds()))
        view["ttl_left_s"] = left
    return view


def event_view(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "time": row["time"], "sandbox_id": row["sandbox_id"],
            "type": row["type"], "actor": row["actor"], "reason": row["reason"],
            "payload": json.loads(row["payload_json"] or "{}"),
            "prev_hash": row["prev_hash"], "hash": row["hash"]}
