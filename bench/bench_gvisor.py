"""gVisor benchmark for sbx: what `isolation: gvisor` costs against the default container (runc),
side by side in one run on the real local Docker engine (`make gvisor` registers runsc).

    .venv/bin/python bench/bench_gvisor.py [--rounds N] [--json FILE]

Three measurements, each through the library in this process (no CLI start-up in the figures),
rounds interleaved (runc then gVisor, the order alternated each round) to cancel drift:

1. lifecycle: create + exec `true` + destroy of one sandbox of the profile.
2. CPU-bound exec: a busybox shell loop of 200,000 additions (almost no system calls), in a
   sandbox made once per isolation.
3. syscall-heavy exec: `dd bs=1 count=40000` from /dev/zero to /dev/null (80,000 read/write
   calls), in the same sandboxes.

Printed as the median under gVisor over the median under runc, with a bootstrap interval.
The targets say what we accept for the sandbox gVisor gives (docs/security.md, "Isolation
levels"): a CPU-bound program at most 1.5x, create + exec + destroy at most 3x, and
system calls, which gVisor's kernel serves itself (on the ptrace platform here, each a round
trip through the host), at most 40x. Every container carries `sbx-bench=<runid>` and is
removed by id. Exit 0 whatever the figures; non-zero only when something crashed.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import common
from common import BenchContext, median, ms, print_table, ratio_interval

ISOLATIONS = ("container", "gvisor")
TARGETS = {"lifecycle": 3.0, "cpu": 1.5, "syscalls": 40.0}
CPU_LOOP = ["sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"]
SYSCALLS = ["dd", "if=/dev/zero", "of=/dev/null", "bs=1", "count=40000"]
WHAT = {"lifecycle": "create + exec true + destroy", "cpu": "CPU-bound exec (sh loop)",
        "syscalls": "syscall-heavy exec (dd bs=1)"}


def measure(ctx: BenchContext, rounds: int) -> dict[str, dict[str, list[float]]]:
    from sandboxer import Sandboxer

    times: dict[str, dict[str, list[float]]] = {k: {i: [] for i in ISOLATIONS} for k in TARGETS}
    home = ctx.home("home")
    with ctx.in_process(home), Sandboxer(home) as sbx:
        profiles = {i: sbx.check_profile({"name": f"bench-{i}", "backend": "docker",
                                          "isolation": i}) for i in ISOLATIONS}
        kept = {}
        try:
            for isolation in ISOLATIONS:  # the long-lived ones, for the two execs
                kept[isolation] = sbx.create(profiles[isolation], labels=ctx.labels)
                kept[isolation].exec(["true"])  # warm: the first exec is not what is measured
            for n in range(rounds):
                order = ISOLATIONS if n % 2 == 0 else ISOLATIONS[::-1]
                for isolation in order:
                    started = time.perf_counter()
                    box = sbx.create(profiles[isolation], labels=ctx.labels)
                    ctx.containers.add(box.backend_ref or "")
                    assert box.exec(["true"]).exit_code == 0
                    box.destroy()
                    times["lifecycle"][isolation].append(time.perf_counter() - started)
                for isolation in order:
                    for key, argv in (("cpu", CPU_LOOP), ("syscalls", SYSCALLS)):
                        started = time.perf_counter()
                        result = kept[isolation].exec(argv, timeout="5m")
                        times[key][isolation].append(time.perf_counter() - started)
                        assert result.exit_code == 0, result.stderr
                print(f"round {n + 1}/{rounds} done", flush=True)
        finally:
            for box in kept.values():
                box.destroy()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    ctx = BenchContext("sbx-bench-gvisor-")
    meta = common.preflight()
    common.print_banner("gvisor", ctx, meta)
    started = time.perf_counter()
    try:
        times = measure(ctx, args.rounds)
    finally:
        ctx.cleanup()
        common.print_notes(ctx)
    rows, summary = [], []
    for key, target in TARGETS.items():
        runc, gvisor = times[key]["container"], times[key]["gvisor"]
        ratio = median(gvisor) / median(runc)
        low, high = ratio_interval(gvisor, runc)
        rows.append([WHAT[key], ms(median(runc)), ms(median(gvisor)), f"{ratio:.2f}x",
                     f"{low:.2f}-{high:.2f}x"])
        summary.append((f"gVisor / runc: {WHAT[key]} (median {ms(median(gvisor))} vs "
                        f"{ms(median(runc))})", ratio, target, f"{ratio:.2f}x", f"<= {target:g}x"))
    print_table(["measurement", "runc", "gVisor", "ratio", "90% interval"], rows,
                title=f"gVisor against runc, medians of {args.rounds} rounds")
    results: dict[str, Any] = {"meta": meta, "times": {f"{k} {i}": v for k, by in times.items()
                                                       for i, v in by.items()}}
    common.finish(results, summary, [], run_id=ctx.run_id, started=started, json_path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
