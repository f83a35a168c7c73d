"""What a command costs with `sbx server` running: fresh `sbx` launcher processes in a new
SBX_HOME with SBX_SERVER_AUTOSTART=1 (the first command starts the server behind it and the
rest are handed to it, docs/server.md; by default none is started), against docker's own
CLI, rounds interleaved.

    .venv/bin/python bench/bench_oneshot.py [--rounds N] [--json FILE]

1. `sbx create` + `sbx destroy` against `docker run -d` + `docker rm -f` (same image and
   limits). Target: ratio of medians <= 2.
2. `sbx exec ID -- true` against `docker exec ID true`. Target: <= 1.5.
3. `sbx reap` with nothing to do, 20 live sandboxes. Target: <= 0.15 s.
Each also with SBX_NO_SERVER=1 (every command imports everything), for information, and the
very first command's cost (it runs where it was typed and starts the server).
Every container carries `sbx-bench=<runid>` and only those are removed, by id. Exit 0
whatever the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import common
from common import BenchContext, median, ms, print_table

TARGETS = {"create_destroy": 2.0, "exec": 1.5, "reap_idle_s": 0.15}
LIVE = 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    meta = common.preflight()
    ctx = BenchContext("sbx-bench-oneshot-")
    common.print_banner("one-shot", ctx, meta)
    started = time.perf_counter()
    modes = {"first use": {"SBX_SERVER_AUTOSTART": "1"}, "no server": {"SBX_NO_SERVER": "1"}}
    times: dict[str, list[float]] = {}
    first: dict[str, float] = {}
    try:
        envs = {}
        for mode, extra in modes.items():
            home = ctx.home(mode.replace(" ", "-"))
            envs[mode] = ctx.sbx_env(home, **extra)
            t, proc = ctx.run_sbx(envs[mode], "create", "--label", ctx.label, "--json")
            first[mode] = t
            ctx.containers.add(json.loads(proc.stdout)["backend_ref"])
        live = {mode: [] for mode in modes}
        for mode in modes:
            for _ in range(LIVE):
                _, proc = ctx.run_sbx(envs[mode], "create", "--label", ctx.label, "--json")
                box = json.loads(proc.stdout)
                ctx.containers.add(box["backend_ref"])
                live[mode].append(box)
        _, peer = ctx.docker_run()
        target = live["first use"][0]["id"]

        def timed(key: str, seconds: float) -> None:
            times.setdefault(key, []).append(seconds)

        for _ in range(args.rounds):
            for mode, env in envs.items():
                ctx.settle(env)
                t1, proc = ctx.run_sbx(env, "create", "--label", ctx.label, "--json")
                box = json.loads(proc.stdout)
                ctx.containers.add(box["backend_ref"])
                ctx.settle(env)
                t2, _ = ctx.run_sbx(env, "destroy", "--yes", box["id"])
                ctx.containers.discard(box["backend_ref"])
                timed(f"create_destroy {mode}", t1 + t2)
                ctx.settle(env)
                timed(f"exec {mode}", ctx.run_sbx(env, "exec", live[mode][0]["id"], "--",
                                                  "true")[0])
                ctx.settle(env)
                timed(f"reap {mode}", ctx.run_sbx(env, "reap")[0])
            t1, cid = ctx.docker_run()
            t2, _ = ctx.run(["docker", "rm", "-f", cid])
            ctx.containers.discard(cid)
            timed("create_destroy docker", t1 + t2)
            timed("exec docker", ctx.run(["docker", "exec", peer, "true"])[0])
        assert target
    finally:
        for env in envs.values():
            ctx.run_sbx(env, "server", "stop", check=False)
        ctx.cleanup()
        common.print_notes(ctx)
    medians = {k: median(v) for k, v in times.items()}
    rows, summary = [], []
    for step in ("create_destroy", "exec"):
        dock = medians[f"{step} docker"]
        for mode in modes:
            ratio = medians[f"{step} {mode}"] / dock
            rows.append([f"{step} ({mode})", ms(medians[f"{step} {mode}"]), ms(dock),
                         f"{ratio:.2f}"])
        ratio = medians[f"{step} first use"] / dock
        summary.append((f"`sbx {step.replace('_', ' + ')}` / docker's, with `sbx server` "
                        "(started on first use)", ratio, TARGETS[step], f"{ratio:.2f}", f"<= {TARGETS[step]}"))
    for mode in modes:
        rows.append([f"reap, nothing to do ({mode})", ms(medians[f"reap {mode}"]), "", ""])
    summary.append(("`sbx reap` with nothing to do (20 live), fresh process, with `sbx "
                    "server` (started on first use)", medians["reap first use"], TARGETS["reap_idle_s"],
                    f"{medians['reap first use']:.3f} s", f"<= {TARGETS['reap_idle_s']} s"))
    print_table(["command (median)", "sbx", "docker", "ratio"], rows,
                title=f"{args.rounds} interleaved rounds")
    info = [[f"the very first command ({m}): sbx create", ms(t), "", ""] for m, t in first.items()]
    info += [[f"{k} (median)", ms(v), "", ""] for k, v in medians.items() if "no server" in k]
    common.finish({"meta": meta, "times": times, "first": first, "medians": medians}, summary,
                  info, run_id=ctx.run_id, started=started, json_path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
