"""Every Python example in docs/api.md runs, as written, against the real engine in a fresh
SBX_HOME, and leaves nothing running."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, containers_of, install_id_of, remove_test_containers

pytestmark = pytest.mark.docker

EXAMPLES = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "api.md").read_text(), re.S)


def test_docs_api_has_examples():
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_example_runs_and_leaves_nothing(index, sbx, docker_api, tmp_path: Path):
    script = tmp_path / f"example{index}.py"
    script.write_text(EXAMPLES[index])
    env = sbx.env()
    try:
        done = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
        assert done.stdout.strip(), "the example printed nothing"
        install = install_id_of(sbx.home)  # None: it made nothing at all
        assert install is None or containers_of(docker_api, install) == []
    finally:
        remove_test_containers(sbx.home)
