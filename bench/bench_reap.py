"""Reap benchmark for sbx, against a real local Docker engine.

    .venv/bin/python bench/bench_reap.py [--rounds N] [--count N] [--idle-runs N] [--json FILE]

Two measurements in one run, each against its target:

1. Mass expiry: N (default 100) sandboxes made by `Manager.create` in-process on the docker
   backend with a 1m ttl, in a temporary SBX_HOME; then ONE `sbx reap --json` in a fresh
   process with SBX_CLOCK_OFFSET=2m, which must destroy all N. Against it: `docker rm -f` of N
   equivalent containers (same image, limits and KEEPALIVE command as adapters/docker.py) in one
   command. Rounds alternate sbx, docker (default 1 round: it is slow).
   Target: median(sbx reap) / median(docker rm -f) <= 1.3.
2. Nothing to do: `sbx reap` in a fresh process with 20 live, unexpired docker sandboxes in the
   database (median of 10, after one warm-up); `python -c pass` beside it for reference.
   Target: <= 0.3 s.

Then, for information, the most expensive imports of that idle `sbx reap`.

Every container this run makes carries `sbx-bench=<runid>`; only those are removed, by id, and
a final check removes (by id) any still carrying the run label. Never prunes. Exit status 0
whatever the figures (this is a report); non-zero only when something crashed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import common
from common import BenchContext, median, ms, print_table, secs

TARGET_RATIO = 1.2
TARGET_IDLE_S = 0.15  # for first use (bench_oneshot.py); here autostart is off: information
TIMEOUT_S = 600
CREATE_PARALLEL = 8


# -- the run's sandboxes and containers ------------------------------------------------------


class Context(BenchContext):
    def __init__(self) -> None:
        super().__init__("sbx-bench-reap-", timeout=TIMEOUT_S)


def make_sandboxes(ctx: Context, home: Path, count: int, ttl: str | None) -> tuple[list[str], float]:
    """`count` docker sandboxes in `home`'s database through Manager.create, CREATE_PARALLEL at
    a time. Returns (sandbox ids, seconds). Every container id is recorded for cleanup."""
    with ctx.in_process(home):
        from sandboxer.core.lifecycle.manager import Manager
        from sandboxer.core.rules.durations import parse_duration
        from sandboxer.core.rules.profiles import ProfileLoader

        profile = ProfileLoader().load("default")

        async def main() -> list[str]:
            mgr = Manager()
            gate = asyncio.Semaphore(CREATE_PARALLEL)

            async def one() -> str:
                async with gate:
                    row = await mgr.create(profile, ttl=parse_duration(ttl) if ttl else None,
                                           labels=ctx.labels)
                ctx.containers.add(row["backend_ref"])
                return row["id"]

            try:
                results = await asyncio.gather(*(one() for _ in range(count)),
                                               return_exceptions=True)
            finally:
                await mgr.close()
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                raise RuntimeError(f"{len(errors)} of {count} creates failed: {errors[0]}")
            return list(results)

        started = time.perf_counter()
        ids = asyncio.run(main())
        return ids, time.perf_counter() - started


def states(home: Path) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{home / 'sbx.db'}?mode=ro", uri=True)
    try:
        return dict(conn.execute("SELECT state, count(*) FROM sandboxes GROUP BY state"))
    finally:
        conn.close()


def docker_containers(ctx: Context, count: int) -> tuple[list[str], float]:
    """`count` containers equivalent to sbx's (same image, limits, command), made in parallel."""
    started = time.perf_counter()
    with ThreadPoolExecutor(CREATE_PARALLEL) as pool:
        ids = [cid for _, cid in pool.map(lambda _: ctx.docker_run(), range(count))]
    return ids, time.perf_counter() - started


# -- 1. mass expiry: one sbx reap against one docker rm -f -----------------------------------


def bench_mass(ctx: Context, rounds: int, count: int) -> dict[str, Any]:
    samples: list[dict[str, Any]] = []
    for r in range(rounds):
        home = ctx.home(f"mass-home-{r}")
        ids, made_s = make_sandboxes(ctx, home, count, "1m")
        refs = set(ctx.containers)
        reap_s, proc = ctx.run_sbx(ctx.sbx_env(home, SBX_CLOCK_OFFSET="2m"), "reap", "--json")
        report = json.loads(proc.stdout)
        left = ctx.still_present(refs)
        if sorted(report["destroyed"]) != sorted(ids) or report["failed"] or left:
            raise RuntimeError(f"sbx reap destroyed {len(report['destroyed'])} of {count}; "
                               f"failed {report['failed'][:3]}; {len(left)} container(s) left")
        if states(home) != {"destroyed": count}:
            raise RuntimeError(f"after sbx reap the database holds {states(home)}")
        ctx.containers -= refs

        cids, dmade_s = docker_containers(ctx, count)
        rm_s, _ = ctx.run(["docker", "rm", "-f", *cids])
        left = ctx.still_present(set(cids))
        if left:
            raise RuntimeError(f"docker rm -f left {len(left)} container(s)")
        ctx.containers -= set(cids)
        samples.append({"sbx_reap_s": reap_s, "docker_rm_s": rm_s, "sbx_create_all_s": made_s,
                        "docker_run_all_s": dmade_s})
        print(f"   round {r + 1}/{rounds}: made {count} sbx sandboxes in {made_s:.1f} s and "
              f"{count} containers in {dmade_s:.1f} s; sbx reap {reap_s:.2f} s, "
              f"docker rm -f {rm_s:.2f} s", flush=True)

    reap = median([s["sbx_reap_s"] for s in samples])
    rm = median([s["docker_rm_s"] for s in samples])
    result = {"rounds": rounds, "count": count, "samples": samples,
              "sbx_reap_median_s": reap, "docker_rm_median_s": rm, "ratio": reap / rm}
    print_table(
        ["command", "median", f"per sandbox ({count})"],
        [[f"sbx reap (fresh process, SBX_CLOCK_OFFSET=2m): destroys {count}", secs(reap),
          ms(reap / count)],
         [f"docker rm -f <{count} ids> (one command)", secs(rm), ms(rm / count)],
         ["ratio sbx / docker", f"{reap / rm:.2f}", f"target <= {TARGET_RATIO}"]],
        title=f"1. Mass expiry: {count} sandboxes past a 1m ttl ({rounds} round(s))",
    )
    return result


# -- 2. a reap with nothing to do --------------------------------------------------------------


def bench_idle(ctx: Context, runs: int, live: int) -> dict[str, Any]:
    home = ctx.home("idle-home")
    ids, made_s = make_sandboxes(ctx, home, live, None)  # the profile's 30m default
    env = ctx.sbx_env(home)
    ctx.run_sbx(env, "reap")  # warm-up, not counted
    reap, pypass, version = [], [], []
    for _ in range(runs):
        t, proc = ctx.run_sbx(env, "reap")
        if proc.stdout.strip() or proc.stderr.strip():
            raise RuntimeError(f"sbx reap with nothing to do said something: "
                               f"{(proc.stdout + proc.stderr).strip()[:300]}")
        reap.append(t)
        pypass.append(ctx.python_pass_s())
        version.append(ctx.run_sbx(env, "--version")[0])
    if states(home) != {"running": live}:
        raise RuntimeError(f"an idle reap changed the database: {states(home)}")
    _, dry = ctx.run_sbx(env, "reap", "--dry-run", "--json")
    planned = json.loads(dry.stdout).get("planned", [])
    result = {"live": live, "runs": runs, "sbx_reap_s": reap, "python_pass_s": pypass,
              "sbx_version_s": version, "made_s": made_s, "planned": planned,
              "median": {"sbx_reap": median(reap), "python_pass": median(pypass),
                         "sbx_version": median(version)},
              "home": home}
    m = result["median"]
    print_table(
        ["command", "median", "min", "max"],
        [[f"sbx reap, nothing to do ({live} live docker sandboxes)", secs(m["sbx_reap"]),
          secs(min(reap)), secs(max(reap))],
         ["sbx --version", secs(m["sbx_version"]), secs(min(version)), secs(max(version))],
         ["python -c pass", secs(m["python_pass"]), secs(min(pypass)), secs(max(pypass))]],
        title=f"2. sbx reap with nothing to do ({runs} fresh processes each)",
    )
    print(f"   target: <= {TARGET_IDLE_S} s; `sbx reap --dry-run` plans {len(planned)} action(s)")
    return result


def import_profile(ctx: Context, home: Path, top: int = 8) -> dict[str, Any]:
    """Where an idle `sbx reap` spends its imports (python -X importtime, one run)."""
    _, proc = ctx.run([sys.executable, "-X", "importtime", "-m", "sandboxer_tui.cli", "reap"],
                      env=ctx.sbx_env(home), cwd=ctx.tmp)
    entries = common.parse_importtime(proc.stderr)
    total_us = sum(e["self_us"] for e in entries)
    top_level = common.top_level_imports(entries)
    print_table(["top-level import of an idle `sbx reap` (cumulative)", "ms"],
                [[e["module"], f"{e['cumulative_us'] / 1000:.1f}"] for e in top_level[:top]],
                title=f"3. Imports of an idle `sbx reap` ({len(entries)} modules, "
                      f"{total_us / 1000:.0f} ms in total; information)")
    loaded = {e["module"] for e in entries}
    heavy = [m for m in ("sqlalchemy", "alembic", "pydantic", "yaml", "docker", "requests")
             if m in loaded]
    print(f"   heavy packages loaded: {', '.join(heavy) or 'none'}")
    return {"modules": len(entries), "total_ms": total_us / 1000, "heavy": heavy,
            "top_cumulative": top_level[:top]}


# -- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of the mass-expiry measurement (default 1: it is slow)")
    parser.add_argument("--count", type=int, default=100,
                        help="sandboxes per mass-expiry round (default 100)")
    parser.add_argument("--idle-runs", type=int, default=10,
                        help="fresh `sbx reap` processes with nothing to do (default 10)")
    parser.add_argument("--idle-live", type=int, default=20,
                        help="live, unexpired sandboxes during those runs (default 20)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    for name in ("rounds", "count", "idle_runs", "idle_live"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")

    meta = common.preflight(TIMEOUT_S)
    ctx = Context()
    meta.update(run_id=ctx.run_id, label=ctx.label, sbx=" ".join(ctx.sbx), rounds=args.rounds,
                count=args.count)
    common.print_banner("reap", ctx, meta)

    started = time.perf_counter()
    results: dict[str, Any] = {"meta": meta}
    try:
        results["mass"] = bench_mass(ctx, args.rounds, args.count)
        results["idle"] = bench_idle(ctx, args.idle_runs, args.idle_live)
        results["imports"] = import_profile(ctx, results["idle"].pop("home"))
    finally:
        ctx.cleanup()
        common.print_notes(ctx)

    mass, idle = results["mass"], results["idle"]
    summary = [
        (f"sbx reap of {args.count} expired / docker rm -f of {args.count}, ratio of medians",
         mass["ratio"], TARGET_RATIO, f"{mass['ratio']:.2f}", f"<= {TARGET_RATIO}"),
    ]
    # Without a server every `sbx reap` imports docker-py to look at the engine; the target
    # (TARGET_IDLE_S) is for what a user gets by default, the server started on first use,
    # which bench_oneshot.py measures. This figure is the cost with autostart turned off.
    info = [
        [f"sbx reap with nothing to do ({args.idle_live} live), SBX_SERVER_AUTOSTART=0, median",
         secs(idle["median"]["sbx_reap"]), "", "info"],
        ["  for reference: sbx reap / docker rm -f (medians)",
         f"{secs(mass['sbx_reap_median_s'])} / {secs(mass['docker_rm_median_s'])}", "", "info"],
        ["  for reference: python -c pass / sbx --version (medians)",
         f"{secs(idle['median']['python_pass'])} / {secs(idle['median']['sbx_version'])}", "",
         "info"],
    ]
    common.finish(results, summary, info, run_id=ctx.run_id, started=started,
                  json_path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
