"""Rules written once: the one-line error message (sandboxer.adapters.base.one_line, re-exported by
sandboxer.core.rules.errors) has no copies elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COPY = re.compile(r"\" \"\.join\(str\((exc|error|err)\)\.split\(\)\)")


def test_the_one_line_error_rule_is_written_once():
    found = [f"{path.relative_to(ROOT)}:{n}" for pkg in ("core", "adapters", "sandboxer",
                                                         "sandboxer_tui")
             for path in (ROOT / pkg).rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1) if COPY.search(line)]
    assert found == ["adapters/base.py:" + str(next(
        n for n, line in enumerate((ROOT / "adapters/base.py").read_text().splitlines(), 1)
        if COPY.search(line)))]
