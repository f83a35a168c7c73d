"""A tool call through MCP against the same operation through the REST route, on one real
`sbx serve`, the same key and the same sandbox, on the real local Docker engine.

    .venv/bin/python bench/bench_mcp.py [--rounds N] [--json FILE]

A real `sbx serve --listen 127.0.0.1:PORT --reap-every 0` process (its own SBX_HOME, a write
key made with `sbx api-keys create`) holds one sandbox of the `default` profile (network
none). Each round runs `true` in it twice, in an order alternated each round:

- MCP: the SDK's own client (`mcp.Client` over streamable HTTP, one session kept open, the key
  as its Bearer header) calling the `exec` tool with `command=["true"]`;
- REST: httpx (one connection pool kept open, the same key) doing
  `POST /v1/sandboxes/{id}/exec` with `{"argv": ["true"]}`.

Each sample is the wall time from the call to the decoded answer, in this process. Target: MCP
/ REST ratio of medians <= 1.3 (issue 33); a bootstrap 90% interval beside it. The first 5
rounds are a warm-up. The sandbox is destroyed through sbx, and anything still carrying the
run's label is removed by id. Never prunes. Exit 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import common
from bench_service import Context
from common import median, ms, ratio_interval

TARGET_RATIO = 1.3
PROFILE = "default"
WARMUP = 5


async def bench_exec(ctx: Context, url: str, token: str, rounds: int) -> dict[str, Any]:
    import httpx
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.types import Implementation

    import sandboxer

    headers = {"Authorization": f"Bearer {token}"}
    times: dict[str, list[float]] = {"mcp": [], "rest": []}
    async with sandboxer.AsyncSandboxer(url=url, token=token) as remote:
        box = await remote.create(PROFILE, ttl="30m", labels=ctx.labels)
        try:
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as rest, \
                    httpx2.AsyncClient(headers=headers, timeout=60) as session:
                transport = streamable_http_client(f"{url}/mcp", http_client=session)
                async with Client(transport, client_info=Implementation(
                        name="bench-mcp", version="1")) as mcp:
                    protocol = mcp.protocol_version

                    async def via_mcp() -> float:
                        started = time.perf_counter()
                        result = await mcp.call_tool("exec", {"sandbox": box.id,
                                                              "command": ["true"]})
                        elapsed = time.perf_counter() - started
                        if result.is_error or result.structured_content["exit_code"] != 0:
                            raise RuntimeError(f"MCP exec failed: {result.content}")
                        return elapsed

                    async def via_rest() -> float:
                        started = time.perf_counter()
                        answer = await rest.post(f"/v1/sandboxes/{box.id}/exec",
                                                 json={"argv": ["true"]})
                        doc = answer.json()
                        elapsed = time.perf_counter() - started
                        if answer.status_code != 200 or doc["exit_code"] != 0:
                            raise RuntimeError(f"REST exec failed: {answer.text}")
                        return elapsed

                    arms = {"mcp": via_mcp, "rest": via_rest}
                    names = list(arms)
                    for i in range(WARMUP + rounds):
                        for name in (names if i % 2 == 0 else names[::-1]):
                            elapsed = await arms[name]()
                            if i >= WARMUP:
                                times[name].append(elapsed)
        finally:
            await box.destroy()
    result: dict[str, Any] = {name: {"samples_s": v, "median_s": median(v)}
                              for name, v in times.items()}
    result["ratio"] = result["mcp"]["median_s"] / result["rest"]["median_s"]
    result["mcp_adds_s"] = result["mcp"]["median_s"] - result["rest"]["median_s"]
    result["ratio_interval"] = ratio_interval(times["mcp"], times["rest"])
    result["protocol"] = protocol
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100, help="exec rounds (each arm)")
    parser.add_argument("--json", dest="json_path", metavar="FILE")
    args = parser.parse_args()
    started = time.perf_counter()
    meta = common.preflight()
    ctx = Context(prefix="sbx-bench-mcp-")
    common.print_banner("mcp", ctx, meta)
    results: dict[str, Any] = {"meta": meta, "run_id": ctx.run_id,
                               "args": {k: v for k, v in vars(args).items() if k != "json_path"}}
    try:
        _, url, token = ctx.served_home()
        ex = results["exec"] = asyncio.run(bench_exec(ctx, url, token, args.rounds))
    finally:
        ctx.cleanup()
        common.print_notes(ctx)
    summary = [("exec `true`: MCP tool call / REST route (same key, one run)", ex["ratio"],
                TARGET_RATIO, "{:.3f} (90% interval {:.3f}-{:.3f})".format(
                    ex["ratio"], *ex["ratio_interval"]), f"<= {TARGET_RATIO}")]
    info = [["exec `true` through /mcp (median)", ms(ex["mcp"]["median_s"]), "-", "info"],
            ["exec `true` through POST /v1/sandboxes/{id}/exec (median)",
             ms(ex["rest"]["median_s"]), "-", "info"],
            ["what MCP adds (median)", ms(ex["mcp_adds_s"]), "-", "info"],
            ["MCP protocol revision negotiated", ex["protocol"], "-", "info"]]
    common.finish(results, summary, info, run_id=ctx.run_id, started=started,
                  json_path=args.json_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
