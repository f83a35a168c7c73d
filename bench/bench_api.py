"""The library against docker-py, in one process, on the real local Docker engine.

    .venv/bin/python bench/bench_api.py [--rounds N] [--json FILE]

Three measurements, rounds interleaved so drift cancels, in ABBA order (sbx first in one
round, docker-py in the next) so what one arm leaves the engine to tidy falls on both alike.
Each ratio comes with a bootstrap 90% interval: how far it could move run to run. For
information, a second figure without the engine's spread: every engine call both arms make
goes through docker-py's `APIClient` (`ENGINE_CALLS`), so the time outside those calls is
each side's own; docker-py's median plus the difference of the two own times, over
docker-py's median, is the ratio with the engine's share taken as equal.

1. `AsyncSandboxer.create("default")` + `Sandbox.destroy()` against docker-py's
   `containers.run(detach=True)` + `remove(force=True)` of the container the docker adapter
   makes of the default profile (image, command, limits, restart policy, init=False).
   Target: ratio of medians <= 1.03.
2. `Sandbox.exec(["true"])` against docker-py's `exec_run("true")` on a running container
   each; sbx's time includes committing the exec's event, which exec does before it returns.
   Target: <= 1.10.
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

TARGETS = {"create_destroy": 1.03, "exec": 1.10, "concurrent_create": 1.10}
CONCURRENCY = 20
CONCURRENT_ROUNDS = 8


def docker_spec(ctx: BenchContext) -> dict[str, Any]:
    """docker-py's `containers.run` arguments for the container adapters/docker.py makes of
    the default profile: its limits, its restart policy and init=False too (as
    bench_service.py's)."""
    from sandboxer.adapters.docker import KEEPALIVE, RESTART_POLICY

    return dict(image=common.IMAGE, command=KEEPALIVE, detach=True, network_mode="none",
                cap_drop=["ALL"], security_opt=["no-new-privileges"], mem_limit=512 * 1024**2,
                memswap_limit=512 * 1024**2, nano_cpus=10**9, pids_limit=256, init=False,
                restart_policy=dict(RESTART_POLICY), labels=dict(ctx.labels))


# The engine calls both arms make through docker-py's low-level client. Time inside them is
# the engine's (and the same docker-py code's); the rest of a timed call is each side's own.
ENGINE_CALLS = ("create_container", "start", "inspect_container", "remove_container",
                "exec_create", "exec_start", "exec_inspect")


def timing_engine_calls() -> list[float]:
    """Wrap `ENGINE_CALLS` of docker-py's APIClient; the list returned holds their total time
    so far (one element; the timed calls run one at a time)."""
    import functools

    import docker

    spent = [0.0]

    def timed(method):
        @functools.wraps(method)
        def call(*args, **kwargs):
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - started
        return call

    for name in ENGINE_CALLS:
        setattr(docker.APIClient, name, timed(getattr(docker.APIClient, name)))
    return spent


async def run(rounds: int, ctx: BenchContext) -> dict[str, Any]:
    import docker

    import sandboxer

    in_engine = timing_engine_calls()

    client = docker.from_env(version="auto", max_pool_size=2 * CONCURRENCY)
    spec = docker_spec(ctx)
    pool = concurrent.futures.ThreadPoolExecutor(CONCURRENCY)
    times: dict[str, list[float]] = {k: [] for k in (
        "sbx_create_destroy", "docker_create_destroy", "sbx_exec", "docker_exec",
        "sbx_concurrent", "docker_concurrent")}
    own: dict[str, list[float]] = {k: [] for k in (  # each timed call less its engine calls
        "sbx_create_destroy", "docker_create_destroy", "sbx_exec", "docker_exec")}

    def record(arm: str, started: float, engine_before: float) -> None:
        elapsed = time.perf_counter() - started
        times[arm].append(elapsed)
        own[arm].append(elapsed - (in_engine[0] - engine_before))

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
            engine, started = in_engine[0], time.perf_counter()
            made = await sbx.create("default", labels=ctx.labels)
            await made.destroy()
            record("sbx_create_destroy", started, engine)

        async def docker_create_destroy() -> None:
            engine, started = in_engine[0], time.perf_counter()
            docker_remove(docker_run())
            record("docker_create_destroy", started, engine)

        async def sbx_exec() -> None:
            engine, started = in_engine[0], time.perf_counter()
            result = await box.exec(["true"])
            record("sbx_exec", started, engine)
            assert result.exit_code == 0, result

        async def docker_exec() -> None:
            engine, started = in_engine[0], time.perf_counter()
            code, _ = peer.exec_run("true")
            record("docker_exec", started, engine)
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
    return times, own


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
        times, own = asyncio.run(run(args.rounds, ctx))
    finally:
        ctx.cleanup()
        common.print_notes(ctx)
    pairs = {"create_destroy": ("sbx_create_destroy", "docker_create_destroy"),
             "exec": ("sbx_exec", "docker_exec"),
             "concurrent_create": ("sbx_concurrent", "docker_concurrent")}
    # Without the engine's spread: the engine's share taken as docker-py's median, each side's
    # own time (outside the engine calls) added to it.
    info, own_rows, estimates = [], [], {}
    for key in ("create_destroy", "exec"):
        ours, theirs = pairs[key]
        mine, peer = median(own[ours]), median(own[theirs])
        base = median(times[theirs])
        estimates[key] = (base + mine - peer) / base
        own_rows.append([key, ms(mine), ms(peer), ms(mine - peer), f"{estimates[key]:.3f}"])
        info.append([f"{key}: sbx's own time outside the engine calls (median)", ms(mine),
                     "-", "info"])
    rows, summary = [], []
    intervals = {}
    for key, (ours, theirs) in pairs.items():
        a, b = median(times[ours]), median(times[theirs])
        ratio = a / b
        low, high = intervals[key] = ratio_interval(times[ours], times[theirs])
        rows.append([key, ms(a), ms(b), f"{ratio:.3f}", f"{low:.3f}-{high:.3f}",
                     f"<= {TARGETS[key]}"])
        shown = f"{ratio:.3f} (90% interval {low:.3f}-{high:.3f}"
        shown += (f"; engine's spread taken out: {estimates[key]:.3f})" if key in estimates
                  else ")")
        summary.append((f"{key}: sbx API / docker-py", ratio, TARGETS[key], shown,
                        f"<= {TARGETS[key]}"))
    print_table(["measurement", "sbx (median)", "docker-py (median)", "ratio",
                 "90% interval", "target"], rows,
                title=f"{args.rounds} interleaved rounds (ABBA)")
    print_table(["measurement", "sbx own (median)", "docker-py own (median)", "sbx adds",
                 "ratio, engine's spread taken out"], own_rows,
                title="time outside the engine calls both make (docker-py's APIClient)")
    results = {"meta": meta, "rounds": args.rounds, "times": times, "own_times": own,
               "medians": {k: median(v) for k, v in times.items()},
               "intervals": intervals, "ratio_without_engine_spread": estimates}
    common.finish(results, summary, info, run_id=ctx.run_id, started=started,
                  json_path=args.json)


if __name__ == "__main__":
    sys.exit(main())
