"""The remote-client examples of docs/service.md and docs/api.md run, as written but for the
service's address and key, against a live `sbx serve` on the real engine, and leave nothing
running."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from support import ROOT, SBX, containers_of, install_id_of

from tests.service.live import start_process, stop_process

pytestmark = pytest.mark.docker

EXAMPLES = (re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "service.md").read_text(), re.S)
            + re.findall(r"```py\n(.*?)```", (ROOT / "docs" / "api.md").read_text(), re.S))


def test_the_examples_run_against_a_live_service(sbx, docker_api, tmp_path):
    assert len(EXAMPLES) == 2
    made = sbx("api-keys", "create", "--scope", "write", "--owner", "docs")
    token = made.out.split()[-1]
    proc, url = start_process(SBX, sbx.env(), cwd=tmp_path)
    try:
        for index, example in enumerate(EXAMPLES):
            assert 'url="http://127.0.0.1:8765", token="sbxk_..."' in example
            script = tmp_path / f"example{index}.py"
            script.write_text(example.replace("http://127.0.0.1:8765", url)
                              .replace("sbxk_...", token))
            env = {**sbx.env(), "SBX_HOME": str(tmp_path / "elsewhere")}
            done = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path,
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr
            assert done.stdout.strip(), "the example printed nothing"
    finally:
        stop_process(proc)
    assert containers_of(docker_api, install_id_of(sbx.home)) == []
    assert not (tmp_path / "elsewhere" / "sbx.db").exists()
