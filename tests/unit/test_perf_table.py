"""The README's performance table is the one the benchmarks' last results make
(scripts/perf_table.py), so no figure there is older than the results committed beside it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import perf_table  # noqa: E402


def test_the_readme_table_is_the_one_the_results_make():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "perf_table.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_a_new_result_changes_the_table(tmp_path: Path):
    doc = {"meta": {"time": "2026-12-01T10:00:00", "git_commit": "abc1234"},
           "summary": [{"measurement": "m", "shown": "1.02", "target_shown": "<= 1.03",
                        "pass": True}]}
    (tmp_path / "api.json").write_text(json.dumps(doc))
    first = perf_table.table(tmp_path)
    assert "| 1.02 | <= 1.03 | met |" in first
    doc["summary"][0].update(shown="1.10", **{"pass": False})
    (tmp_path / "api.json").write_text(json.dumps(doc))
    assert "| 1.10 | <= 1.03 | **missed** |" in perf_table.table(tmp_path)
    readme = f"x\n{perf_table.START}\n{first}\n{perf_table.END}\ny"
    assert perf_table.current(readme) == first != perf_table.table(tmp_path)
