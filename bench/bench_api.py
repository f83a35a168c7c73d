"""The library against docker-py, in one process, on the real local Docker engine.

    .venv/bin/python bench/bench_api.py [--rounds N] [--json FILE]

Three measurements, rounds interleaved so drift cancels, in ABBA order (sbx first in one
round, docker-py in the next) so what one arm leaves the engine to tidy falls on both alike.
Each ratio comes with a bootstrap 90% interval: how far it could move run to run.

1. `AsyncSandboxer.create("default")` + `Sandbox.destroy()` against docker-py's
   `containers.run(detach=True)` + `remove(force=True)` with the same image, command and
   limits as the default profile. Target: ratio of medians <= 1.03.
2. `Sandbox.exec(["true"])` against docker-py's `exec_run("true")` on a running container
   each; after each exec an untimed `refresh()`, which the core takes only once the exec's
   record (written just after its answer) is done, so that lands in neither arm. Target:
   <= 1.05.
3. 20 creates at once through one AsyncSandboxer (asyncio.gather) against 20 docker-py
   creates in 20 threads, each followed by removing them all (untimed). Target: <= 1.10.

sbx keeps its state in a temporary SBX_HOME; every container carries `sbx-bench=<runid>` and
only this run's containers are removed, by id. Exit status 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import sys
import time
from typing import Any

import common
from common import BenchContext, median, ms, print_table, ratio_interval

TARGETS = {"create_destroy": 1.03, "exec": 1.05, "concurrent_create": 1.10}
CONCURRENCY = 20
CONCURRENT_ROUNDS = 8


def docker_spec(ctx: BenchContext) -> dict[str, Any]:
    """docker-py's `containers.run` arguments for what the default profile makes."""
    from adapters.docker import KEEPALIVE

    return dict(image=common.IMAGE, command=KEEPALIVE, detach=True, network_mode="none",
                cap_drop=["ALL"], security_opt=["no-new-privileges"], mem_limit=512 * 1024**2,
                memswap_limit=512 * 1024**2, nano_cpus=10**9, pids_limit=256,
                labels=dict(ctx.labels))


async def run(rounds: int, ctx: BenchContext) -> dict[str, Any]:
    import docker

    import sandboxer

    client = docker.from_env(version="auto", max_pool_size=2 * CONCURRENCY)
    spec = docker_spec(ctx)
    pool = concurrent.futures.ThreadPoolExecutor(CONCURRENCY)
    times: dict[str, list[float]] = {k: [] for k in (
        "sbx_create_destroy", "docker_create_destroy", "sbx_exec", "docker_exec",
        "sbx_concurrent", "docker_concurrent")}

    def docker_run() -> Any:
        container = client.containers.run(**spec)
        ctx.containers.add(container.id)
        return container

    def docker_remove(container) -> None:
        container.remove(force=True)
        ctx.containers.discard(container.id)

    async with sandboxer.AsyncSandboxer(home=ctx.home("api"), actor="sbx-bench") as sbx:
        # warm both paths once (the base image's layers, the database's first migration)
        box = await sbx.create("default", labels=ctx.labels)
        await box.destroy()
        docker_remove(docker_run())

        box = await sbx.create("default", labels=ctx.labels)  # for exec
        peer = docker_run()
        async def sbx_create_destroy() -> None:
            started = time.perf_counter()
            made = await sbx.create("default", labels=ctx.labels)
            await made.destroy()
            times["sbx_create_destroy"].append(time.perf_counter() - started)

        async def docker_create_destroy() -> None:
            started = time.perf_counter()
            docker_remove(docker_run())
            times["docker_create_destroy"].append(time.perf_counter() - started)

        async def sbx_exec() -> None:
            started = time.perf_counter()
            result = await box.exec(["true"])
            times["sbx_exec"].append(time.perf_counter() - started)
            assert result.exit_code == 0, result
            # untimed: the exec's record, written just after its answer, is done before
            # the core takes this call, so it lands in neither arm's time
            await box.refresh()

        async def docker_exec() -> None:
            started = time.perf_counter()
            code, _ = peer.exec_run("true")
            times["docker_exec"].append(time.perf_counter() - started)
            assert code == 0

        for round_ in range(rounds):
            # ABBA: each arm goes first in every other round, so what one leaves behind
            # (the engine still tidying a removed container) falls on both alike
            first, second = ((sbx_create_destroy, docker_create_destroy) if round_ % 2 == 0
                             else (docker_create_destroy, sbx_create_destroy))
            await first()
            await second()
            for _ in range(3):
                first, second = ((sbx_exec, docker_exec) if round_ % 2 == 0
                                 else (docker_exec, sbx_exec))
                await first()
                await second()

        for _ in range(CONCURRENT_ROUNDS):
            started = time.perf_counter()
            boxes = await asyncio.gather(*(sbx.create("default", labels=ctx.labels)
                                           for _ in range(CONCURRENCY)))
            times["sbx_concurrent"].append(time.perf_counter() - started)
            await asyncio.gather(*(b.destroy() for b in boxes))

            started = time.perf_counter()
            containers = list(pool.map(lambda _: docker_run(), range(CONCURRENCY)))
            times["docker_concurrent"].append(time.perf_counter() - started)
            list(pool.map(docker_remove, containers))

        await box.destroy()
        docker_remove(peer)
    pool.shutdown()
    client.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # a create + destroy spreads by about 8% from one to the next on this engine: at 60
    # rounds the ratio of medians still moves by about +-3% (the interval printed says how far)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    meta = common.preflight()
    ctx = BenchContext("sbx-bench-api-")
    common.print_banner("api", ctx, meta)
    started = time.perf_counter()
    try:
        times = asyncio.run(run(args.rounds, ctx))
    finally:
        ctx.cleanup()
        common.print_notes(ctx)
    pairs = {"create_destroy": ("sbx_create_destroy", "docker_create_destroy"),
             "exec": ("sbx_exec", "docker_exec"),
             "concurrent_create": ("sbx_concurrent", "docker_concurrent")}
    rows, summary = [], []
    intervals = {}
    for key, (ours, theirs) in pairs.items():
        a, b = median(times[ours]), median(times[theirs])
        ratio = a / b
        low, high = intervals[key] = ratio_interval(times[ours], times[theirs])
        rows.append([key, ms(a), ms(b), f"{ratio:.3f}", f"{low:.3f}-{high:.3f}",
                     f"<= {TARGETS[key]}"])
        summary.append((f"{key}: sbx API / docker-py", ratio, TARGETS[key], f"{ratio:.3f}",
                        f"<= {TARGETS[key]}"))
    print_table(["measurement", "sbx (median)", "docker-py (median)", "ratio",
                 "90% interval", "target"], rows,
                title=f"{args.rounds} interleaved rounds (ABBA)")
    results = {"meta": meta, "rounds": args.rounds, "times": times,
               "medians": {k: median(v) for k, v in times.items()},
               "intervals": intervals}
    common.finish(results, summary, [], run_id=ctx.run_id, started=started,
                  json_path=args.json)


if __name__ == "__main__":
    sys.exit(main())
