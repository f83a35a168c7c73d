#!/usr/bin/env python3
"""Run the E2B Python SDK's own tests (from a copy of its public repository, e2b-dev/E2B,
brought in for the run: none of it is committed here) against sbx serve's E2B API
(docs/e2b-api.md), unchanged, and count what passed, what failed and what was refused.

    .venv/bin/python scripts/e2b_sdk_suite.py --e2b PATH/TO/E2B [TEST PATH...]

It starts a real `sbx serve --listen 127.0.0.1:PORT` on a fresh SBX_HOME, makes a write key,
points the SDK at it (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY) and runs pytest in
PATH/packages/python-sdk on the test paths given (default: the sandbox and API tests, sync
and async). A failure whose message says the feature "is not implemented by sbx's E2B API"
counts as refused (a deliberate 501), not failed. Sandboxes left are destroyed by id.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT = ["tests/sync/sandbox_sync", "tests/sync/api_sync", "tests/async/sandbox_async",
           "tests/async/api_async"]
REFUSED = "is not implemented by sbx's E2B API"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--e2b", required=True, type=Path, help="a checkout of e2b-dev/E2B")
    parser.add_argument("--json", dest="json_path", type=Path)
    parser.add_argument("paths", nargs="*", default=DEFAULT)
    args = parser.parse_args()
    sdk = args.e2b / "packages" / "python-sdk"
    work = Path(tempfile.mkdtemp(prefix="sbx-e2b-suite-"))
    env = {**os.environ, "SBX_HOME": str(work / "home"), "SBX_NO_SERVER": "1"}
    sbx = [sys.executable, "-m", "sandboxer_tui"]
    key = subprocess.run([*sbx, "api-keys", "create", "--scope", "write", "--owner",
                          "e2b-suite"], env=env, check=True, capture_output=True,
                         text=True).stdout.split()[-1]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = (work / "serve.log").open("w")
    serve = subprocess.Popen([*sbx, "serve", "--listen", f"127.0.0.1:{port}", "--reap-every",
                              "1m"], env=env, stdout=log, stderr=log)
    try:
        _wait_healthy(url, serve)
        ini = work / "pytest.ini"  # the SDK's, less its per-test timeout plugin's option,
        # its helpers' folder made absolute (the file is read from here)
        lines = [f"pythonpath = {sdk / 'tests'}\n" if line.startswith("pythonpath") else line
                 for line in (sdk / "pytest.ini").read_text().splitlines(keepends=True)
                 if not line.startswith("timeout")]
        ini.write_text("".join(lines))
        report = work / "report.xml"
        run_env = {**os.environ, "E2B_API_URL": f"{url}/e2b", "E2B_SANDBOX_URL": f"{url}/e2b",
                   "E2B_API_KEY": key}
        run_env.pop("E2B_DEBUG", None)
        run_env.pop("E2B_DOMAIN", None)
        # -P: not the checkout's own `e2b` (the cwd's) but the installed SDK, the pinned one
        subprocess.run([sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-c", str(ini), "--rootdir", str(sdk), f"--junitxml={report}",
                        *args.paths], cwd=sdk, env=run_env)
        if not report.exists():
            raise SystemExit("pytest wrote no report: its output above says why")
        counts, refused, failed = _count(report)
    finally:
        serve.terminate()
        try:
            serve.wait(30)
        except subprocess.TimeoutExpired:
            serve.kill()
        _destroy_left(sbx, env)
        log.close()
    counts["refused"] = len(refused)
    counts["failed"] -= len(refused)
    print(json.dumps(counts))
    for name in refused:
        print(f"refused: {name}")
    for line in failed:
        print(f"failed: {line}")
    if args.json_path:
        args.json_path.write_text(json.dumps({**counts, "refused_tests": refused,
                                              "failed_tests": failed}, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 0


def _wait_healthy(url: str, serve: subprocess.Popen) -> None:
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if serve.poll() is not None:
            raise SystemExit(f"sbx serve exited {serve.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("sbx serve did not answer /healthz within 60 s")


def _count(report: Path) -> tuple[dict[str, int], list[str]]:
    import xml.etree.ElementTree as ET

    counts = {"passed": 0, "failed": 0, "skipped": 0}
    refused, failed = [], []
    for case in ET.parse(report).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if case.find("skipped") is not None:
            counts["skipped"] += 1
        elif failure is not None:
            counts["failed"] += 1
            text = (failure.get("message") or "") + (failure.text or "")
            if REFUSED in re.sub(r"\s+", " ", text):
                refused.append(name)
            else:
                failed.append(f"{name}: {(failure.get('message') or '').splitlines()[0][:160]}"
                              if failure.get("message") else name)
        else:
            counts["passed"] += 1
    return counts, refused, failed


def _destroy_left(sbx: list[str], env: dict[str, str]) -> None:
    """The run's sandboxes and checkpoints (its snapshots and forks'), by id: the run's
    home is its own, so all of them are the run's."""
    for command, remove in ((["ls", "--json"], ["destroy", "--yes"]),
                            (["checkpoints", "list", "--json"], ["checkpoint", "rm"])):
        listed = subprocess.run([*sbx, *command], env=env, capture_output=True, text=True)
        try:
            ids = [b["id"] for b in json.loads(listed.stdout or "[]")]
        except json.JSONDecodeError:
            continue
        if ids:
            subprocess.run([*sbx, *remove, *ids], env=env, capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
