"""Checkpoint benchmark for sbx, against a real local Docker engine.

    .venv/bin/python bench/bench_checkpoints.py [--rounds N] [--json FILE]

Two measurements in one run, each side by side with the plain Docker CLI doing the same work,
rounds interleaved (and the order within a round alternated) to cancel drift:

1. `sbx snapshot ID --json` against `docker commit` of the same container (the same state: a
   sandbox holding 1 MiB of random bytes), with as many `--change LABEL` lines as sbx adds.
   Target: median(sbx) / median(docker) <= 1.2.
2. `sbx restore CKPT --json` against `docker run -d` of the image `docker commit` made, with the
   same limits and command as adapters/docker.py (KEEPALIVE). Target: ratio of medians <= 1.3.

With `sbx server`, every timed command (sbx or docker) starts on an idle server, no command
of its own running (untimed wait, common.settle): sbx commands that come after a pause, and
docker commands that never share the machine with the previous command's teardown.

For context: `sbx --version` and `python -c pass` (fresh-process start-up), and the launcher
alone (pip's `sbx` script, `python -m sandboxer_tui`, `/bin/true`) against a socket that
answers at once. Every container
carries `sbx-bench=<runid>` and is removed by id; the images this run made are removed by the
tags it gave them (`sandboxer/checkpoint:<ckpt-id>-<installation digest>` for sbx,
`sbx-bench-commit:<runid>-<n>` for docker). Never prunes. Exit 0 whatever the figures; non-zero only when something crashed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import common
from common import DOCKER_LIMITS, IMAGE, BenchContext, median, ms, print_table

TARGET_SNAPSHOT = 1.2
TARGET_RESTORE = 1.3
COMMIT_REPOSITORY = "sbx-bench-commit"


class Run:
    """The run context plus the images it made (by tag) and the one sandbox it measures."""

    def __init__(self, ctx: BenchContext, mode: str) -> None:
        self.ctx = ctx
        self.mode = mode
        self.home = ctx.home(f"home-{mode}")
        self.env = (ctx.sbx_env(self.home, SBX_NO_SERVER="1") if mode == "one-shot"
                    else ctx.sbx_env(self.home))
        self.checkpoints: list[str] = []  # sbx checkpoint ids
        self.commits: list[str] = []  # docker commit tags
        self.box: dict[str, Any] = {}
        self.install = ""

    def sbx(self, *args: str) -> tuple[float, Any]:
        return self.ctx.run_sbx(self.env, *args)

    def setup(self) -> None:
        if self.mode == "resident":
            self.sbx("server", "start")
        _, proc = self.sbx("create", "--label", self.ctx.label, "--json")
        self.box = json.loads(proc.stdout)
        self.ctx.containers.add(self.box["backend_ref"])
        self.install = (self.home / "install-id").read_text().strip()
        self.sbx("exec", self.box["id"], "--", "sh", "-c",
                 "head -c 1048576 /dev/urandom > /work/state && sync")

    def snapshot(self) -> float:
        self.ctx.settle(self.env)
        elapsed, proc = self.sbx("snapshot", self.box["id"], "--json")
        self.checkpoints.append(json.loads(proc.stdout)["id"])
        return elapsed

    def commit(self) -> float:
        tag = f"{COMMIT_REPOSITORY}:{self.ctx.run_id}-{len(self.commits)}"
        self.commits.append(tag)
        changes = [f"LABEL bench.checkpoint={tag.split(':')[1]}",
                   f"LABEL bench.install={self.install}", f"LABEL bench.id={self.box['id']}"]
        argv = ["docker", "commit"] + [a for c in changes for a in ("--change", c)]
        self.ctx.settle(self.env)
        elapsed, _ = self.ctx.run([*argv, self.box["backend_ref"], tag])
        return elapsed

    def restore(self, ckpt_id: str) -> tuple[float, str]:
        self.ctx.settle(self.env)
        elapsed, proc = self.sbx("restore", ckpt_id, "--label", self.ctx.label, "--json")
        ref = json.loads(proc.stdout)["backend_ref"]
        self.ctx.containers.add(ref)
        return elapsed, ref

    def docker_run(self, image: str) -> tuple[float, str]:
        from sandboxer.adapters.docker import KEEPALIVE

        self.ctx.settle(self.env)
        elapsed, proc = self.ctx.run(["docker", "run", "-d", *DOCKER_LIMITS, "--label",
                                      self.ctx.label, image, *KEEPALIVE])
        ref = proc.stdout.split()[-1]
        self.ctx.containers.add(ref)
        return elapsed, ref

    def remove_containers(self, refs: list[str]) -> None:
        self.ctx.run(["docker", "rm", "-f", *refs])
        self.ctx.containers.difference_update(refs)

    def remove_images(self) -> None:
        """The images this run tagged, by tag; then any image still labelled with the run's
        installation id (a snapshot interrupted half-way), by id."""
        from sandboxer.adapters.docker import holder_tag

        tags = [holder_tag(c, self.install) for c in self.checkpoints] + self.commits
        if tags:
            _, proc = self.ctx.run(["docker", "rmi", *tags], check=False)
            if proc.returncode:
                self.ctx.notes.append(f"cleanup: docker rmi of {len(tags)} tag(s): "
                                      f"{proc.stderr.strip()[:300]}")
        if self.install:
            _, proc = self.ctx.run(["docker", "images", "-aq", "--filter",
                                    f"label=sbx.install={self.install}"], check=False)
            left = sorted(set(proc.stdout.split()))
            if left:
                self.ctx.run(["docker", "rmi", "-f", *left], check=False)
                self.ctx.notes.append(f"cleanup: {len(left)} leftover image(s) of this run's "
                                      f"installation removed by id")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def bench_snapshot(run: Run, rounds: int) -> dict[str, Any]:
    run.snapshot()  # warm-up: the first snapshot, the first commit
    run.commit()
    sbx_s, docker_s = [], []
    for i in range(rounds):
        pair = [("sbx", run.snapshot), ("docker", run.commit)]
        for name, fn in pair if i % 2 == 0 else reversed(pair):
            (sbx_s if name == "sbx" else docker_s).append(fn())
    result = {"sbx_s": sbx_s, "docker_s": docker_s, "median_sbx_s": median(sbx_s),
              "median_docker_s": median(docker_s)}
    result["ratio"] = ratio(result["median_sbx_s"], result["median_docker_s"])
    print_table(["operation", "median", "min", "max"],
                [["sbx snapshot ID --json", ms(median(sbx_s)), ms(min(sbx_s)), ms(max(sbx_s))],
                 ["docker commit (same container)", ms(median(docker_s)), ms(min(docker_s)),
                  ms(max(docker_s))]],
                title=f"1. snapshot vs docker commit ({rounds} rounds, interleaved): "
                      f"ratio {result['ratio']:.2f}")
    return result


def bench_restore(run: Run, rounds: int) -> dict[str, Any]:
    ckpt, image = run.checkpoints[-1], run.commits[-1]
    refs = [run.restore(ckpt)[1], run.docker_run(image)[1]]  # warm-up
    run.remove_containers(refs)
    sbx_s, docker_s = [], []
    for i in range(rounds):
        refs = []
        pair = [("sbx", lambda: run.restore(ckpt)), ("docker", lambda: run.docker_run(image))]
        for name, fn in pair if i % 2 == 0 else reversed(pair):
            elapsed, ref = fn()
            refs.append(ref)
            (sbx_s if name == "sbx" else docker_s).append(elapsed)
        run.remove_containers(refs)  # untimed: the engine holds the same load every round
    result = {"sbx_s": sbx_s, "docker_s": docker_s, "median_sbx_s": median(sbx_s),
              "median_docker_s": median(docker_s), "checkpoint": ckpt, "image": image}
    result["ratio"] = ratio(result["median_sbx_s"], result["median_docker_s"])
    print_table(["operation", "median", "min", "max"],
                [["sbx restore CKPT --json", ms(median(sbx_s)), ms(min(sbx_s)), ms(max(sbx_s))],
                 ["docker run -d (committed image, same limits)", ms(median(docker_s)),
                  ms(min(docker_s)), ms(max(docker_s))]],
                title=f"2. restore vs docker run -d ({rounds} rounds, interleaved): "
                      f"ratio {result['ratio']:.2f}")
    return result


def bench_startup(run: Run, rounds: int) -> dict[str, Any]:
    version = [run.sbx("--version")[0] for _ in range(rounds)]
    python = [run.ctx.python_pass_s() for _ in range(rounds)]
    result = {"sbx_version_s": median(version), "python_pass_s": median(python)}
    print_table(["fresh process", "median"],
                [["sbx --version", ms(result["sbx_version_s"])],
                 ["python -c pass", ms(result["python_pass_s"])]],
                title=f"3. start-up, for context ({rounds} runs)")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds per measurement (default 10)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    meta = common.preflight()
    ctx = BenchContext("sbx-bench-checkpoints-")
    meta.update(run_id=ctx.run_id, label=ctx.label, rounds=args.rounds, sbx=" ".join(ctx.sbx),
                image=IMAGE)
    common.print_banner("checkpoints", ctx, meta)
    started = time.perf_counter()
    results: dict[str, Any] = {"meta": meta}
    for mode in ("one-shot", "resident"):
        print(f"\n== sbx {mode} ({'SBX_NO_SERVER=1' if mode == 'one-shot' else 'sbx server running'})")
        run = Run(ctx, mode)
        try:
            run.setup()
            results[mode] = {"snapshot": bench_snapshot(run, args.rounds),
                             "restore": bench_restore(run, args.rounds),
                             "startup": bench_startup(run, args.rounds)}
        finally:
            if mode == "resident":
                run.sbx("server", "stop")
            left = set(ctx.containers)
            ctx.cleanup()  # containers first (by id, then by the run label), so images can go
            run.remove_images()
            common.print_notes(ctx)
            if ctx.containers:
                print(f"WARNING: not removed: {sorted(left & ctx.containers)}", file=sys.stderr)

    alone = ctx.launcher_alone(args.rounds * 3)
    results["launcher_alone_s"] = alone
    print_table(["launcher, start to exit", "median"],
                [[f"sbx ls ({meta['launcher']})", ms(alone["sbx"])],
                 ["python -m sandboxer_tui ls", ms(alone["python_launcher"])],
                 ["/bin/true", ms(alone["true"])]],
                title="4. the launcher alone, against a socket that answers at once, "
                      f"for context ({args.rounds * 3} runs)")

    snap, rest = results["resident"]["snapshot"], results["resident"]["restore"]
    summary = [
        ("sbx snapshot / docker commit, ratio of medians (sbx server)", snap["ratio"],
         TARGET_SNAPSHOT, f"{snap['ratio']:.2f}", f"<= {TARGET_SNAPSHOT}"),
        ("sbx restore / docker run -d, ratio of medians (sbx server)", rest["ratio"],
         TARGET_RESTORE, f"{rest['ratio']:.2f}", f"<= {TARGET_RESTORE}"),
    ]
    info = []
    for mode in ("one-shot", "resident"):
        snap, rest, start = (results[mode][k] for k in ("snapshot", "restore", "startup"))
        info += [
            [f"  {mode}: sbx snapshot / docker commit (medians)",
             f"{ms(snap['median_sbx_s'])} / {ms(snap['median_docker_s'])}",
             f"{snap['ratio']:.2f}", "info"],
            [f"  {mode}: sbx restore / docker run -d (medians)",
             f"{ms(rest['median_sbx_s'])} / {ms(rest['median_docker_s'])}",
             f"{rest['ratio']:.2f}", "info"],
            [f"  {mode}: sbx --version / python -c pass (medians)",
             f"{ms(start['sbx_version_s'])} / {ms(start['python_pass_s'])}", "", "info"],
        ]
    info.append([f"  launcher alone: sbx ({meta['launcher']}) / Python launcher / /bin/true",
                 f"{ms(alone['sbx'])} / {ms(alone['python_launcher'])} / {ms(alone['true'])}",
                 "", "info"])
    common.finish(results, summary, info, run_id=ctx.run_id, started=started,
                  json_path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
