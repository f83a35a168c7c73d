"""The unmodified `e2b` SDK through sbx serve's E2B API (/e2b, docs/e2b-api.md) against the
sandboxer library, on one real `sbx serve`, the same key and the real local Docker engine.

    .venv/bin/python bench/bench_e2b_api.py [--rounds N] [--files-rounds N] [--json FILE]

A real `sbx serve --listen 127.0.0.1:PORT --reap-every 0` process (its own SBX_HOME, a write
key made with `sbx api-keys create`). The library arm is `sandboxer.AsyncSandboxer(url=...,
token=...)`, a client of that same service, so both arms cross the same HTTP hop and what is
measured is what the facade adds. Rounds alternate the order of the arms:

- lifecycle: create (`default` profile, network none) + run `true` + kill. SDK:
  `AsyncSandbox.create`, `commands.run("true")`, `kill()`; library: `create`, `exec(["true"])`,
  `destroy()`. Target: SDK / library ratio of medians <= 1.3 (issue 34).
- files: write then read back 10 MiB in one sandbox per arm. SDK: `files.write(path, bytes)`
  (its default, a multipart upload) then `files.read(path, format="bytes")`; library:
  `files.write`, `files.read`. Target <= 1.5.

A bootstrap 90% interval beside each ratio. The first round is a warm-up. Sandboxes are
destroyed by each round; anything still carrying the run's label is removed by id at the
end. Never prunes. Exit 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

import common
from bench_service import Context
from common import median, ms, ratio_interval

LIFECYCLE_TARGET, FILES_TARGET = 1.3, 1.5
PROFILE = "default"
WARMUP = 1
SIZE = 10 * 1024 * 1024


async def bench(ctx: Context, url: str, token: str, rounds: int, files_rounds: int,
                ) -> dict[str, Any]:
    from e2b import AsyncSandbox

    import sandboxer

    os.environ.update(E2B_API_URL=f"{url}/e2b", E2B_SANDBOX_URL=f"{url}/e2b",
                      E2B_API_KEY=token)
    payload = os.urandom(SIZE)
    times: dict[str, list[float]] = {k: [] for k in ("sdk", "lib", "sdk_files", "lib_files")}
    async with sandboxer.AsyncSandboxer(url=url, token=token) as lib:

        async def sdk_lifecycle() -> float:
            started = time.perf_counter()
            box = await AsyncSandbox.create(PROFILE, timeout=600, metadata=ctx.labels)
            result = await box.commands.run("true")
            await box.kill()
            elapsed = time.perf_counter() - started
            if result.exit_code != 0:
                raise RuntimeError(f"true exited {result.exit_code}")
            return elapsed

        async def lib_lifecycle() -> float:
            started = time.perf_counter()
            box = await lib.create(PROFILE, ttl="10m", labels=ctx.labels)
            result = await box.exec(["true"])
            await box.destroy()
            elapsed = time.perf_counter() - started
            if result.exit_code != 0:
                raise RuntimeError(f"true exited {result.exit_code}")
            return elapsed

        arms = [("sdk", sdk_lifecycle), ("lib", lib_lifecycle)]
        for i in range(WARMUP + rounds):
            for name, arm in (arms if i % 2 == 0 else arms[::-1]):
                elapsed = await arm()
                if i >= WARMUP:
                    times[name].append(elapsed)

        sdk_box = await AsyncSandbox.create(PROFILE, timeout=1800, metadata=ctx.labels)
        lib_box = await lib.create(PROFILE, ttl="30m", labels=ctx.labels)
        try:
            async def sdk_files() -> float:
                started = time.perf_counter()
                await sdk_box.files.write("/tmp/blob", payload)
                back = await sdk_box.files.read("/tmp/blob", format="bytes")
                elapsed = time.perf_counter() - started
                if bytes(back) != payload:
                    raise RuntimeError("the SDK read back other bytes")
                return elapsed

            async def lib_files() -> float:
                started = time.perf_counter()
                await lib_box.files.write("/tmp/blob", payload)
                back = await lib_box.files.read("/tmp/blob")
                elapsed = time.perf_counter() - started
                if back != payload:
                    raise RuntimeError("the library read back other bytes")
                return elapsed

            arms = [("sdk_files", sdk_files), ("lib_files", lib_files)]
            for i in range(WARMUP + files_rounds):
                for name, arm in (arms if i % 2 == 0 else arms[::-1]):
                    elapsed = await arm()
                    if i >= WARMUP:
                        times[name].append(elapsed)
        finally:
            await sdk_box.kill()
            await lib_box.destroy()
    result: dict[str, Any] = {name: {"samples_s": v, "median_s": median(v)}
                              for name, v in times.items()}
    for key, ours, theirs in (("lifecycle", "sdk", "lib"), ("files", "sdk_files",
                                                             "lib_files")):
        result[key] = {"ratio": result[ours]["median_s"] / result[theirs]["median_s"],
                       "ratio_interval": ratio_interval(times[ours], times[theirs])}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="lifecycle rounds (each arm)")
    parser.add_argument("--files-rounds", type=int, default=10,
                        help="10 MiB write+read rounds (each arm)")
    parser.add_argument("--json", dest="json_path", metavar="FILE")
    args = parser.parse_args()
    started = time.perf_counter()
    meta = common.preflight()
    ctx = Context(prefix="sbx-bench-e2b-api-")
    common.print_banner("e2b_api", ctx, meta)
    results: dict[str, Any] = {"meta": meta, "run_id": ctx.run_id,
                               "args": {k: v for k, v in vars(args).items() if k != "json_path"}}
    try:
        _, url, token = ctx.served_home()
        r = results["e2b_api"] = asyncio.run(bench(ctx, url, token, args.rounds,
                                                   args.files_rounds))
    finally:
        ctx.cleanup()
        common.print_notes(ctx)
    life, files = r["lifecycle"], r["files"]
    summary = [
        ("create + run `true` + kill: e2b SDK via /e2b / library (same service, one run)",
         life["ratio"], LIFECYCLE_TARGET, "{:.3f} (90% interval {:.3f}-{:.3f})".format(
             life["ratio"], *life["ratio_interval"]), f"<= {LIFECYCLE_TARGET}"),
        ("write + read 10 MiB: e2b SDK via /e2b / library (same service, one run)",
         files["ratio"], FILES_TARGET, "{:.3f} (90% interval {:.3f}-{:.3f})".format(
             files["ratio"], *files["ratio_interval"]), f"<= {FILES_TARGET}")]
    info = [["create + run + kill, e2b SDK (median)", ms(r["sdk"]["median_s"]), "-", "info"],
            ["create + exec + destroy, library (median)", ms(r["lib"]["median_s"]), "-",
             "info"],
            ["write + read 10 MiB, e2b SDK (median)", ms(r["sdk_files"]["median_s"]), "-",
             "info"],
            ["write + read 10 MiB, library (median)", ms(r["lib_files"]["median_s"]), "-",
             "info"]]
    common.finish(results, summary, info, run_id=ctx.run_id, started=started,
                  json_path=args.json_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
