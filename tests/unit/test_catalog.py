"""Every event type and reason sbx writes is in the catalogue (core/rules/catalog.py) and in
docs/events.md, which webhook consumers read."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from sandboxer.core.rules.catalog import EventType, Reason
from sandboxer.core.rules.states import ADOPTED_EVENT, CREATED_EVENT, TRANSITIONS

ROOT = Path(__file__).resolve().parents[2]
EVENT_WORD = re.compile(r"(sandbox|checkpoint|pool)\.[a-z]+(-[a-z]+)*")
DOC = (ROOT / "docs" / "events.md").read_text()


def string_constants(package: str) -> set[str]:
    found = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
    return found


def test_the_code_writes_no_event_type_outside_the_catalogue():
    words = {s for pkg in ("core", "adapters", "sandboxer", "sandboxer_tui")
             for s in string_constants(pkg) if EVENT_WORD.fullmatch(s)}
    assert words, "no event type found: the scan is broken"
    assert words - {e.value for e in EventType} == set()


def test_the_state_table_writes_catalogued_types():
    written = {*TRANSITIONS.values(), CREATED_EVENT, ADOPTED_EVENT}
    assert written <= {e.value for e in EventType}


def test_docs_events_lists_every_type_and_reason():
    for value in [e.value for e in EventType] + [r.value for r in Reason]:
        assert f"`{value}`" in DOC, f"docs/events.md does not list {value}"


def test_every_failpoint_the_code_names_is_listed():
    from sandboxer.core.rules.failpoints import POINTS

    named = set()
    for pkg in ("core", "adapters", "sandboxer", "sandboxer_tui"):
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "failpoint"
                        and node.args and isinstance(node.args[0], ast.Constant)):
                    named.add(node.args[0].value)
    assert named and named == set(POINTS)
