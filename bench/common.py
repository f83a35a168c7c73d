"""What the benchmarks in this folder share: statistics, subprocess timing, the run context
(temporary SBX_HOMEs, the run label, cleanup by id), table printing and the run's metadata.

The scripts are run as `.venv/bin/python bench/bench_X.py`, so this folder is on sys.path and
they import this module as `common`. Importing it also puts the project root on sys.path, for
`core` and `adapters`.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

IMAGE = "sandboxer/base:busybox"
# the same limits as profiles/default.yaml (cpu 1, memory 512MiB without swap, pids 256)
DOCKER_LIMITS = ["--network", "none", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                 "--memory", "512m", "--memory-swap", "512m", "--cpus", "1",
                 "--pids-limit", "256"]
TIMEOUT_S = 120


# -- statistics and formatting ---------------------------------------------------------------


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def ratio_interval(ours: Sequence[float], theirs: Sequence[float], *, level: float = 0.9,
                   resamples: int = 2000) -> tuple[float, float]:
    """A bootstrap interval for median(ours) / median(theirs): how far the ratio of medians
    could move from run to run at this spread and this many samples (seeded: the same
    samples give the same interval)."""
    import random

    rng = random.Random(0)
    ratios = sorted(statistics.median(rng.choices(ours, k=len(ours)))
                    / statistics.median(rng.choices(theirs, k=len(theirs)))
                    for _ in range(resamples))
    tail = (1 - level) / 2
    return ratios[int(tail * resamples)], ratios[int((1 - tail) * resamples) - 1]


def p90(xs: Sequence[float]) -> float:
    """Nearest-rank 90th percentile (for 10 samples: the 9th smallest)."""
    if not xs:
        return math.nan
    ordered = sorted(xs)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def ms(seconds: float) -> str:
    return "-" if seconds is None or math.isnan(seconds) else f"{seconds * 1000:.1f} ms"


def secs(seconds: float) -> str:
    return "-" if seconds is None or math.isnan(seconds) else f"{seconds:.3f} s"


def verdict(value: float, target: float) -> str:
    return "PASS" if value <= target else "MISS"


def print_table(headers: list[str], rows: list[list[Any]], title: str | None = None) -> None:
    body = [[str(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(headers)]
    if title:
        print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    print("  ".join("-" * w for w in widths))
    for r in body:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


# -- subprocesses ----------------------------------------------------------------------------


class CommandFailed(RuntimeError):
    pass


def run_cmd(argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
            check: bool = True,
            timeout: float = TIMEOUT_S) -> tuple[float, subprocess.CompletedProcess]:
    """Run one command; return (wall seconds, result). Raises CommandFailed on a non-zero exit."""
    started = time.perf_counter()
    proc = subprocess.run(list(argv), env=env, cwd=cwd, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout)
    elapsed = time.perf_counter() - started
    if check and proc.returncode != 0:
        raise CommandFailed(f"{' '.join(argv[:6])}{' ...' if len(argv) > 6 else ''} exited "
                            f"{proc.returncode}: {(proc.stderr or proc.stdout).strip()[:500]}")
    return elapsed, proc


def parse_importtime(stderr: str) -> list[dict[str, Any]]:
    """The modules in `python -X importtime` output: name, nesting depth, self and cumulative us."""
    entries = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cum_us, raw = line.split(":", 1)[1].split("|")
        name = raw[1:]  # one space after the bar, then two per level of nesting
        entries.append({"module": name.strip(), "depth": (len(name) - len(name.lstrip())) // 2,
                        "self_us": int(self_us), "cumulative_us": int(cum_us)})
    return entries


def top_level_imports(entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The imports made by the program itself (depth 0), most expensive (cumulative) first."""
    return sorted((e for e in entries if e["depth"] == 0), key=lambda e: -e["cumulative_us"])


# -- the run context -------------------------------------------------------------------------


class BenchContext:
    """One benchmark run: its id and label, a temporary folder for SBX_HOMEs, the containers
    it made (removed by id at cleanup), and notes on what cleanup did."""

    def __init__(self, prefix: str, timeout: float = TIMEOUT_S) -> None:
        self.timeout = timeout
        self.run_id = uuid.uuid4().hex[:12]
        self.label = f"sbx-bench={self.run_id}"
        self.labels = {"sbx-bench": self.run_id}
        self._tmp = tempfile.TemporaryDirectory(prefix=prefix)
        self.tmp = Path(self._tmp.name)
        sbx = Path(sys.executable).parent / "sbx"
        self.sbx = [str(sbx)] if sbx.exists() else [sys.executable, "-m", "sandboxer_tui"]
        self.containers: set[str] = set()  # every container id this run made and may still hold
        self.notes: list[str] = []

    def run(self, argv: Sequence[str], **kwargs: Any) -> tuple[float, subprocess.CompletedProcess]:
        """run_cmd with this run's timeout."""
        return run_cmd(argv, timeout=self.timeout, **kwargs)

    def run_sbx(self, env: dict[str, str], *args: str,
                check: bool = True) -> tuple[float, subprocess.CompletedProcess]:
        """`sbx ARGS...` in a fresh process, in the run's folder, with `env` (see sbx_env)."""
        return self.run([*self.sbx, *args], env=env, cwd=self.tmp, check=check)

    def settle(self, env: dict[str, str], timeout_s: float = 5.0) -> None:
        """Untimed: wait until the `sbx server` for env's SBX_HOME (if one runs) runs no
        command (the last one's child has exited and been reaped). Then a timed command
        never shares the machine with the previous one's teardown."""
        from sandboxer_tui.resident.control import query_status

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = query_status(Path(env["SBX_HOME"]))
            if not status or "pid" not in status or not status.get("commands_running"):
                return
            time.sleep(0.005)

    def python_pass_s(self) -> float:
        """Wall time of `python -c pass`: the floor under any fresh Python process."""
        return self.run([sys.executable, "-c", "pass"])[0]

    def launcher_alone(self, rounds: int) -> dict[str, float]:
        """Median wall time of `sbx ls` from start to exit against a socket that answers `pid`
        and `exit 0` at once, for the `sbx` this run times and for `python -m sandboxer_tui`
        (the same launcher), with `/bin/true` as the floor: what the launcher itself adds to
        every command."""
        import socket
        import threading

        from sandboxer_tui.resident.resident import _read_frame

        folder = self.home("instant-server")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(folder / "server.sock"))
        listener.listen(8)

        def answer() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return  # closed: the measurement is over
                with conn:
                    _, fds = _read_frame(conn)
                    for fd in fds:
                        os.close(fd)
                    conn.sendall(f"pid {os.getpid()}\nexit 0\n".encode())

        threading.Thread(target=answer, daemon=True).start()
        env = self.sbx_env(folder)
        commands = {"sbx": [*self.sbx, "ls"],
                    "python_launcher": [sys.executable, "-m", "sandboxer_tui", "ls"],
                    "true": ["/bin/true"]}
        times: dict[str, list[float]] = {name: [] for name in commands}
        try:
            for _ in range(rounds):
                for name, argv in commands.items():
                    times[name].append(self.run(argv, env=env, cwd=self.tmp)[0])
        finally:
            listener.close()
        return {name: median(values) for name, values in times.items()}

    def home(self, name: str) -> Path:
        path = self.tmp / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def sbx_env(self, home: Path, **extra: str) -> dict[str, str]:
        """Explicit environment for sbx subprocesses: our SBX_HOME and config dir, no other SBX_*."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
        env.update(SBX_HOME=str(home), XDG_CONFIG_HOME=str(self.tmp / "xdg-config"),
                   SBX_ACTOR="sbx-bench", SBX_SERVER_AUTOSTART="0")
        env.update(extra)  # a benchmark of first use turns autostart on
        return env

    @contextmanager
    def in_process(self, home: Path) -> Iterator[None]:
        """This process acts as an sbx client of `home` (its database and installation id)."""
        saved = {k: v for k, v in os.environ.items()
                 if k.startswith("SBX_") or k == "XDG_CONFIG_HOME"}
        for key in [k for k in os.environ if k.startswith("SBX_")]:
            del os.environ[key]
        os.environ.update(SBX_HOME=str(home), XDG_CONFIG_HOME=str(self.tmp / "xdg-config"),
                          SBX_ACTOR="sbx-bench")
        try:
            yield
        finally:
            for key in [k for k in os.environ if k.startswith("SBX_")]:
                del os.environ[key]
            os.environ.pop("XDG_CONFIG_HOME", None)
            os.environ.update(saved)

    def docker_run(self) -> tuple[float, str]:
        """`docker run -d` of one container equivalent to an sbx sandbox (same image, limits,
        restart policy and KEEPALIVE command as adapters/docker.py) with the run label.
        Returns (seconds, id); the id is recorded for cleanup."""
        from sandboxer.adapters.docker import KEEPALIVE, RESTART_POLICY  # KEEPALIVE: sh -c ...

        elapsed, proc = self.run(["docker", "run", "-d", *DOCKER_LIMITS,
                                  "--restart", RESTART_POLICY["Name"], "--label", self.label,
                                  IMAGE, *KEEPALIVE])
        cid = proc.stdout.split()[-1]
        self.containers.add(cid)
        return elapsed, cid

    def labelled(self, check: bool = True) -> list[str]:
        """Ids of every container on the engine that carries this run's label."""
        _, proc = self.run(["docker", "ps", "-aq", "--no-trunc", "--filter",
                            f"label={self.label}"], check=check)
        return proc.stdout.split()

    def still_present(self, ids: set[str]) -> set[str]:
        return ids & set(self.labelled()) if ids else set()

    def cleanup(self) -> None:
        """Remove by id the containers this run made and still holds, then anything else that
        carries the run label; then the temporary folder. Never prunes. An engine that does
        not answer (dockerd 20.10 has hung after long churn) leaves them, said in the notes
        with the command that removes them later, and the run's results are still written."""
        try:
            self._remove_containers()
        except subprocess.TimeoutExpired as exc:
            self.notes.append(f"cleanup: the engine did not answer `{' '.join(exc.cmd[:3])}` "
                              f"within {exc.timeout:.0f} s; this run's containers are left: "
                              f"docker rm -f $(docker ps -aq --filter label={self.label})")
        self._tmp.cleanup()

    def _remove_containers(self) -> None:
        left = self.still_present(self.containers)
        if left:
            _, proc = self.run(["docker", "rm", "-f", *sorted(left)], check=False)
            self.notes.append(f"cleanup: docker rm -f {len(left)} container(s) of this run: "
                              f"rc {proc.returncode}")
            self.containers = left if proc.returncode else set()
        else:
            self.containers.clear()
        # last check: anything still carrying this run's unique label is ours; remove it by id
        stray = self.labelled(check=False)
        if stray:
            self.run(["docker", "rm", "-f", *stray], check=False)
            self.notes.append(f"cleanup: {len(stray)} leftover container(s) with {self.label} "
                              f"removed by id: {' '.join(i[:12] for i in stray)}")


# -- the run's metadata and summary ----------------------------------------------------------


def git_commit() -> str:
    """The short commit of the work tree, with `+dirty` when it has uncommitted changes."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"],
                                capture_output=True, text=True).stdout.strip())
    return commit + ("+dirty" if dirty else "")


def preflight_meta() -> dict[str, Any]:
    """What a results file says about where it was measured (without asking the engine)."""
    return {"python": platform.python_version(), "cpus": os.cpu_count(),
            "launcher": launcher_kind(), "git_commit": git_commit(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def preflight(timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """The engine answers and has the base image; the run's metadata."""
    _, proc = run_cmd(["docker", "version", "--format", "{{.Server.Version}}"], timeout=timeout)
    _, img = run_cmd(["docker", "image", "inspect", "--format", "{{.Id}}", IMAGE], check=False,
                     timeout=timeout)
    if img.returncode != 0:
        raise SystemExit(f"the base image {IMAGE} is not on the engine; `make image` builds it")
    return {"docker_server": proc.stdout.strip(), "python": platform.python_version(),
            "platform": platform.platform(), "cpus": os.cpu_count(),
            "launcher": launcher_kind(), "git_commit": git_commit(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def launcher_kind() -> str:
    """Which `sbx` the run times: pip's script (sandboxer_tui/resident/launcher.py), or
    `python -m sandboxer_tui`, the same code, where the venv has no script."""
    sbx = Path(sys.executable).parent / "sbx"
    return "python" if sbx.exists() else "none (python -m sandboxer_tui)"


def print_banner(name: str, ctx: BenchContext, meta: dict[str, Any]) -> None:
    print(f"sbx {name} benchmark  run {ctx.run_id}  commit {meta['git_commit']}  "
          f"docker {meta['docker_server']}  python {meta['python']}  {meta['cpus']} cpus  "
          f"launcher {meta['launcher']}",
          flush=True)


def print_notes(ctx: BenchContext) -> None:
    for note in ctx.notes:
        print(note, file=sys.stderr)


def finish(results: dict[str, Any], summary: list[tuple[str, float, float, str, str]],
           info: list[list[Any]], *, run_id: str, started: float, json_path: str | None) -> None:
    """Print the SUMMARY table: one row per (measurement, value, target, value shown, target
    shown), PASS when value <= target, then the `info` rows. Records the summary and the
    elapsed time in `results`, and writes them as JSON to `json_path` (--json) when given."""
    rows = [[name, shown, target_text, verdict(value, target)]
            for name, value, target, shown, target_text in summary]
    print_table(["measurement", "value", "target", "result"], rows + info,
                title=f"SUMMARY (run {run_id}, {time.perf_counter() - started:.0f} s)")
    results["summary"] = [{"measurement": n, "value": v, "target": t, "pass": v <= t,
                           "shown": shown, "target_shown": target_text}
                          for n, v, t, shown, target_text in summary]
    results.setdefault("meta", preflight_meta())
    results["elapsed_s"] = time.perf_counter() - started
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"results written to {json_path}")
