"""Metrics benchmark for sbx: the cost of `sbx metrics --all`, against a real local Docker engine.

    .venv/bin/python bench/bench_metrics.py [--count N] [--seconds S] [--every DUR]
                                            [--profile] [--json FILE]

1. N (default 20) running sandboxes, made by `sbx create --json` in parallel subprocesses in a
   temporary SBX_HOME (default profile: busybox keep-alive, 1 CPU, 512 MiB).
2. ONE `sbx metrics --all --json` in a fresh process with SBX_METRICS_EVERY=2s (`--every`), for
   S seconds (default 30), then SIGTERM. Its own CPU time (utime + stime of all its threads,
   from /proc/<pid>/stat; psutil is not a dependency) divided by wall time, from spawn to
   SIGTERM. Target: <= 5% of one core. The same ratio after a 5 s warm-up (imports, opening
   the streams) is shown for information.
3. What it did: samples printed and samples stored per sandbox (read from the database), the
   smallest gap between two stored samples of a sandbox (must be >= --every), and how long it
   took to exit after SIGTERM.

With --profile, `sandboxer.core.follow.sampler.follow_all` then runs in this process under cProfile for S
seconds over the same sandboxes, and the most expensive functions are printed: where the CPU
goes.

Every container this run makes carries `sbx-bench=<runid>`; cleanup destroys this run's
sandboxes (`sbx destroy --yes`), then removes by id any container still carrying the run label.
Never prunes. Exit status 0 whatever the figures (this is a report); non-zero only on a crash.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import common
from common import BenchContext, print_table

TARGET_CPU = 0.05  # of one core
TIMEOUT_S = 300
CREATE_PARALLEL = 10
WARMUP_S = 5.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Context(BenchContext):
    def __init__(self) -> None:
        super().__init__("sbx-bench-metrics-", timeout=TIMEOUT_S)
        self.sandboxes: list[str] = []  # sbx ids this run made, destroyed at cleanup

    def destroy_sandboxes(self, env: dict[str, str]) -> None:
        if not self.sandboxes:
            return
        _, proc = self.run_sbx(env, "destroy", "--yes", "--json", *self.sandboxes, check=False)
        self.notes.append(f"cleanup: sbx destroy --yes of {len(self.sandboxes)} sandbox(es): "
                          f"rc {proc.returncode}")
        if proc.returncode == 0:
            self.sandboxes.clear()


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of `pid` so far (fields 14 and 15 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields[0] is field 3 (state)


def make_sandboxes(ctx: Context, env: dict[str, str], count: int) -> float:
    """`count` sandboxes through `sbx create` in parallel subprocesses; returns the seconds."""
    def create(_: int) -> dict[str, Any]:
        _, proc = ctx.run_sbx(env, "create", "--label", ctx.label, "--json")
        return json.loads(proc.stdout)

    started = time.perf_counter()
    with ThreadPoolExecutor(CREATE_PARALLEL) as pool:
        futures = [pool.submit(create, i) for i in range(count)]
        for future in futures:
            try:
                box = future.result()
            except common.CommandFailed as exc:
                ctx.notes.append(f"create failed: {exc}")
                continue
            ctx.sandboxes.append(box["id"])
            ctx.containers.add(box["backend_ref"])
    if len(ctx.sandboxes) != count:
        raise SystemExit(f"only {len(ctx.sandboxes)} of {count} sandboxes were created")
    return time.perf_counter() - started


def follow_all_process(ctx: Context, env: dict[str, str], seconds: float) -> dict[str, Any]:
    out_path = ctx.tmp / "metrics-all.jsonl"
    with open(out_path, "w") as out, open(ctx.tmp / "metrics-all.err", "w") as err:
        spawned = time.perf_counter()
        proc = subprocess.Popen([*ctx.sbx, "metrics", "--all", "--follow", "--json"], env=env, cwd=ctx.tmp,
                                stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        try:
            time.sleep(WARMUP_S)
            warm_cpu, warm_at = cpu_seconds(proc.pid), time.perf_counter()
            time.sleep(max(0.0, seconds - WARMUP_S))
            end_cpu, end_at = cpu_seconds(proc.pid), time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                code = None
            stop_s = time.perf_counter() - end_at
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    views = [json.loads(line) for line in out_path.read_text().splitlines() if line.strip()]
    return {
        "wall_s": end_at - spawned, "cpu_s": end_cpu, "ratio": end_cpu / (end_at - spawned),
        "steady_wall_s": end_at - warm_at, "steady_cpu_s": end_cpu - warm_cpu,
        "steady_ratio": (end_cpu - warm_cpu) / (end_at - warm_at),
        "exit_code": code, "stop_s": stop_s, "views": views,
        "stderr": (ctx.tmp / "metrics-all.err").read_text()[-2000:],
    }


def stored_samples(home: Path) -> dict[str, list[str]]:
    conn = sqlite3.connect(f"{(home / 'sbx.db').resolve().as_uri()}?mode=ro", uri=True,
                           timeout=30)
    try:
        rows = conn.execute("SELECT sandbox_id, time FROM metric_samples ORDER BY time").fetchall()
    finally:
        conn.close()
    by_box: dict[str, list[str]] = {}
    for sandbox_id, moment in rows:
        by_box.setdefault(sandbox_id, []).append(moment)
    return by_box


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def smallest_gap(times: list[str]) -> float | None:
    moments = [parse_time(t) for t in times]
    gaps = [(b - a).total_seconds() for a, b in zip(moments, moments[1:], strict=False)]
    return min(gaps) if gaps else None


def profile_in_process(ctx: Context, home: Path, every: str, seconds: float,
                       top: int = 25) -> dict[str, Any]:
    """follow_all in this process under cProfile; the most expensive functions."""
    import asyncio
    import cProfile
    import io
    import pstats

    with ctx.in_process(home):
        os.environ["SBX_METRICS_EVERY"] = every
        from sandboxer.core.follow.sampler import follow_all
        from sandboxer.core.lifecycle.manager import Manager

        seen = [0]

        async def go() -> None:
            mgr = Manager()
            stop = asyncio.Event()
            asyncio.get_running_loop().call_later(seconds, stop.set)
            try:
                await follow_all(mgr, lambda view: seen.__setitem__(0, seen[0] + 1), stop)
            finally:
                await mgr.close()

        profiler = cProfile.Profile()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        profiler.enable()
        asyncio.run(go())
        profiler.disable()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    cumulative = io.StringIO()
    pstats.Stats(profiler, stream=cumulative).sort_stats("cumulative").print_stats(top)
    return {"cpu_s": cpu, "wall_s": wall, "ratio": cpu / wall, "samples": seen[0],
            "by_tottime": text.getvalue(), "by_cumulative": cumulative.getvalue()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20, help="running sandboxes (default 20)")
    parser.add_argument("--seconds", type=float, default=30,
                        help="how long `sbx metrics --all` runs (default 30)")
    parser.add_argument("--every", default="2s", help="SBX_METRICS_EVERY (default 2s)")
    parser.add_argument("--profile", action="store_true",
                        help="then profile follow_all in-process (cProfile) for as long")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.count < 1 or args.seconds <= WARMUP_S:
        parser.error(f"--count must be at least 1 and --seconds more than {WARMUP_S:g}")
    from sandboxer.core.rules.durations import parse_duration

    every_s = parse_duration(args.every, "--every").total_seconds()

    meta = common.preflight(TIMEOUT_S)
    ctx = Context()
    meta.update(run_id=ctx.run_id, label=ctx.label, sbx=" ".join(ctx.sbx), count=args.count,
                seconds=args.seconds, every=args.every)
    common.print_banner("metrics", ctx, meta)

    started = time.perf_counter()
    results: dict[str, Any] = {"meta": meta}
    home = ctx.home("metrics")
    env = ctx.sbx_env(home)
    try:
        create_s = make_sandboxes(ctx, env, args.count)
        print(f"{args.count} sandboxes created in {create_s:.1f} s", flush=True)
        run = follow_all_process(ctx, {**env, "SBX_METRICS_EVERY": args.every}, args.seconds)
        stored = stored_samples(home)
        if args.profile:
            print(f"profiling follow_all in-process for {args.seconds:g} s...", flush=True)
            results["profile"] = profile_in_process(ctx, home, args.every, args.seconds)
        ours = list(ctx.sandboxes)
    finally:
        try:
            ctx.destroy_sandboxes(env)
        finally:
            ctx.cleanup()
            common.print_notes(ctx)

    views = run.pop("views")
    printed = {sid: sum(1 for v in views if v["sandbox_id"] == sid) for sid in ours}
    with_cpu = {sid: sum(1 for v in views if v["sandbox_id"] == sid and v["cpu_pct"] is not None)
                for sid in ours}
    stored_counts = {sid: len(stored.get(sid, [])) for sid in ours}
    gaps = [g for g in (smallest_gap(stored.get(sid, [])) for sid in ours) if g is not None]
    total_stored = sum(stored_counts.values())
    results.update(create_s=create_s, run=run, printed=printed, stored=stored_counts,
                   smallest_gap_s=min(gaps) if gaps else None)

    print_table(["sandbox", "printed", "with cpu", "stored", "smallest gap"],
                [[sid, printed[sid], with_cpu[sid], stored_counts[sid],
                  f"{smallest_gap(stored.get(sid, [])) or 0:.2f} s"] for sid in ours],
                title=f"per sandbox ({args.seconds:g} s at SBX_METRICS_EVERY={args.every})")
    if run["stderr"].strip():
        print(f"\nstderr of sbx metrics --all (tail):\n{run['stderr']}")
    if "profile" in results:
        prof = results["profile"]
        print(f"\nin-process follow_all: {prof['cpu_s']:.2f} s CPU in {prof['wall_s']:.1f} s "
              f"({prof['ratio'] * 100:.1f}% of a core), {prof['samples']} samples")
        print(prof["by_tottime"])
        print(prof["by_cumulative"])

    summary = [
        (f"sbx metrics --all over {args.count} sandboxes: CPU / wall ({run['wall_s']:.0f} s)",
         run["ratio"], TARGET_CPU, f"{run['ratio'] * 100:.1f}% of a core",
         f"<= {TARGET_CPU * 100:.0f}%"),
    ]
    smallest = min(gaps) if gaps else float("nan")
    info = [
        ["  CPU seconds / wall seconds", f"{run['cpu_s']:.2f} / {run['wall_s']:.1f}", "", "info"],
        [f"  after the {WARMUP_S:g} s warm-up", f"{run['steady_ratio'] * 100:.1f}% of a core",
         "", "info"],
        ["  samples printed (with CPU), all sandboxes",
         f"{sum(printed.values())} ({sum(with_cpu.values())})", "", "info"],
        ["  samples printed per sandbox, min / max",
         f"{min(printed.values())} / {max(printed.values())}", f"~{args.seconds:g}", "info"],
        ["  samples stored, all sandboxes", total_stored, "", "info"],
        ["  samples stored per sandbox, min / max",
         f"{min(stored_counts.values())} / {max(stored_counts.values())}",
         f"<= {int(args.seconds // every_s) + 1}", "info"],
        ["  smallest gap between stored samples", f"{smallest:.2f} s", f">= {every_s:g} s",
         "ok" if gaps and smallest >= every_s else "WRONG"],
        ["  exit after SIGTERM", f"code {run['exit_code']} in {run['stop_s']:.2f} s", "",
         "ok" if run["exit_code"] == 0 else "WRONG"],
    ]
    common.finish(results, summary, info, run_id=ctx.run_id, started=started,
                  json_path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
