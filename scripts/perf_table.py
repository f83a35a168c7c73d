#!/usr/bin/env python3
"""The README's performance table, made from the benchmarks' last results (bench/results/*.json,
which `make bench` writes), so a figure in the README is never older than the code's last run.

    python scripts/perf_table.py --write   # rewrite the table in README.md
    python scripts/perf_table.py --check   # exit 1 when README.md's table is not the results'
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
README = ROOT / "README.md"
START, END = "<!-- perf-table:start -->", "<!-- perf-table:end -->"
# the benchmarks in the order the table lists them
ORDER = ("lifecycle", "oneshot", "api", "service", "mcp", "e2b_api", "files", "proxy", "terminal", "pool", "reap", "checkpoints", "delivery",
         "metrics", "fleet", "tui", "gvisor")


def table(results: Path = RESULTS) -> str:
    found = {p.stem: json.loads(p.read_text()) for p in sorted(results.glob("*.json"))}
    names = [n for n in ORDER if n in found] + sorted(set(found) - set(ORDER))
    lines = ["| benchmark | measurement | measured | target | |", "|---|---|---|---|---|"]
    for name in names:
        doc = found[name]
        meta = doc.get("meta") or {}
        where = f"`bench/bench_{name}.py`, {meta.get('time', '?')[:10]}, {meta.get('git_commit', '?')}"
        for row in doc.get("summary") or []:
            met = "met" if row.get("pass") else "**missed**"
            lines.append(f"| {where} | {row['measurement']} | {row.get('shown', row.get('value'))} "
                         f"| {row.get('target_shown', row.get('target'))} | {met} |")
    return "\n".join(lines)


def current(readme: str) -> str:
    start, end = readme.index(START) + len(START), readme.index(END)
    return readme[start:end].strip("\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    args = parser.parse_args()
    readme = README.read_text()
    made = table()
    if args.check:
        if current(readme) != made:
            print("README.md's performance table is not the one bench/results/*.json make: "
                  "run `python scripts/perf_table.py --write` (after `make bench`)", file=sys.stderr)
            return 1
        return 0
    start, end = readme.index(START) + len(START), readme.index(END)
    README.write_text(readme[:start] + "\n" + made + "\n" + readme[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
