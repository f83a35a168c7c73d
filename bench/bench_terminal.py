"""A terminal's keystroke-to-echo round trip, side by side in one run on the real local Docker
engine (docs/terminals-and-ports.md, "Terminals").

    .venv/bin/python bench/bench_terminal.py [--keys N] [--json FILE]

One byte is written to a terminal running `cat` in a sandbox, and the clock stops when the
terminal's echo of it comes back (the pseudo-terminal's own echo: what a user sees as they
type). The arms, in one run, blocks of keys interleaved (ABCD, DCBA, ...):
- through `sbx serve` (`AsyncSandboxer(url=)`, the service's WebSocket `/v1/sandboxes/{ref}/pty`);
- the library in process (`AsyncSandboxer(home=)`);
- `docker exec -it CID cat` on a local pseudo-terminal (what a user types into today);
- docker-py's exec socket (`exec_create(tty=True, stdin=True)`, `exec_start(socket=True)`).
Target: p50 through the service <= 20 ms on loopback; ratios to `docker exec -it` printed.

sbx keeps its state in a temporary SBX_HOME; every container carries `sbx-bench=<runid>` and
only this run's are removed, by id. Exit status 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pty
import select
import subprocess
import sys
import time
import tty
from typing import Any

import common
from bench_service import Context as ServiceContext
from common import median, ms, print_table, ratio_interval

TARGETS = {"service_p50_ms": 20.0}
BLOCK = 25  # keys per arm before the next arm's turn
KEYS = b"abcdefghijklmnopqrstuvwxyz"  # each key another letter: an echo is matched to its key


class Context(ServiceContext):
    def __init__(self) -> None:
        super().__init__("sbx-bench-terminal-")


def quantile(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class LibraryArm:
    """A terminal of the library (in process, or through the service)."""

    def __init__(self, term) -> None:
        self.term = term

    async def key(self, key: bytes) -> float:
        started = time.perf_counter()
        await self.term.write(key)
        while key not in await self.term.read():
            pass
        return time.perf_counter() - started


class DockerExecIt:
    """`docker exec -it CID cat` with its terminal on a local pseudo-terminal."""

    def __init__(self, cid: str) -> None:
        self.master, slave = pty.openpty()
        tty.setraw(self.master)
        self.proc = subprocess.Popen(["docker", "exec", "-it", cid, "cat"], stdin=slave,
                                     stdout=slave, stderr=slave, start_new_session=True)
        os.close(slave)

    def key_blocking(self, key: bytes) -> float:
        started = time.perf_counter()
        os.write(self.master, key)
        while True:
            select.select([self.master], [], [], 30)
            if key in os.read(self.master, 4096):
                return time.perf_counter() - started

    async def key(self, key: bytes) -> float:
        return self.key_blocking(key)  # on the loop's thread: no hop to count

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        os.close(self.master)


class DockerPySocket:
    """docker-py's exec with a TTY, on its hijacked socket."""

    def __init__(self, api, cid: str) -> None:
        exec_id = api.exec_create(cid, ["cat"], stdin=True, tty=True)["Id"]
        self.sock = api.exec_start(exec_id, socket=True, tty=True)
        self.raw = self.sock._sock

    async def key(self, key: bytes) -> float:
        started = time.perf_counter()
        self.raw.sendall(key)
        while True:
            select.select([self.raw], [], [], 30)
            if key in self.raw.recv(4096):
                return time.perf_counter() - started

    def close(self) -> None:
        self.sock.close()


async def bench(ctx: Context, keys: int, home, url: str, token: str) -> dict[str, Any]:
    import docker

    import sandboxer

    api = docker.APIClient(version="auto", timeout=120)
    _, cid = ctx.docker_run()
    times: dict[str, list[float]] = {k: [] for k in ("service", "library", "docker_exec_it",
                                                    "docker_py")}
    async with sandboxer.AsyncSandboxer(home=home, actor="sbx-bench") as local, \
            sandboxer.AsyncSandboxer(url=url, token=token) as remote:
        remote_box = await remote.create("default", labels=ctx.labels)
        ctx.containers.add(remote_box.backend_ref)
        local_box = await local.create("default", labels=ctx.labels)
        ctx.containers.add(local_box.backend_ref)
        served = await remote_box.pty(["cat"])
        in_process = await local_box.pty(["cat"])
        exec_it = DockerExecIt(cid)
        docker_py = DockerPySocket(api, cid)
        arms = {"service": LibraryArm(served), "library": LibraryArm(in_process),
                "docker_exec_it": exec_it, "docker_py": docker_py}
        try:
            typed = 0

            def next_key() -> bytes:
                nonlocal typed
                typed += 1
                return KEYS[typed % len(KEYS):typed % len(KEYS) + 1]

            for arm in arms.values():  # warm-up, untimed (the first key waits for `cat`)
                for _ in range(10):
                    await asyncio.wait_for(arm.key(next_key()), 60)
            order = list(arms)
            for n in range(max(1, keys // BLOCK)):
                for name in (order if n % 2 == 0 else order[::-1]):
                    for _ in range(BLOCK):
                        times[name].append(await asyncio.wait_for(
                            arms[name].key(next_key()), 60))
        finally:
            exec_it.close()
            docker_py.close()
            for term in (served, in_process):
                await term.close()
        await remote_box.destroy()
        await local_box.destroy()
    return {"times": times}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=500, help="keystrokes per arm")
    parser.add_argument("--json")
    args = parser.parse_args()
    meta = common.preflight()
    ctx = Context()
    common.print_banner("terminal", ctx, meta)
    started = time.perf_counter()
    try:
        home = ctx.home("served")
        url, token = ctx.serve(home, "write")
        result = asyncio.run(bench(ctx, args.keys, home, url, token))
    finally:
        ctx.cleanup()
        common.print_notes(ctx)
    t = result["times"]
    peer = t["docker_exec_it"]
    rows = []
    labels = {"service": "through sbx serve (WebSocket)", "library": "library, in process",
              "docker_exec_it": "docker exec -it (a local pty)",
              "docker_py": "docker-py exec socket (tty)"}
    for name, values in t.items():
        low, high = ratio_interval(values, peer)
        rows.append([labels[name], len(values), ms(median(values)), ms(quantile(values, 0.99)),
                     f"{median(values) / median(peer):.2f}", f"{low:.2f}-{high:.2f}"])
    print_table(["keystroke to echo", "keys", "p50", "p99", "p50 / docker exec -it",
                 "90% interval"], rows, title="interleaved blocks of "
                                              f"{BLOCK} keys")
    p50 = median(t["service"]) * 1000
    p99 = quantile(t["service"], 0.99) * 1000
    summary = [("terminal keystroke to echo through sbx serve: p50", p50,
                TARGETS["service_p50_ms"],
                f"{p50:.2f} ms (p99 {p99:.2f} ms; docker exec -it p50 "
                f"{median(peer) * 1000:.2f} ms, ratio {median(t['service']) / median(peer):.2f})",
                "<= 20 ms")]
    stats = {name: {"p50_ms": median(v) * 1000, "p99_ms": quantile(v, 0.99) * 1000,
                    "keys": len(v)} for name, v in t.items()}
    results = {"meta": meta, "keys": args.keys, "block": BLOCK, "stats": stats,
               "times": t}
    common.finish(results, summary, [], run_id=ctx.run_id, started=started,
                  json_path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
