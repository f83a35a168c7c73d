"""Lifecycle benchmark for sbx, against a real local Docker engine.

    .venv/bin/python bench/bench_lifecycle.py [--rounds N] [--json FILE]

Three measurements in one run, each against its target:

1. CLI: `sbx create --json` + `sbx destroy --yes ID` (fresh processes, an isolated SBX_HOME)
   against `docker run -d ...` + `docker rm -f ID` with the same image, command and limits.
   Rounds are interleaved (sbx, docker, sbx, docker, ...) to cancel drift. sbx runs
   one-shot (SBX_NO_SERVER=1), and with `sbx server` twice: "resident", each command after a
   pause (untimed: until the server runs no command, as between an agent's
   steps), and "resident back-to-back" (destroy right after create, as in a script). Every
   docker command also starts on an idle server, so sbx's background work never overlaps it.
   Target: median(sbx resident) / median(docker) <= 1.3.
2. Manager overhead in-process: time of Manager.create / Manager.destroy minus the time spent
   inside the docker adapter (ensure_available, create, destroy, list). Target: <= 10 ms.
3. `sbx ls --json` and `sbx ls` over 1,000 sandboxes in the database (seeded through
   Manager.create on the `stub` test double). Target: <= 0.3 s.

Then, for information: phases of one `sbx create` in a fresh process, and the most expensive
imports of `sbx ls --json` (python -X importtime).

Only containers this run made are removed, by id; the run label `sbx-bench=<runid>` is on all
of them, and a final check lists (and removes, by id) any of them still present. Never prunes.
Exit status 0 whatever the figures (this is a report); non-zero only when something crashed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import common
from common import BenchContext, median, ms, p90, print_table, secs

TARGET_RATIO = 1.3
TARGET_OVERHEAD_S = 0.010
TARGET_LS_S = 0.3
SEED_COUNT = 1000


# -- in-process timing -----------------------------------------------------------------------


class Timer:
    """Accumulates time spent inside wrapped async methods / context managers."""

    def __init__(self) -> None:
        self.by: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    @property
    def total(self) -> float:
        return sum(self.by.values())

    def reset(self) -> None:
        self.by.clear()
        self.calls.clear()

    def add(self, name: str, dt: float) -> None:
        self.by[name] += dt
        self.calls[name] += 1

    def wrap_async(self, obj: Any, names: Sequence[str]) -> None:
        for name in names:
            setattr(obj, name, self._async(name, getattr(obj, name)))

    def _async(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter() - started)

        return timed

    def wrap_cm(self, obj: Any, names: Sequence[str]) -> None:
        for name in names:
            setattr(obj, name, self._cm(name, getattr(obj, name)))

    def _cm(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @contextmanager
        def timed(*args: Any, **kwargs: Any) -> Iterator[Any]:
            started = time.perf_counter()
            try:
                with fn(*args, **kwargs) as value:
                    yield value
            finally:
                self.add(name, time.perf_counter() - started)

        return timed


# -- the run context -------------------------------------------------------------------------


class Context(BenchContext):
    def __init__(self, rounds: int) -> None:
        super().__init__("sbx-bench-")
        self.rounds = rounds
        # what this run made and has not removed yet: sbx id -> SBX_HOME (containers: in the base)
        self.sbx_live: dict[str, Path] = {}
        self.servers: list[dict[str, str]] = []  # envs of the `sbx server`s this run started

    def cleanup(self) -> None:
        for env in self.servers:
            self.run_sbx(env, "server", "stop", check=False)
        for sid, home in list(self.sbx_live.items()):
            try:
                self.run_sbx(self.sbx_env(home), "destroy", "--yes", sid)
                self.sbx_live.pop(sid)
                self.notes.append(f"cleanup: sbx destroy {sid}")
            except Exception as exc:  # keep going; reported below
                self.notes.append(f"cleanup: sbx destroy {sid} FAILED: {exc}")
        super().cleanup()


# -- 1. CLI create+destroy vs raw docker -----------------------------------------------------


def bench_cli(ctx: Context) -> dict[str, Any]:
    """Each round runs, interleaved: sbx one-shot (SBX_NO_SERVER=1: every command imports
    everything), sbx with a resident `sbx server` for its SBX_HOME, and raw docker."""
    resident = ctx.sbx_env(ctx.home("cli-resident"))
    modes = {"one-shot": ctx.sbx_env(ctx.home("cli-oneshot"), SBX_NO_SERVER="1"),
             "resident": resident, "resident back-to-back": resident}
    ctx.run_sbx(resident, "server", "start")
    ctx.servers.append(resident)

    def sbx_round(mode: str) -> tuple[float, float]:
        env, spaced = modes[mode], mode != "resident back-to-back"
        ctx.settle(resident)
        t_create, proc = ctx.run_sbx(env, "create", "--label", ctx.label, "--json")
        sid = json.loads(proc.stdout)["id"]
        ctx.sbx_live[sid] = Path(env["SBX_HOME"])
        if spaced:
            ctx.settle(resident)
        t_destroy, _ = ctx.run_sbx(env, "destroy", "--yes", sid)
        ctx.sbx_live.pop(sid, None)
        return t_create, t_destroy

    def docker_round() -> tuple[float, float]:
        ctx.settle(resident)
        t_run, cid = ctx.docker_run()
        ctx.settle(resident)
        t_rm, _ = ctx.run(["docker", "rm", "-f", cid])
        ctx.containers.discard(cid)
        return t_run, t_rm

    # warm-up, not counted: the first sbx create makes and migrates the database
    cold = {mode: sbx_round(mode) for mode in modes}
    docker_round()

    runs: dict[str, tuple[list[float], list[float]]] = {m: ([], []) for m in [*modes, "docker"]}
    for _ in range(ctx.rounds):
        for mode in modes:
            c, d = sbx_round(mode)
            runs[mode][0].append(c)
            runs[mode][1].append(d)
        c, d = docker_round()
        runs["docker"][0].append(c)
        runs["docker"][1].append(d)

    def summary(mode: str) -> dict[str, Any]:
        creates, destroys = runs[mode]
        totals = [c + d for c, d in zip(creates, destroys, strict=True)]
        return {"create_s": creates, "destroy_s": destroys, "total_s": totals,
                "median_create": median(creates), "median_destroy": median(destroys),
                "median_total": median(totals)}

    result: dict[str, Any] = {"rounds": ctx.rounds, "target": TARGET_RATIO}
    for mode in runs:
        result[mode] = summary(mode)
    result["sbx_cold_first_create_s"] = {m: c for m, (c, _) in cold.items()}
    result["version_s"] = {
        "one-shot": median([ctx.run_sbx(modes["one-shot"], "--version")[0] for _ in range(5)]),
        "resident": median([ctx.run_sbx(modes["resident"], "--version")[0] for _ in range(5)]),
        "docker": median([ctx.run(["docker", "--version"])[0] for _ in range(5)]),
        "python -c pass": median([ctx.python_pass_s() for _ in range(5)]),
    }
    dock = result["docker"]
    rows = []
    for mode in modes:
        m = result[mode]
        result[f"ratio_{mode}"] = m["median_total"] / dock["median_total"]
        rows += [
            [f"sbx create ({mode})", ms(m["median_create"]), ms(dock["median_create"]),
             f"{m['median_create'] / dock['median_create']:.2f}x"],
            [f"sbx destroy ({mode})", ms(m["median_destroy"]), ms(dock["median_destroy"]),
             f"{m['median_destroy'] / dock['median_destroy']:.2f}x"],
            [f"create + destroy ({mode})", ms(m["median_total"]), ms(dock["median_total"]),
             f"{result[f'ratio_{mode}']:.2f}x"],
        ]
    print_table(["step (median)", "sbx", "docker run -d / rm -f", "sbx / docker"], rows,
                title=f"1. CLI create+destroy vs raw docker ({ctx.rounds} interleaved rounds, "
                      f"a fresh process per command)")
    v = result["version_s"]
    print(f"   start-up (--version): one-shot {ms(v['one-shot'])}, resident {ms(v['resident'])},"
          f" docker {ms(v['docker'])}; python -c pass {ms(v['python -c pass'])}")
    for mode in modes:
        print(f"   ratio of medians, {mode}: {result[f'ratio_{mode}']:.2f}  (target <= {TARGET_RATIO})")
    result["ratio"] = result["ratio_resident"]
    return result


# -- 2. Manager overhead in-process ----------------------------------------------------------


async def bench_manager(ctx: Context) -> dict[str, Any]:
    from sandboxer.core.lifecycle.manager import Manager
    from sandboxer.core.rules.profiles import ProfileLoader
    from sandboxer.core.store.db import Database

    home = ctx.home("mgr-home")
    db = Database(f"sqlite:///{home / 'sbx.db'}")
    mgr = Manager(db, actor="sbx-bench")
    profile = ProfileLoader().load("default")
    adapter = mgr.adapter(profile.backend)
    inside = Timer()
    inside.wrap_async(adapter, ["ensure_available", "create", "destroy", "list"])
    dbt = Timer()
    dbt.wrap_cm(db, ["write", "read"])
    live: dict[str, str | None] = {}  # sbx id -> backend ref

    async def one_round() -> dict[str, float]:
        out: dict[str, float] = {}
        inside.reset()
        dbt.reset()
        started = time.perf_counter()
        row = await mgr.create(profile, labels=ctx.labels)
        out["create_total"] = time.perf_counter() - started
        live[row["id"]] = row["backend_ref"]
        out["create_adapter"] = inside.total
        out["create_ensure"] = inside.by["ensure_available"]
        out["create_db"] = dbt.total
        out["create_tx"] = sum(dbt.calls.values())
        inside.reset()
        dbt.reset()
        started = time.perf_counter()
        await mgr.destroy(row["id"])
        out["destroy_total"] = time.perf_counter() - started
        live.pop(row["id"], None)
        out["destroy_adapter"] = inside.total
        out["destroy_ensure"] = inside.by["ensure_available"]
        out["destroy_db"] = dbt.total
        out["destroy_tx"] = sum(dbt.calls.values())
        return out

    samples: list[dict[str, float]] = []
    try:
        await one_round()  # warm-up: migration, docker-py import, client + version handshake
        for _ in range(ctx.rounds):
            samples.append(await one_round())
    finally:
        for sid, ref in list(live.items()):
            try:
                await mgr.destroy(sid)
            except Exception as exc:
                ctx.notes.append(f"cleanup: Manager.destroy {sid} failed ({exc}); "
                                         f"removing {ref} directly")
                if ref:
                    await adapter.destroy(ref)
        await mgr.close()

    def col(key: str) -> list[float]:
        return [s[key] for s in samples]

    result: dict[str, Any] = {"rounds": ctx.rounds, "samples": samples}
    rows = []
    for op in ("create", "destroy"):
        overhead = [s[f"{op}_total"] - s[f"{op}_adapter"] for s in samples]
        other = [s[f"{op}_total"] - s[f"{op}_adapter"] - s[f"{op}_db"] for s in samples]
        result[op] = {
            "overhead_median_s": median(overhead), "overhead_p90_s": p90(overhead),
            "total_median_s": median(col(f"{op}_total")),
            "adapter_median_s": median(col(f"{op}_adapter")),
            "ensure_available_median_s": median(col(f"{op}_ensure")),
            "db_median_s": median(col(f"{op}_db")),
            "other_median_s": median(other),
            "transactions": int(median(col(f"{op}_tx"))),
        }
        r = result[op]
        rows.append([f"Manager.{op}", ms(r["total_median_s"]), ms(r["adapter_median_s"]),
                     ms(r["ensure_available_median_s"]), ms(r["overhead_median_s"]),
                     ms(r["overhead_p90_s"]), f"{ms(r['db_median_s'])} ({r['transactions']} tx)",
                     ms(r["other_median_s"])])
    print_table(
        ["operation", "total", "in adapter", "(of which ping)", "overhead med", "overhead p90",
         "in db transactions", "other python"],
        rows,
        title=f"2. Manager overhead in-process, docker backend ({ctx.rounds} rounds, medians; "
              f"overhead = total - time inside the adapter)",
    )
    print(f"   target: overhead <= {TARGET_OVERHEAD_S * 1000:.0f} ms per operation")
    return result


# -- 3. sbx ls with 1,000 sandboxes ----------------------------------------------------------


async def seed(home: Path, count: int, labels: dict[str, str]) -> float:
    from sandboxer.core.lifecycle.manager import Manager
    from sandboxer.core.rules.profiles import ProfileLoader
    from sandboxer.core.store.db import Database

    profile_file = home.parent / "bench-stub.yaml"
    profile_file.write_text("name: bench-stub\ndescription: sbx-bench seed (stub test double)\n"
                            "backend: stub\n")
    profile = ProfileLoader().load_file(profile_file)
    mgr = Manager(Database(f"sqlite:///{home / 'sbx.db'}"), actor="sbx-bench")
    started = time.perf_counter()
    try:
        for _ in range(count):
            await mgr.create(profile, labels=labels)
    finally:
        await mgr.close()
    return time.perf_counter() - started


def bench_ls(ctx: Context) -> dict[str, Any]:
    home = ctx.home("ls-home")
    env = ctx.sbx_env(home)
    seed_s = asyncio.run(seed(home, SEED_COUNT, ctx.labels))
    _, proc = ctx.run_sbx(env, "ls", "--json")  # check + warm-up
    listed = len(json.loads(proc.stdout))
    if listed != SEED_COUNT:
        raise RuntimeError(f"sbx ls --json listed {listed} sandboxes, expected {SEED_COUNT}")
    ls_json, ls_table, pypass = [], [], []
    for _ in range(ctx.rounds):
        ls_json.append(ctx.run_sbx(env, "ls", "--json")[0])
        ls_table.append(ctx.run_sbx(env, "ls")[0])
        pypass.append(ctx.python_pass_s())
    version = [ctx.run_sbx(env, "--version")[0] for _ in range(ctx.rounds)]
    result = {
        "sandboxes": SEED_COUNT, "seed_s": seed_s, "seed_per_create_s": seed_s / SEED_COUNT,
        "ls_json_s": ls_json, "ls_s": ls_table, "python_pass_s": pypass, "sbx_version_s": version,
        "median": {"ls_json": median(ls_json), "ls": median(ls_table),
                   "python_pass": median(pypass), "sbx_version": median(version)},
        "p90": {"ls_json": p90(ls_json), "ls": p90(ls_table)},
        "home": home,
    }
    m = result["median"]
    print_table(
        ["command", "median", "p90"],
        [["sbx ls --json", secs(m["ls_json"]), secs(result["p90"]["ls_json"])],
         ["sbx ls", secs(m["ls"]), secs(result["p90"]["ls"])],
         ["sbx --version", secs(m["sbx_version"]), ""],
         ["python -c pass", secs(m["python_pass"]), ""]],
        title=f"3. sbx ls with {SEED_COUNT} sandboxes in the database ({ctx.rounds} rounds, "
              f"fresh process each)",
    )
    print(f"   seeding {SEED_COUNT} via Manager.create on the stub backend: {seed_s:.2f} s "
          f"({ms(seed_s / SEED_COUNT)} per create, all overhead); target: ls <= {TARGET_LS_S} s")
    return result


# -- 4. where the time goes (information) ----------------------------------------------------

# One `sbx create` + destroy in a fresh process, the way the CLI does it, with a clock at each
# phase. Prints one JSON document.
PROBE = r"""
import time
T0_WALL = time.time()
T0 = time.perf_counter()
phases = []
last = [T0]
def mark(name):
    now = time.perf_counter()
    phases.append([name, now - last[0]])
    last[0] = now
import sys, json, asyncio
import sandboxer_tui.cli
mark("import sandboxer_tui.cli (click)")
from sandboxer.core.lifecycle.manager import Manager
from sandboxer.core.rules.profiles import ProfileLoader
try:
    from sandboxer.core.rules.views import sandbox_view
except ImportError:  # older layout
    from sandboxer.core.lifecycle.manager import sandbox_view
mark("import sandboxer.core.lifecycle.manager + sandboxer.core.rules.profiles (sqlalchemy, pydantic, yaml)")
profile = ProfileLoader().load("default")
mark("load profile 'default' (yaml + pydantic)")
label = sys.argv[1].split("=", 1)

async def main():
    mgr = Manager()
    mark("Manager() (engine, install id)")
    adapter = mgr.adapter("docker")
    mark("import sandboxer.adapters.docker (docker-py)")
    await asyncio.to_thread(adapter._client)
    mark("docker.APIClient(version='auto') (GET /version)")
    api = adapter._api
    spent = {}
    def wrap(obj, name, key):
        fn = getattr(obj, name)
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[key] = spent.get(key, 0.0) + time.perf_counter() - t
        setattr(obj, name, timed)
    for name in ("ping", "create_container", "start", "remove_container"):
        wrap(api, name, "api." + name)
    db_time = {"t": 0.0}
    from contextlib import contextmanager
    for name in ("write", "read"):
        fn = getattr(mgr.db, name)
        def make(fn):
            @contextmanager
            def timed(*a, **k):
                t = time.perf_counter()
                try:
                    with fn(*a, **k) as c:
                        yield c
                finally:
                    db_time["t"] += time.perf_counter() - t
            return timed
        setattr(mgr.db, name, make(fn))
    t = time.perf_counter()
    row = await mgr.create(profile, labels={label[0]: label[1]})
    total = time.perf_counter() - t
    last[0] = time.perf_counter()
    phases.append(["  Manager.create: docker ping (ensure_available)", spent.get("api.ping", 0.0)])
    phases.append(["  Manager.create: docker create_container", spent.get("api.create_container", 0.0)])
    phases.append(["  Manager.create: docker start", spent.get("api.start", 0.0)])
    phases.append(["  Manager.create: db transactions", db_time["t"]])
    docker_calls = sum(spent.values())
    phases.append(["  Manager.create: everything else", total - docker_calls - db_time["t"]])
    out = json.dumps(sandbox_view(row, row["created_at"]), indent=2)
    mark("sandbox_view + json")
    spent.clear(); db_time["t"] = 0.0
    t = time.perf_counter()
    await mgr.destroy(row["id"])
    dtotal = time.perf_counter() - t
    last[0] = time.perf_counter()
    await mgr.close()
    mark("Manager.close()")
    return row["id"], total, dtotal, dict(spent), db_time["t"]

sid, total, dtotal, dspent, ddb = asyncio.run(main())
inner = time.perf_counter() - T0
print(json.dumps({"id": sid, "phases": phases, "create_total": total, "destroy_total": dtotal,
                  "destroy_ping": dspent.get("api.ping", 0.0),
                  "destroy_remove": dspent.get("api.remove_container", 0.0),
                  "destroy_db": ddb, "inner_total": inner, "t0_wall": T0_WALL,
                  "end_wall": time.time()}), flush=True)
"""


def bench_phases(ctx: Context, rounds: int = 3) -> dict[str, Any]:
    home = ctx.home("probe-home")
    env = ctx.sbx_env(home)
    runs = []
    for i in range(rounds + 1):  # the first one migrates the database: not counted
        spawned = time.time()
        wall, proc = ctx.run([sys.executable, "-c", PROBE, ctx.label], env=env, cwd=ctx.tmp)
        reaped = time.time()
        data = json.loads(proc.stdout.strip().splitlines()[-1])
        if i:
            data["wall"] = wall
            data["startup"] = data["t0_wall"] - spawned
            data["exit"] = reaped - data["end_wall"]
            runs.append(data)
    names = [p[0] for p in runs[0]["phases"]]
    med = {n: median([dict(map(tuple, r["phases"]))[n] for r in runs]) for n in names}
    startup = median([r["startup"] for r in runs])
    rows = [["spawn + python start-up + site (before the script's first line)", ms(startup)]]
    rows += [[n, ms(med[n])] for n in names]
    destroy = {k: median([r[k] for r in runs]) for k in
               ("create_total", "destroy_total", "destroy_ping", "destroy_remove", "destroy_db")}
    rows.insert(1 + names.index("sandbox_view + json"),
                ["Manager.create total (the rows above marked with two spaces)",
                 ms(destroy["create_total"])])
    rows.append(["in-process Manager.destroy (same process; CLI destroy pays start-up again)",
                 ms(destroy["destroy_total"])])
    rows.append(["  of which docker ping / remove_container / db",
                 f"{ms(destroy['destroy_ping'])} / {ms(destroy['destroy_remove'])} / "
                 f"{ms(destroy['destroy_db'])}"])
    exit_s = median([r["exit"] for r in runs])
    rows.append(["interpreter exit (after the last line, until reaped)", ms(exit_s)])
    rows.append(["whole probe process, wall", ms(median([r["wall"] for r in runs]))])
    print_table(["phase of one `sbx create` in a fresh process", "median"], rows,
                title=f"4. Where the time goes in `sbx create` ({rounds} fresh processes)")
    return {"rounds": rounds, "python_startup_s": startup, "python_exit_s": exit_s, "phases_median_s": med, **destroy,
            "runs": runs}


def import_profile(ctx: Context, home: Path, top: int = 10) -> dict[str, Any]:
    env = ctx.sbx_env(home)
    _, proc = ctx.run([sys.executable, "-X", "importtime", "-m", "sandboxer_tui.cli", "ls", "--json"],
                      env=env, cwd=ctx.tmp)
    entries = common.parse_importtime(proc.stderr)
    total_us = sum(e["self_us"] for e in entries)
    top_level = common.top_level_imports(entries)
    by_self = sorted(entries, key=lambda e: -e["self_us"])
    print_table(["top-level import (cumulative)", "ms", "", "module (self time)", "ms"],
                [[a["module"], f"{a['cumulative_us'] / 1000:.1f}", "", b["module"],
                  f"{b['self_us'] / 1000:.1f}"]
                 for a, b in zip(top_level[:top], by_self[:top], strict=False)],
                title=f"5. Imports of `sbx ls --json` (python -X importtime, one run; "
                      f"{len(entries)} modules, {total_us / 1000:.0f} ms in total)")
    return {"modules": len(entries), "total_ms": total_us / 1000,
            "top_cumulative": top_level[:top], "top_self": by_self[:top]}


# -- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds per measurement (default 10)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    meta = common.preflight()
    ctx = Context(args.rounds)
    meta.update(run_id=ctx.run_id, label=ctx.label, rounds=args.rounds, sbx=" ".join(ctx.sbx))
    common.print_banner("lifecycle", ctx, meta)

    started = time.perf_counter()
    results: dict[str, Any] = {"meta": meta}
    try:
        # this process's own sbx state, away from the user's
        with ctx.in_process(ctx.home("inproc-home")):
            results["cli"] = bench_cli(ctx)
            results["manager"] = asyncio.run(bench_manager(ctx))
            results["ls"] = bench_ls(ctx)
            results["phases"] = bench_phases(ctx)
            results["imports"] = import_profile(ctx, results["ls"].pop("home"))
    finally:
        ctx.cleanup()
        common.print_notes(ctx)
        if ctx.sbx_live or ctx.containers:
            print(f"WARNING: not removed: {sorted(ctx.sbx_live)} {sorted(ctx.containers)}",
                  file=sys.stderr)

    cli, mgr, ls = results["cli"], results["manager"], results["ls"]
    summary = [
        ("CLI create+destroy, `sbx server`, after a pause: ratio sbx/docker", cli["ratio"], TARGET_RATIO,
         f"{cli['ratio']:.2f}", f"<= {TARGET_RATIO}"),
        ("Manager.create overhead, median", mgr["create"]["overhead_median_s"], TARGET_OVERHEAD_S,
         ms(mgr["create"]["overhead_median_s"]), f"<= {TARGET_OVERHEAD_S * 1000:.0f} ms"),
        ("Manager.create overhead, p90", mgr["create"]["overhead_p90_s"], TARGET_OVERHEAD_S,
         ms(mgr["create"]["overhead_p90_s"]), f"<= {TARGET_OVERHEAD_S * 1000:.0f} ms"),
        ("Manager.destroy overhead, median", mgr["destroy"]["overhead_median_s"], TARGET_OVERHEAD_S,
         ms(mgr["destroy"]["overhead_median_s"]), f"<= {TARGET_OVERHEAD_S * 1000:.0f} ms"),
        ("Manager.destroy overhead, p90", mgr["destroy"]["overhead_p90_s"], TARGET_OVERHEAD_S,
         ms(mgr["destroy"]["overhead_p90_s"]), f"<= {TARGET_OVERHEAD_S * 1000:.0f} ms"),
        (f"sbx ls --json, {SEED_COUNT} sandboxes, median", ls["median"]["ls_json"], TARGET_LS_S,
         secs(ls["median"]["ls_json"]), f"<= {TARGET_LS_S} s"),
        (f"sbx ls, {SEED_COUNT} sandboxes, median", ls["median"]["ls"], TARGET_LS_S,
         secs(ls["median"]["ls"]), f"<= {TARGET_LS_S} s"),
    ]
    info = [
        [f"  for reference: sbx create+destroy ({mode}) / docker run+rm (medians)",
         f"{ms(cli[mode]['median_total'])} / {ms(cli['docker']['median_total'])}",
         f"{cli[f'ratio_{mode}']:.2f}", "info"]
        for mode in ("one-shot", "resident", "resident back-to-back")
    ]
    common.finish(results, summary, info, run_id=ctx.run_id, started=started,
                  json_path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
