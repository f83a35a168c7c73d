"""What the fast commands load, as harlequin checks its own: each runs in a fresh process and
the modules it imported are asserted on. No dashboard, cloud SDK, service or telemetry
package; no paramiko unless the engine is ssh://; no ORM where a plain read does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import RUN_LABEL

pytestmark = pytest.mark.docker

NEVER = {"textual", "e2b", "modal", "fastapi", "starlette", "uvicorn", "opentelemetry",
         "prometheus_client", "httpx", "paramiko"}
# the agent frameworks of sandboxer.integrations (extras, docs/integrations.md)
NEVER |= {"deepagents", "langchain", "langchain_core", "langgraph", "agents", "openai"}
# the MCP SDK (`sbx mcp`, /mcp of sbx serve: docs/mcp.md) and what only it brings
NEVER |= {"mcp", "mcp_types", "httpx2", "sse_starlette"}
RUN = """
import atexit, json, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(
    name for name, module in sys.modules.items() if module is not None))))
sys.argv[0] = "sbx"
from sandboxer_tui.__main__ import main  # what `sbx` runs
main()
"""


def loaded(sbx, tmp_path: Path, *args: str) -> set[str]:
    out = tmp_path / "modules.json"
    proc = subprocess.run([sys.executable, "-c", RUN, str(out), *args], env=sbx.env(),
                          cwd=sbx.cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return {name.split(".")[0] for name in json.loads(out.read_text())}


@pytest.fixture
def box(sbx):
    return sbx.create("--ttl", "10m")


@pytest.mark.parametrize("command", ["--help", "ls", "reap", "exec", "destroy"])
def test_a_fast_command_loads_nothing_it_does_not_need(command, sbx, box, tmp_path):
    args = {"--help": ["--help"], "ls": ["ls", "--label", RUN_LABEL], "reap": ["reap"],
            "exec": ["exec", box["id"], "--", "true"],
            "destroy": ["destroy", "--yes", box["id"]]}[command]
    modules = loaded(sbx, tmp_path, *args)
    assert modules & NEVER == set()
    if command in ("--help", "ls"):
        assert {"sqlalchemy", "docker", "pydantic", "alembic"} & modules == set()
    if command == "reap":  # nothing due: the inventory is read without the ORM
        assert "sqlalchemy" not in modules and "alembic" not in modules
