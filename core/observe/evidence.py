"""Supervision evidence: one self-contained JSON bundle per sandbox, checkable offline.

The bundle holds the sandbox record, its resolved profile (secrets as references), every
event of the sandbox with its chain hashes, its exec records, checkpoints and a lifetime
summary. `verify` recomputes each event's hash from its content and each part's digest, so
an altered event or part is named. (The bundle proves integrity, not authorship: whoever
holds the database could rebuild it; the event chain and its anchor are the check there.)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from sandboxer.core.rules.clock import from_iso
from sandboxer.core.store.events import canonical, event_hash

FORMAT = "sandboxer-evidence/1"
PARTS = ("sandbox", "profile", "events", "execs", "checkpoints", "summary")


def _digest(part: Any) -> str:
    return hashlib.sha256(canonical(part).encode()).hexdigest()


def build(sandbox: Mapping[str, Any], events: list[Mapping[str, Any]],
          checkpoints: list[Mapping[str, Any]], generated_at: str,
          samples: list[Mapping[str, Any]] = ()) -> dict[str, Any]:
    record = {k: v for k, v in sandbox.items() if k not in ("profile_json", "lease_owner",
                                                           "lease_expires_at", "fence")}
    record["labels"] = json.loads(record.pop("labels_json") or "{}")
    raw_events = [dict(e) for e in events]
    execs = [{"event_id": e["id"], "time": e["time"], "actor": e["actor"],
              **json.loads(e["payload_json"])} for e in raw_events if e["type"] == "sandbox.exec"]
    started, ended = sandbox["started_at"], sandbox["ended_at"]
    lifetime = None
    if started and ended:
        lifetime = (from_iso(ended) - from_iso(started)).total_seconds()
    body = {
        "sandbox": record,
        "profile": json.loads(sandbox["profile_json"] or "{}"),
        "events": raw_events,
        "execs": execs,
        "checkpoints": [dict(c) for c in checkpoints],
        "summary": {
            "owner": sandbox["owner"], "task": sandbox["task"], "backend": sandbox["backend"],
            # how it was contained, beside who ran what (docs/security.md, "Isolation levels")
            "isolation": sandbox.get("isolation") or "container",
            "created_at": sandbox["created_at"], "started_at": started, "ended_at": ended,
            "lifetime_s": lifetime, "exec_count": len(execs), "event_count": len(raw_events),
            "actors": sorted({e["actor"] for e in raw_events}),
            "metrics": _peaks(samples),
        },
    }
    return {"format": FORMAT, "generated_at": generated_at,
            "digests": {part: _digest(body[part]) for part in PARTS}, **body}


def verify(bundle: Mapping[str, Any]) -> list[str]:
    """Problems found, each naming the altered part or event; empty when intact."""
    if bundle.get("format") != FORMAT:
        return [f"not a {FORMAT} bundle"]
    problems = []
    digests = bundle.get("digests") or {}
    for part in PARTS:
        if part not in bundle:
            problems.append(f"part {part!r} is missing")
        elif digests.get(part) != _digest(bundle[part]):
            problems.append(f"part {part!r} was altered (its digest does not match)")
    for event in bundle.get("events", []):
        try:
            if event_hash(event) != event["hash"]:
                problems.append(f"event {event['id']} ({event['type']}) was altered: its hash "
                                "does not match its content")
        except (KeyError, TypeError):
            problems.append(f"event {event!r:.60} is malformed")
    sandbox_id = (bundle.get("sandbox") or {}).get("id")
    for event in bundle.get("events", []):
        if isinstance(event, Mapping) and event.get("sandbox_id") != sandbox_id:
            problems.append(f"event {event.get('id')} belongs to another sandbox")
    return problems


def _peaks(samples: list[Mapping[str, Any]]) -> dict[str, Any]:
    def peak(key: str) -> Any:
        values = [s[key] for s in samples if s[key] is not None]
        return max(values) if values else None

    return {"samples": len(samples), "peak_cpu_pct": peak("cpu_pct"),
            "peak_memory_bytes": peak("memory_bytes"),
            "first": samples[0]["time"] if samples else None,
            "last": samples[-1]["time"] if samples else None}
