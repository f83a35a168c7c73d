"""Warm pool benchmark: a create that claims a warm member, against a cold create of the same
profile and against `docker run -d`, on the real local Docker engine.

    .venv/bin/python bench/bench_pool.py [--rounds N] [--json FILE]

Two measurements, rounds interleaved (warm, cold, docker, warm, cold, docker, ...):

1. Python API, in process (`sandboxer.Sandboxer`): `create("pooled")` served warm (the pool
   holds one member, made by an untimed `reap()` before the round), the same `create` served
   cold (the pool is empty right after the claim), and `docker run -d` of an equivalent
   container (same image, limits and command). Targets: median warm claim <= 20 ms, and
   <= 0.1x the median `docker run -d`.
2. CLI with `sbx server` running: `sbx create --profile pooled --json` served warm (a fresh
   process through the launcher; `sbx reap` refills the pool, untimed, before each) against
   `docker run -d`, each timed command after the server is idle (common.settle). Target:
   median warm create <= 0.3x the median `docker run -d`.

The pooled profile is the default one (busybox image, no network, the same limits) with
`pool: {size: 1}` and the run's label, so every member carries `sbx-bench=<runid>` too. What
the run made is destroyed through sbx (sandboxes, then the pool drained); anything still
carrying the label is removed by id. Never prunes. Exit 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import common
from common import BenchContext, median, ms, print_table

TARGET_CLAIM_S = 0.020
TARGET_API_RATIO = 0.1
TARGET_CLI_RATIO = 0.3
PROFILE = "pooled"


class Context(BenchContext):
    def __init__(self, rounds: int) -> None:
        super().__init__("sbx-bench-pool-")
        self.rounds = rounds
        self.servers: list[dict[str, str]] = []
        self.homes: list[Path] = []

    def write_profile(self) -> None:
        folder = self.tmp / "xdg-config" / "sandboxer" / "profiles"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{PROFILE}.yaml").write_text(
            f"extends: default\nlabels: {{sbx-bench: '{self.run_id}'}}\n"
            "pool: {size: 1, max_age: 10m}\n")

    def cleanup(self) -> None:
        for env in self.servers:
            self.run_sbx(env, "server", "stop", check=False)
        for home in self.homes:
            env = self.sbx_env(home, SBX_NO_SERVER="1")
            try:
                _, proc = self.run_sbx(env, "ls", "--json")
                ids = [b["id"] for b in json.loads(proc.stdout)]
                if ids:
                    self.run_sbx(env, "destroy", "--yes", *ids, check=False)
                self.run_sbx(env, "pool", "drain", PROFILE, check=False)
            except Exception as exc:  # keep going: the label sweep below removes the rest
                self.notes.append(f"cleanup of {home}: {exc}")
        super().cleanup()


def bench_api(ctx: Context) -> dict[str, Any]:
    """Warm claim vs cold create of the same profile vs docker run -d, in process."""
    import sandboxer

    home = ctx.home("api")
    ctx.homes.append(home)
    runs: dict[str, list[float]] = {"warm": [], "cold": [], "docker": []}
    launches: list[tuple[str, str]] = []
    with ctx.in_process(home), sandboxer.Sandboxer() as sbx:
        def one_round(counted: bool) -> None:
            sbx.reap()  # untimed: the pool holds its one member again
            started = time.perf_counter()
            warm = sbx.create(PROFILE, labels=ctx.labels)
            t_warm = time.perf_counter() - started
            started = time.perf_counter()
            cold = sbx.create(PROFILE, labels=ctx.labels)  # the pool is empty now
            t_cold = time.perf_counter() - started
            t_docker, cid = ctx.docker_run()
            launches.append((warm.launch, cold.launch))
            sbx.destroy(warm.id, cold.id)
            ctx.run(["docker", "rm", "-f", cid])
            ctx.containers.discard(cid)
            if counted:
                runs["warm"].append(t_warm)
                runs["cold"].append(t_cold)
                runs["docker"].append(t_docker)

        one_round(counted=False)  # warm-up: the database, the imports, the engine's caches
        for _ in range(ctx.rounds):
            one_round(counted=True)
        sbx.drain_pool(PROFILE)
    if any(launch != ("warm", "cold") for launch in launches):
        raise RuntimeError(f"a create was not served as intended: {launches}")
    result = {name: {"samples_s": values, "median_s": median(values)}
              for name, values in runs.items()}
    result["ratio_warm_to_docker"] = result["warm"]["median_s"] / result["docker"]["median_s"]
    result["ratio_warm_to_cold"] = result["warm"]["median_s"] / result["cold"]["median_s"]
    print_table(["Python API (median)", "warm claim", "cold create", "docker run -d"],
                [["seconds", ms(result["warm"]["median_s"]), ms(result["cold"]["median_s"]),
                  ms(result["docker"]["median_s"])],
                 ["warm as a ratio", "1", f"{result['ratio_warm_to_cold']:.3f}x",
                  f"{result['ratio_warm_to_docker']:.3f}x"]],
                title=f"1. Python API, {ctx.rounds} interleaved rounds")
    return result


def bench_cli(ctx: Context) -> dict[str, Any]:
    """`sbx create` served warm through `sbx server` vs docker run -d."""
    home = ctx.home("cli")
    ctx.homes.append(home)
    env = ctx.sbx_env(home)
    ctx.run_sbx(env, "server", "start")
    ctx.servers.append(env)
    runs: dict[str, list[float]] = {"warm": [], "docker": []}
    launches = []

    def one_round(counted: bool) -> None:
        ctx.run_sbx(env, "reap")  # untimed refill
        ctx.settle(env)
        t_warm, proc = ctx.run_sbx(env, "create", "--profile", PROFILE, "--label", ctx.label,
                                   "--json")
        box = json.loads(proc.stdout)
        launches.append(box["launch"])
        ctx.settle(env)
        t_docker, cid = ctx.docker_run()
        ctx.run_sbx(env, "destroy", "--yes", box["id"])
        ctx.run(["docker", "rm", "-f", cid])
        ctx.containers.discard(cid)
        if counted:
            runs["warm"].append(t_warm)
            runs["docker"].append(t_docker)

    one_round(counted=False)
    for _ in range(ctx.rounds):
        one_round(counted=True)
    ctx.run_sbx(env, "pool", "drain", PROFILE)
    if any(launch != "warm" for launch in launches):
        raise RuntimeError(f"a create was not served warm: {launches}")
    result = {name: {"samples_s": values, "median_s": median(values)}
              for name, values in runs.items()}
    result["ratio_warm_to_docker"] = result["warm"]["median_s"] / result["docker"]["median_s"]
    print_table(["CLI with sbx server (median)", "sbx create (warm)", "docker run -d", "ratio"],
                [["seconds", ms(result["warm"]["median_s"]), ms(result["docker"]["median_s"]),
                  f"{result['ratio_warm_to_docker']:.3f}x"]],
                title=f"2. CLI, {ctx.rounds} interleaved rounds")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    started = time.perf_counter()
    meta = common.preflight()
    ctx = Context(args.rounds)
    common.print_banner("pool", ctx, meta)
    results: dict[str, Any] = {"meta": meta, "run_id": ctx.run_id}
    try:
        ctx.write_profile()
        api = results["api"] = bench_api(ctx)
        cli = results["cli"] = bench_cli(ctx)
    finally:
        ctx.cleanup()
        common.print_notes(ctx)
    summary = [
        ("API: median warm claim", api["warm"]["median_s"], TARGET_CLAIM_S,
         ms(api["warm"]["median_s"]), "<= 20 ms"),
        ("API: warm claim / docker run -d", api["ratio_warm_to_docker"], TARGET_API_RATIO,
         f"{api['ratio_warm_to_docker']:.3f}x", "<= 0.1x"),
        ("CLI (sbx server): warm sbx create / docker run -d", cli["ratio_warm_to_docker"],
         TARGET_CLI_RATIO, f"{cli['ratio_warm_to_docker']:.3f}x", "<= 0.3x"),
    ]
    info = [["API: warm claim / cold create of the same profile",
             f"{api['ratio_warm_to_cold']:.3f}x", "-", "info"],
            ["API: cold create / docker run -d",
             f"{api['cold']['median_s'] / api['docker']['median_s']:.2f}x", "-", "info"]]
    common.finish(results, summary, info, run_id=ctx.run_id, started=started,
                  json_path=args.json_path)


if __name__ == "__main__":
    main()
