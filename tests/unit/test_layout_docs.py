"""The layout sections of README.md and docs/design.md describe the tree as it is: every
folder they name exists, and every package of the project (and every top-level folder of the
repository) is named in them. A folder moved or added without its line fails here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = {"README.md": "## Layout", "docs/design.md": "## Layout"}
# the packages the layout must account for, to this depth below the repository's top
PACKAGE_ROOTS = ("core", "adapters", "sandboxer", "sandboxer_tui")
DEPTH = 2


def layout_block(doc: str, heading: str) -> str:
    text = (ROOT / doc).read_text()
    after = text[text.index(heading + "\n"):]
    match = re.search(r"```\n(.*?)```", after, re.S)
    assert match, f"{doc}: no code block under {heading}"
    return match.group(1)


def named_folders(block: str) -> set[str]:
    """The folders a layout block names: an entry is a line whose first word ends in `/`; an
    entry indented deeper than the one before it is inside that one."""
    named: set[str] = set()
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        match = re.match(r"^( *)([\w.-]+(?:/[\w.-]+)*/)(?:\s|$)", line)
        if not match:
            continue
        indent, name = len(match.group(1)), match.group(2).rstrip("/")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = f"{stack[-1][1]}/{name}" if stack else name
        stack.append((indent, path))
        named.add(path)
    return named


def project_packages() -> set[str]:
    found = set()
    for top in PACKAGE_ROOTS:
        for init in (ROOT / top).rglob("__init__.py"):
            folder = init.parent.relative_to(ROOT)
            if len(folder.parts) <= DEPTH and not any(p.startswith(("_", ".")) for p in folder.parts):
                found.add(folder.as_posix())
    return found


def top_level_folders() -> set[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.split()
    return {p.split("/")[0] for p in listed if "/" in p and not p.startswith(".")}


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_every_folder_the_layout_names_exists(doc):
    missing = sorted(f for f in named_folders(layout_block(doc, DOCS[doc]))
                     if not (ROOT / f).is_dir())
    assert not missing, f"{doc} names folders that do not exist: {missing}"


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_every_package_and_top_folder_is_in_the_layout(doc):
    named = named_folders(layout_block(doc, DOCS[doc]))
    wanted = project_packages() | top_level_folders()
    assert not sorted(wanted - named), f"{doc}'s layout leaves out: {sorted(wanted - named)}"


def test_the_check_sees_a_missing_folder_and_a_missing_package():
    """The parser reads nesting, so a stale line and a left-out package are both caught."""
    block = "core/            the engine\n  rules/         pure rules\n  gone/          x\nsandboxer/\n"
    named = named_folders(block)
    assert named == {"core", "core/rules", "core/gone", "sandboxer"}
    assert not (ROOT / "core/gone").is_dir()
    assert "core/store" in project_packages() - named
