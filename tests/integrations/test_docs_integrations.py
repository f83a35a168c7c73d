"""Every Python example in docs/integrations.md runs, as written, against the real engine in
a fresh SBX_HOME, prints what its comments say, and leaves nothing running."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, containers_of, install_id_of, remove_test_containers

pytestmark = pytest.mark.docker

EXAMPLES = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "integrations.md").read_text(),
                      re.S)


def test_each_framework_has_an_example():
    assert any("integrations.deepagents" in example for example in EXAMPLES)
    assert any("integrations.openai_agents" in example for example in EXAMPLES)
    assert any("resolve_exposed_port" in example for example in EXAMPLES)


def said(example: str) -> list[str]:
    """What the example's `# ...` comments after print() say it prints, line by line."""
    return [line.split("#", 1)[1].strip() for line in example.splitlines()
            if line.strip().startswith("print(") and "#" in line]


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_example_runs_prints_what_it_says_and_leaves_nothing(index, sbx, docker_api,
                                                             tmp_path: Path):
    script = tmp_path / f"example{index}.py"
    script.write_text(EXAMPLES[index])
    try:
        done = subprocess.run([sys.executable, str(script)], env=sbx.env(), cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
        printed = done.stdout.splitlines()
        expected = said(EXAMPLES[index])
        assert len(printed) == len(expected), done.stdout
        for line, comment in zip(printed, expected, strict=True):
            # a host port the engine picked is the one thing that differs from run to run
            pattern = re.escape(comment).replace("49153", r"\d+")
            assert re.fullmatch(pattern, line), (line, comment)
        install = install_id_of(sbx.home)
        assert install is None or containers_of(docker_api, install) == []
    finally:
        remove_test_containers(sbx.home)
