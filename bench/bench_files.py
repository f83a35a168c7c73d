"""Work inside a sandbox: files in and out, exec with stdin, and exec's timeout, against the
tools a user would otherwise pick, side by side in one run on the real local Docker engine.

    .venv/bin/python bench/bench_files.py [--rounds N] [--big-mib N] [--json FILE]

1. A 100 MiB tree of mixed file sizes (one 40 MiB file, 30 of 1 MiB, 1,500 of 20 KiB) uploaded
   then downloaded into a fresh local folder: the library (`box.files.upload` then
   `box.files.download`, in process) against `docker cp` both ways and against docker-py's
   `put_archive` / `get_archive` (a tar streamed from the local tree, and the one received
   unpacked with `tarfile`). The same through `sbx serve` (`AsyncSandboxer(url=)`).
   Targets: library / each peer <= 1.15; through the service / docker-py <= 1.3.
2. `box.exec(["sh", "-c", "wc -c"], env=, cwd=, stdin=1 MiB)` against docker-py doing the same
   (`exec_create(stdin=True, environment=, workdir=)`, `exec_start(socket=True)`, the MiB
   written, its write side shut, the output read, `exec_inspect`). Target <= 1.10.
3. `box.exec(["sh", "-c", "echo before; sleep 30"], timeout=2s)`: how long after the deadline
   it returns (the worst round), that its stdout holds `before`, and how many processes of
   that exec are left in the sandbox (ps). Targets: <= 0.5 s; 0 left.
4. Peak memory (VmHWM) of a 1 GiB (`--big-mib`) upload then download of one file: the
   client's (a fresh process using the library on the local transport, then one using the
   service) and the service's (`sbx serve`). Target < 150 MB each.

Rounds are interleaved (ABBA) so drift falls on every arm alike. sbx keeps its state in a
temporary SBX_HOME; every container carries `sbx-bench=<runid>` and only this run's are removed,
by id. Exit status 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path
from typing import Any

import common
from bench_service import Context as ServiceContext
from common import median, ms, print_table, ratio_interval, secs

TARGETS = {"tree_library_vs_docker_cp": 1.15, "tree_library_vs_docker_py": 1.15,
           "tree_service_vs_docker_py": 1.3, "exec_stdin": 1.10, "timeout_overshoot_s": 0.5,
           "timeout_left": 0, "peak_mb": 150}
MIB = 1024 * 1024
REMOTE = "/tmp/bench-tree"


def make_tree(root: Path) -> int:
    """The 100 MiB tree of mixed sizes; its total size."""
    chunk = os.urandom(MIB)
    (root / "big").mkdir(parents=True)
    with open(root / "big" / "data.bin", "wb") as out:
        for _ in range(40):
            out.write(chunk)
    (root / "medium").mkdir()
    for n in range(30):
        (root / "medium" / f"m{n:02d}.bin").write_bytes(chunk[n:] + chunk[:n])
    for d in range(15):
        folder = root / "small" / f"d{d:02d}"
        folder.mkdir(parents=True)
        for n in range(100):
            start = (d * 100 + n) * 331 % (MIB - 20 * 1024)
            (folder / f"s{n:03d}.txt").write_bytes(chunk[start:start + 20 * 1024])
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


class Context(ServiceContext):
    def __init__(self) -> None:
        super().__init__("sbx-bench-files-")


# -- the peers -------------------------------------------------------------------------------


def tar_stream(root: Path, name: str):
    """The local tree as a tar stream, made while it is read (docker-py's put_archive body)."""
    import queue
    import threading

    chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=16)

    class Sink(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, data) -> int:  # type: ignore[override]
            chunks.put(bytes(data))
            return len(data)

    def pack() -> None:
        with tarfile.open(fileobj=Sink(), mode="w|", bufsize=MIB) as tar:
            tar.add(root, arcname=name)
        chunks.put(None)

    threading.Thread(target=pack, daemon=True).start()
    while (chunk := chunks.get()) is not None:
        yield chunk


class Reader(io.RawIOBase):
    """A file-like over an iterator of chunks (tarfile's stream mode reads it)."""

    def __init__(self, chunks) -> None:
        self._chunks = iter(chunks)
        self._left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._left:
            try:
                self._left = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


def docker_py_round_trip(api, cid: str, tree: Path, dest: Path) -> None:
    api.exec_start(api.exec_create(cid, ["mkdir", "-p", REMOTE])["Id"])
    api.put_archive(cid, REMOTE, tar_stream(tree, "tree"))
    stream, _ = api.get_archive(cid, f"{REMOTE}/tree", chunk_size=MIB)
    with tarfile.open(fileobj=io.BufferedReader(Reader(stream), MIB), mode="r|") as tar:
        tar.extractall(dest, filter="data")


def docker_cp_round_trip(ctx: Context, cid: str, tree: Path, dest: Path) -> None:
    ctx.run(["docker", "exec", cid, "mkdir", "-p", REMOTE])
    ctx.run(["docker", "cp", str(tree), f"{cid}:{REMOTE}/tree"])
    ctx.run(["docker", "cp", f"{cid}:{REMOTE}/tree", str(dest / "tree")])


def docker_py_exec_stdin(api, cid: str, data: bytes) -> bytes:
    from docker.utils.socket import consume_socket_output, demux_adaptor, frames_iter

    exec_id = api.exec_create(cid, ["sh", "-c", "wc -c"], stdin=True, stdout=True, stderr=True,
                              environment={"BENCH_K": "v"}, workdir="/tmp")["Id"]
    sock = api.exec_start(exec_id, socket=True)
    raw = getattr(sock, "_sock", sock)
    raw.sendall(data)
    raw.shutdown(socket.SHUT_WR)
    out, _ = consume_socket_output((demux_adaptor(*f) for f in frames_iter(sock, tty=False)),
                                   demux=True)
    sock.close()
    assert api.exec_inspect(exec_id)["ExitCode"] == 0
    return out or b""


# -- the measurements ------------------------------------------------------------------------


async def bench_tree(ctx: Context, rounds: int, home: Path, url: str,
                     token: str) -> dict[str, Any]:
    import docker

    import sandboxer

    tree = ctx.home("tree-src")
    size = make_tree(tree)
    want = tree_digest(tree)
    api = docker.APIClient(version="auto", timeout=300)
    _, cid = ctx.docker_run()
    times: dict[str, list[float]] = {k: [] for k in ("library", "service", "docker_cp",
                                                    "docker_py")}
    async with sandboxer.AsyncSandboxer(home=home, actor="sbx-bench") as local, \
            sandboxer.AsyncSandboxer(url=url, token=token) as remote:
        # made through the service, so that its key's owner sees it; the same sandbox in process
        remote_box = await remote.create("default", labels=ctx.labels)
        ctx.containers.add(remote_box.backend_ref)
        box = await local.get(remote_box.id)

        async def library(handle) -> None:
            await handle.files.upload(tree, f"{REMOTE}/tree")
            await handle.files.download(f"{REMOTE}/tree", dest / "tree")

        async def arm(name: str) -> None:
            nonlocal dest
            dest = ctx.tmp / f"dest-{name}"
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir()
            started = time.perf_counter()
            if name == "library":
                await library(box)
            elif name == "service":
                await library(remote_box)
            elif name == "docker_cp":
                await asyncio.to_thread(docker_cp_round_trip, ctx, cid, tree, dest)
            else:
                await asyncio.to_thread(docker_py_round_trip, api, cid, tree, dest)
            times[name].append(time.perf_counter() - started)
            got = tree_digest(dest / "tree")
            if got != want:
                raise RuntimeError(f"{name}: the tree came back different")
            # untimed: the next round starts from an empty folder on both sides
            await box.exec(["rm", "-rf", REMOTE])
            ctx.run(["docker", "exec", cid, "rm", "-rf", REMOTE])
            shutil.rmtree(dest)

        dest = ctx.tmp
        for name in times:  # warm-up, untimed
            await arm(name)
        for values in times.values():
            values.clear()
        order = list(times)
        for n in range(rounds):
            for name in (order if n % 2 == 0 else order[::-1]):
                await arm(name)
        await box.destroy()
    return {"tree_bytes": size, "times": times}


async def bench_exec(ctx: Context, rounds: int) -> dict[str, Any]:
    import docker

    import sandboxer

    data = os.urandom(MIB)
    api = docker.APIClient(version="auto", timeout=120)
    _, cid = ctx.docker_run()
    times: dict[str, list[float]] = {"sbx": [], "docker_py": []}
    timeout: dict[str, list[float]] = {"overshoot": [], "left": [], "kept_output": []}
    async with sandboxer.AsyncSandboxer(home=ctx.home("exec"), actor="sbx-bench") as sbx:
        box = await sbx.create("default", labels=ctx.labels)
        ctx.containers.add(box.backend_ref)

        async def ours() -> None:
            started = time.perf_counter()
            result = await box.exec(["sh", "-c", "wc -c"], env={"BENCH_K": "v"}, cwd="/tmp",
                                    stdin=data)
            times["sbx"].append(time.perf_counter() - started)
            assert result.stdout.split() == [str(MIB).encode()], result

        async def theirs() -> None:
            started = time.perf_counter()
            out = await asyncio.to_thread(docker_py_exec_stdin, api, cid, data)
            times["docker_py"].append(time.perf_counter() - started)
            assert out.split() == [str(MIB).encode()], out

        await ours()
        await theirs()
        times["sbx"].clear()
        times["docker_py"].clear()
        for n in range(rounds * 2):
            for step in ((ours, theirs) if n % 2 == 0 else (theirs, ours)):
                await step()

        for _ in range(max(3, rounds // 3)):
            started = time.perf_counter()
            result = await box.exec(["sh", "-c", "echo before; sleep 30"], timeout=2)
            timeout["overshoot"].append(time.perf_counter() - started - 2.0)
            timeout["kept_output"].append(float(b"before" in result.stdout))
            _, ps = ctx.run(["docker", "exec", box.backend_ref, "ps", "-o", "args"])
            timeout["left"].append(float(sum("sleep 30" in line
                                             for line in ps.stdout.splitlines())))
        await box.destroy()
    return {"times": times, "timeout": timeout}


CLIENT = textwrap.dedent("""
    import asyncio, os, sys
    import sandboxer

    async def main(home, url, token, ref, path, mib):
        kwargs = dict(url=url, token=token) if url else dict(home=home, actor="sbx-bench")
        async with sandboxer.AsyncSandboxer(**kwargs) as sbx:
            box = await sbx.get(ref)
            await box.files.write("/tmp/big.bin", open(path, "rb"))
            await box.files.download("/tmp/big.bin", path + ".back")
            if os.path.getsize(path + ".back") != mib * 1024 * 1024:
                raise SystemExit("the file came back short")
            os.unlink(path + ".back")
            await box.files.remove("/tmp/big.bin")
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across exec
        status = open("/proc/self/status").read().split("VmHWM:")[1]
        print(int(status.split()[0]) // 1024)

    asyncio.run(main(*sys.argv[1:6], int(sys.argv[6])))
""")


def vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def bench_peak(ctx: Context, mib: int, home: Path, url: str, token: str,
                     serve: subprocess.Popen) -> dict[str, float]:
    import sandboxer

    path = ctx.tmp / "big.bin"
    chunk = os.urandom(MIB)
    with open(path, "wb") as out:
        for _ in range(mib):
            out.write(chunk)
    async with sandboxer.AsyncSandboxer(url=url, token=token) as sbx:
        box = await sbx.create("default", labels=ctx.labels)
        ctx.containers.add(box.backend_ref)
        peaks = {}
        env = ctx.sbx_env(home)
        for name, args in (("client_local", ["", ""]), ("client_service", [url, token])):
            proc = subprocess.run([sys.executable, "-c", CLIENT, str(home), *args, box.id,
                                   str(path), str(mib)], env=env, capture_output=True,
                                  text=True, timeout=1800)
            if proc.returncode:
                raise RuntimeError(f"{name}: {proc.stderr.strip()[-1000:]}")
            peaks[name] = float(proc.stdout.split()[-1])
        peaks["service"] = vm_hwm_mb(serve.pid)
        await box.destroy()
    path.unlink()
    return peaks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--big-mib", type=int, default=1024)
    parser.add_argument("--json")
    args = parser.parse_args()
    meta = common.preflight()
    ctx = Context()
    common.print_banner("files", ctx, meta)
    started = time.perf_counter()
    try:
        home = ctx.home("served")
        url, token = ctx.serve(home, "write")
        serve = ctx.services[-1][0]
        tree = asyncio.run(bench_tree(ctx, args.rounds, home, url, token))
        execs = asyncio.run(bench_exec(ctx, args.rounds))
        peaks = asyncio.run(bench_peak(ctx, args.big_mib, home, url, token, serve))
    finally:
        ctx.cleanup()
        common.print_notes(ctx)
    t = tree["times"]
    med = {k: median(v) for k, v in t.items()}
    rows, summary = [], []

    def ratio_row(key: str, ours: str, theirs: str, label: str) -> None:
        ratio = med[ours] / med[theirs]
        low, high = ratio_interval(t[ours], t[theirs])
        rows.append([label, secs(med[ours]), secs(med[theirs]), f"{ratio:.3f}",
                     f"{low:.3f}-{high:.3f}", f"<= {TARGETS[key]}"])
        summary.append((label, ratio, TARGETS[key],
                        f"{ratio:.3f} (90% interval {low:.3f}-{high:.3f})",
                        f"<= {TARGETS[key]}"))

    mib = tree["tree_bytes"] / MIB
    ratio_row("tree_library_vs_docker_cp", "library", "docker_cp",
              f"{mib:.0f} MiB tree up+down: library / docker cp")
    ratio_row("tree_library_vs_docker_py", "library", "docker_py",
              f"{mib:.0f} MiB tree up+down: library / docker-py")
    ratio_row("tree_service_vs_docker_py", "service", "docker_py",
              f"{mib:.0f} MiB tree up+down: through sbx serve / docker-py")
    e = execs["times"]
    ratio = median(e["sbx"]) / median(e["docker_py"])
    low, high = ratio_interval(e["sbx"], e["docker_py"])
    rows.append(["exec, env+cwd+1 MiB stdin: library / docker-py", ms(median(e["sbx"])),
                 ms(median(e["docker_py"])), f"{ratio:.3f}", f"{low:.3f}-{high:.3f}",
                 f"<= {TARGETS['exec_stdin']}"])
    summary.append(("exec with env, cwd and 1 MiB stdin: library / docker-py", ratio,
                    TARGETS["exec_stdin"], f"{ratio:.3f} (90% interval {low:.3f}-{high:.3f})",
                    f"<= {TARGETS['exec_stdin']}"))
    worst = max(execs["timeout"]["overshoot"])
    left = max(execs["timeout"]["left"])
    kept = min(execs["timeout"]["kept_output"])
    summary.append(("exec --timeout 2s: returned after the deadline (worst round)", worst,
                    TARGETS["timeout_overshoot_s"], secs(worst), "<= 0.5 s"))
    summary.append(("exec --timeout 2s: processes of that exec left", left, 0,
                    f"{left:.0f} (output before the deadline kept: {'yes' if kept else 'no'})",
                    "0"))
    for name, label in (("client_local", "library, local"), ("client_service",
                                                            "library, through sbx serve"),
                        ("service", "sbx serve")):
        summary.append((f"{args.big_mib} MiB file up+down: peak memory of {label}",
                        peaks[name], TARGETS["peak_mb"], f"{peaks[name]:.0f} MB",
                        f"< {TARGETS['peak_mb']} MB"))
    print_table(["measurement", "sbx (median)", "peer (median)", "ratio", "90% interval",
                 "target"], rows, title=f"{args.rounds} interleaved rounds")
    results = {"meta": meta, "rounds": args.rounds, "tree": tree, "exec": execs,
               "peaks_mb": peaks}
    common.finish(results, summary, [], run_id=ctx.run_id, started=started,
                  json_path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
