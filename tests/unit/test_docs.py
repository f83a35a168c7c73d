"""The contracts live in the repository: docs/reliability.md cites only tests that exist, and
no tracked file cites notes kept outside the repository, which a newcomer cannot read."""

from __future__ import annotations

import ast
import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# `tests/FILE.py::name`, `tests/FILE.py::Class::name`, with an optional `[parametrised-id]`
REFERENCE = re.compile(r"tests/[\w/]+\.py(?:::\w+(?:\[[^\]\s`]*\])?)+")
# Spelt in pieces, so this file does not cite them itself.
OUTSIDE = ("shared" + "/notes", "../" + "shared", "DESIGN" + ".md")
CHECKED = ("core/", "adapters/", "sandboxer/", "sandboxer_tui/", "tests/", "docs/", "bench/",
           "README.md")


@cache
def _names(path: Path) -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """The test functions and test classes at the top of a module (a `TestX = ...` made by a
    factory, such as hypothesis's state machines, counts as a class), and each class's own
    test methods."""
    tree = ast.parse(path.read_text(), str(path))
    top: set[str] = set()
    methods: dict[str, frozenset[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            top.add(node.name)
        elif isinstance(node, ast.ClassDef):
            top.add(node.name)
            methods[node.name] = frozenset(
                n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
        elif isinstance(node, ast.Assign):
            top.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return frozenset(top), methods


def _problem(reference: str) -> str | None:
    """Why `reference` names no test, or None when it does."""
    file, *parts = re.sub(r"\[[^\]]*\]", "", reference).split("::")
    path = ROOT / file
    if not path.is_file():
        return f"{file} does not exist"
    top, methods = _names(path)
    first = parts[0]
    if len(parts) == 1:
        is_test = first.startswith("test_") or first.startswith("Test")
        return None if first in top and is_test else f"{file} defines no test {first}"
    if len(parts) == 2 and parts[1] in methods.get(first, ()) and parts[1].startswith("test_"):
        return None
    return f"{file} defines no test {'::'.join(parts)}"


def test_reliability_doc_cites_only_tests_that_exist():
    text = (ROOT / "docs" / "reliability.md").read_text()
    references = sorted(set(REFERENCE.findall(text)))
    assert len(references) > 50, "docs/reliability.md should name the tests of each guarantee"
    problems = [f"{ref}: {why}" for ref in references if (why := _problem(ref))]
    assert problems == []


def test_the_reference_check_refuses_what_does_not_exist():
    assert _problem("tests/unit/test_docs.py::test_reliability_doc_cites_only_tests_that_exist") \
        is None
    assert _problem("tests/reliability/test_reliability.py::test_kill_9_at_a_failpoint_leaves_nothing_behind"
                    "[create-create.after-intent]") is None
    assert _problem("tests/unit/test_lifecycle_model.py::TestLifecycle") is None
    assert _problem("tests/unit/test_docs.py::test_no_such_thing")
    assert _problem("tests/unit/no_such_file.py::test_x")
    assert _problem("tests/unit/test_docs.py::ROOT")  # a name, but not a test
    assert _problem("tests/backends/test_conformance.py::TestDockerConformance::test_not_there")


def test_no_tracked_file_cites_notes_outside_the_repository():
    listed = subprocess.run(["git", "ls-files", "-z", "--", *CHECKED], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    files = [name for name in listed if name and (ROOT / name).is_file()]
    assert "docs/reliability.md" in files and "README.md" in files
    cites = []
    for name in files:
        data = (ROOT / name).read_bytes()
        cites += [f"{name}: {needle}" for needle in OUTSIDE if needle.encode() in data]
    assert cites == []
