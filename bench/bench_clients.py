"""What one read of the inventory costs through each way of reaching sbx, side by side: the
library in-process, the library over HTTP to `sbx serve`, and the command line through
`sbx server` with the compiled launcher and with the Python one (and one-shot, for scale).

    .venv/bin/python bench/bench_clients.py [--rounds N] [--json FILE]

It answers whether the compiled launcher still earns its place beside the library and the
service (docs/server.md): the target is that it saves at least 5 ms a command over the Python
launcher. 20 stub sandboxes are in the inventory; rounds are interleaved. Exit 0 whatever the
figures.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from pathlib import Path

import common
from common import BenchContext, median, ms, print_table

SEED = 20
TARGET_SAVED_S = 0.005


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def seed(home: Path) -> None:
    import sandboxer
    from sandboxer.core.rules.profiles import Profile

    with sandboxer.Sandboxer(home=home, actor="sbx-bench") as sbx:
        for _ in range(SEED):
            sbx.create(Profile(name="stubby", backend="stub"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    meta = common.preflight()
    ctx = BenchContext("sbx-bench-clients-")
    common.print_banner("clients", ctx, meta)
    started = time.perf_counter()
    home = ctx.home("clients")
    env = ctx.sbx_env(home)
    seed(home)
    python_launcher = [sys.executable, "-m", "sandboxer_tui.server.launcher"]
    key = ctx.run_sbx(env, "api-keys", "create", "--scope", "read", "--owner", "bench")[1]
    token = key.stdout.split()[-1]
    port = free_port()
    serve = subprocess.Popen([*ctx.sbx, "serve", "--listen", f"127.0.0.1:{port}",
                              "--reap-every", "1h"], env=env, cwd=ctx.tmp,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times: dict[str, list[float]] = {k: [] for k in (
        "library", "http", "cli_compiled", "cli_python", "cli_one_shot")}
    try:
        import sandboxer

        local = sandboxer.Sandboxer(home=home)
        remote = sandboxer.Sandboxer(url=f"http://127.0.0.1:{port}", token=token)
        deadline = time.monotonic() + 60
        while True:
            try:
                assert len(remote.list()) == SEED
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        ctx.run_sbx(env, "server", "start")
        for _ in range(args.rounds):
            t = time.perf_counter()
            assert len(local.list()) == SEED
            times["library"].append(time.perf_counter() - t)
            t = time.perf_counter()
            assert len(remote.list()) == SEED
            times["http"].append(time.perf_counter() - t)
            ctx.settle(env)
            times["cli_compiled"].append(ctx.run_sbx(env, "ls", "--json")[0])
            ctx.settle(env)
            times["cli_python"].append(ctx.run([*python_launcher, "ls", "--json"], env=env,
                                               cwd=ctx.tmp)[0])
            times["cli_one_shot"].append(ctx.run_sbx({**env, "SBX_NO_SERVER": "1"}, "ls",
                                                     "--json")[0])
        local.close()
        remote.close()
    finally:
        ctx.run_sbx(env, "server", "stop", check=False)
        serve.terminate()
        serve.wait(30)
        ctx.cleanup()
    medians = {k: median(v) for k, v in times.items()}
    print_table(["one read of 20 sandboxes", "median"],
                [[k, ms(v)] for k, v in medians.items()], title=f"{args.rounds} rounds")
    saved = medians["cli_python"] - medians["cli_compiled"]
    summary = [("the compiled launcher saves per command, against the Python one (with sbx "
                "server)", -saved, -TARGET_SAVED_S, ms(saved), f">= {ms(TARGET_SAVED_S)}")]
    info = [[f"{k} (median)", ms(v), "", ""] for k, v in medians.items()]
    common.finish({"meta": meta, "times": times, "medians": medians}, summary, info,
                  run_id=ctx.run_id, started=started, json_path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
