"""Costs against the size of the fleet (issue 36): what `sbx reap` with nothing to do, the
library's `list()`, `sbx ls --json` and `GET /v1/sandboxes` cost at 100, 1,000 and 10,000 live
sandboxes, side by side in one run, and a reap of N due sandboxes against `docker rm -f`.

    .venv/bin/python bench/bench_scale.py [--rounds N] [--sizes 100,1000,10000]
                                          [--reap-counts 10,50,100] [--reap-rounds N] [--json FILE]

The live sandboxes are rows in a fresh SBX_HOME's database (SQLite, and PostgreSQL on
127.0.0.1:5432 as `make test` starts it, in a database this run makes and drops): one sandbox
made through the library, then its row copied with new ids, names and created_at in bulk SQL.
Their backend is a BENCH FIXTURE, `scale` (the module written to the run's temp folder and
registered through the `sandboxer.adapters` entry-point group by a `scalebench-0.dist-info`
there, on PYTHONPATH for every sbx process): its `list()` answers one running object per seeded
row, with the labels the docker adapter puts, from a file in SBX_HOME. It isolates sbx's own
cost from the backend's: no engine holds 10,000 containers here. The fixture's own list()
cost is printed beside the figures (information).

1. `sbx reap` with nothing to do (fresh process), with `sbx server` running and with
   SBX_NO_SERVER=1, on SQLite and on PostgreSQL. Target: the median at the largest size within
   1.2x of the median at the smallest.
2. The library's `Sandboxer.list()` in this process. Target: <= 60 ms at 10,000.
3. `sbx ls --json` with `sbx server`. Target: <= 100 ms at 10,000.
4. `GET /v1/sandboxes?limit=all` from a real `sbx serve` on 127.0.0.1 (when the service
   refuses `limit=all`, the full listing walked in pages of 1,000, and the row says so).
   Information.
5. A reap of N due sandboxes, SBX_CLOCK_OFFSET past their ttl, three ways: `sbx reap` in a
   fresh process with SBX_NO_SERVER=1; `sbx reap` handed to a running `sbx server`; and one
   cycle of a reaper that stays (bench/staying_reaper.py: one process that has reaped once
   before and kept the store and adapters that cycle opened, as `sbx reap --every` and the
   service's timer have after their first cycle; timed inside it, with no process start),
   against `docker rm -f` of N equivalent containers, N = 10, 50, 100, on the real Docker
   engine (bench_reap.py's pieces), with the fixed and per-sandbox parts of each (least
   squares over N). Target: ratio of medians <= 1.2 for each N. Beside them, for
   information, the least a Python reaper can cost (bench/dockerpy_remover.py): docker-py
   alone removing N equivalent containers from 16 threads, in a fresh process (timed from
   outside, as `sbx reap`) and in a process that stays (timed inside, as the staying
   reaper), with no database and no look. Each round runs the six ways in an order of
   DUE_ORDERS, a Williams square (each way in each place, and right after each other way,
   once in six rounds). A round that fails ends part 5; the rounds before it are kept and
   the results say where it stopped (bench_due).

Each row is the median of --rounds rounds (default 10; sizes and modes interleaved within a
round, the sizes' order alternating), with the fitted cost per row (least squares slope over
the sizes). Every round checks its answer: the listing has N rows, the reap says nothing (and
at the end the database still holds N running rows and each `sbx server` served its reaps),
the due reap destroys exactly N. Every container carries `sbx-bench=<runid>` and only this
run's are removed, by id; the PostgreSQL database is this run's own and dropped. Exit 0
whatever the figures. Run from an export of a commit (`git archive`, no git work tree),
SBX_BENCH_COMMIT names that commit for the results' meta block.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import bench_reap
import common
from bench_service import Context as ServiceContext
from common import median, ms, print_table, secs

TARGET_REAP_GROWTH = 1.2
TARGET_LIST_S = 0.060
TARGET_LS_S = 0.100
TARGET_REAP_RATIO = 1.2
# part 5: fresh sbx reap, with sbx server, a reaper that stays (bench/staying_reaper.py), docker;
# then, for information, the least a Python reaper can cost (bench/dockerpy_remover.py: docker-py
# alone, in a fresh process and in one that stays)
DUE_ARMS = ("sbx", "sbx server", "staying", "docker", "docker-py", "docker-py staying")
DUE_TITLES = {"sbx": "sbx reap (no server)", "sbx server": "with sbx server",
              "staying": "a reaper that stays", "docker": "docker rm -f",
              "docker-py": "docker-py, fresh", "docker-py staying": "docker-py, stays"}


def williams(n: int) -> list[list[int]]:
    """A Williams square for an even n: each way in each place once, and right after each
    other way once, in n rounds (a way that follows another's removals finds dockerd still
    busy with them)."""
    first = [0] + [(k + 1) // 2 if k % 2 else n - k // 2 for k in range(1, n)]
    return [[(x + i) % n for x in first] for i in range(n)]


# the order of the ways in each round
DUE_ORDERS = [[DUE_ARMS[i] for i in row] for row in williams(len(DUE_ARMS))]
PG = os.environ.get("SBX_TEST_PG", "sbx_test:sbx_test@127.0.0.1:5432")
TIMEOUT_S = 600
# each call of part 5: removing 100 takes about 3 s here; an engine that has not answered in
# two minutes has stopped (see bench_due)
DUE_TIMEOUT_S = 120

# The bench fixture's module, written to the run's temp folder (see the module docstring).
FIXTURE = '''"""BENCH FIXTURE of bench/bench_scale.py, not a backend: list() answers one running object
per sandbox the benchmark seeded, from $SBX_HOME/scalebench-objects.json, so sbx's own cost is
measured at 10,000 sandboxes without an engine holding 10,000 containers."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

from sandboxer.adapters.base import LABEL_ID, Adapter, BackendObject, Health, state_folder

FILE = "scalebench-objects.json"


class ScaleAdapter(Adapter):
    name = "scale"
    description = "bench fixture of bench/bench_scale.py: list() from a file it wrote"
    test_double = True

    def _path(self):
        return state_folder() / FILE

    def _load(self) -> dict:
        try:
            return json.loads(self._path().read_text())
        except FileNotFoundError:
            return {"groups": []}

    def _save(self, data: dict) -> None:
        tmp = self._path().with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self._path())

    def _objects(self):
        for group in self._load()["groups"]:
            created = datetime.fromisoformat(group["created_at"])
            common = group["labels"]
            for ref, sid in group["refs"].items():
                yield BackendObject(ref, {**common, LABEL_ID: sid}, "running", True, created)

    async def create(self, request) -> BackendObject:
        data = self._load()
        labels = {k: v for k, v in request.labels.items() if k != LABEL_ID}
        ref = f"scale-{request.sandbox_id}"
        now = datetime.now(UTC)
        data["groups"].append({"labels": labels, "created_at": now.isoformat(),
                               "refs": {ref: request.sandbox_id}})
        self._save(data)
        return BackendObject(ref, dict(request.labels), "running", True, now)

    async def destroy(self, ref: str, *, services: bool = True) -> None:
        data = self._load()
        for group in data["groups"]:
            group["refs"].pop(ref, None)
        self._save(data)

    async def get(self, ref: str):
        return next((o for o in self._objects() if o.ref == ref), None)

    async def list(self, labels) -> list:
        want = dict(labels).items()
        return [o for o in self._objects() if want <= o.labels.items()]

    async def change_marker(self, labels, since):
        """list() answers from the objects file alone: its size and time change with it."""
        try:
            stat = self._path().stat()
        except FileNotFoundError:
            return "no file"
        return f"{stat.st_mtime_ns}:{stat.st_size}"

    async def health(self) -> Health:
        return Health(True, True, "bench fixture (bench/bench_scale.py)")
'''


class Context(ServiceContext):
    """The run: its temp folder holds the fixture; every sbx process finds it (PYTHONPATH)."""

    def __init__(self) -> None:
        super().__init__("sbx-bench-scale-")
        self.timeout = TIMEOUT_S
        self.fixture = self.tmp / "fixture"
        dist = self.fixture / "scalebench-0.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: scalebench\nVersion: 0\n")
        (dist / "entry_points.txt").write_text(
            "[sandboxer.adapters]\nscale = bench_scale_adapter:ScaleAdapter\n")
        (self.fixture / "bench_scale_adapter.py").write_text(FIXTURE)
        sys.path.insert(0, str(self.fixture))  # this process's library finds it too
        self.servers: list[dict[str, str]] = []
        self.pg_databases: list[str] = []

    def sbx_env(self, home: Path, **extra: str) -> dict[str, str]:
        env = super().sbx_env(home, **extra)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(self.fixture), *filter(None, [os.environ.get("PYTHONPATH")])])
        return env

    def start_server(self, env: dict[str, str]) -> None:
        self.run_sbx(env, "server", "start")
        self.servers.append(env)

    def stop_servers(self) -> None:
        for env in self.servers:
            self.run_sbx(env, "server", "stop", check=False)
        self.servers.clear()

    def cleanup(self) -> None:
        self.stop_servers()
        super().cleanup()
        for name in self.pg_databases:
            try:
                drop_pg(name)
            except Exception as exc:  # say so; never leave it unsaid
                self.notes.append(f"cleanup: could not drop PostgreSQL database {name}: {exc}")


# -- PostgreSQL ---------------------------------------------------------------------------------


def _admin():
    import psycopg

    return psycopg.connect(f"postgresql://{PG}/postgres", autocommit=True, connect_timeout=10)


def make_pg(ctx: Context, tag: str) -> str | None:
    """A database of this run's own; its URL, or None (with a note) when no server answers."""
    name = f"sbx_bench_{ctx.run_id}_{tag}"
    try:
        with _admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except Exception as exc:
        ctx.notes.append(f"PostgreSQL at {PG.split('@')[-1]} not usable, its rows skipped: "
                         f"{str(exc).splitlines()[0]}")
        return None
    ctx.pg_databases.append(name)
    return f"postgresql+psycopg://{PG}/{name}"


def drop_pg(name: str) -> None:
    import psycopg

    deadline = time.monotonic() + 60
    with _admin() as conn:
        while True:
            try:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                return
            except psycopg.errors.InsufficientPrivilege:  # an autovacuum worker: wait it out
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


# -- seeding ------------------------------------------------------------------------------------


def seed(ctx: Context, home: Path, url: str, count: int) -> float:
    """`count` live sandboxes on the fixture backend in `home` (database `url`): one made by the
    library, its row copied with new ids and names; deadlines a day away; the fixture's file
    lists one object per row. Returns the seconds it took."""
    import sqlalchemy as sa

    import sandboxer
    from sandboxer.adapters.base import LABEL_HARD_DEADLINE, LABEL_ID
    from sandboxer.core.rules.clock import from_iso, to_iso
    from sandboxer.core.rules.ids import new_sandbox_id
    from sandboxer.core.rules.profiles import Profile
    from sandboxer.core.store.db import Database
    from sandboxer.core.store.models import Sandbox

    started = time.perf_counter()
    with ctx.in_process(home):
        with sandboxer.Sandboxer(home=home, database_url=url, actor="sbx-bench") as sbx:
            first = sbx.create(Profile(name="bench-scale", backend="scale"), labels=ctx.labels,
                               name=f"scale-{uuid.uuid4().hex[:8]}")
    objects_file = home / "scalebench-objects.json"
    objects = json.loads(objects_file.read_text())
    group = objects["groups"][0]
    db = Database(url)
    table = Sandbox.__table__
    try:
        with db.read() as conn:
            row = dict(conn.execute(sa.select(table).where(table.c.id == first.id))
                       .mappings().one())
        created = from_iso(row["created_at"])
        far = to_iso(created + timedelta(days=1))
        t0 = created - timedelta(milliseconds=count)
        rows = []
        for i in range(count - 1):
            sid = new_sandbox_id()
            rows.append({**row, "id": sid, "name": f"scale-{i}-{sid[-6:]}",
                         "backend_ref": f"scale-{sid}", "deadline": far, "hard_deadline": far,
                         "created_at": to_iso(t0 + timedelta(milliseconds=i))})
            group["refs"][f"scale-{sid}"] = sid
        with db.write() as conn:
            conn.execute(sa.update(table).where(table.c.id == first.id)
                         .values(deadline=far, hard_deadline=far))
            for i in range(0, len(rows), 2000):
                conn.execute(sa.insert(table), rows[i:i + 2000])
    finally:
        db.dispose()
    group["labels"][LABEL_HARD_DEADLINE] = far
    group["labels"].pop(LABEL_ID, None)
    objects_file.write_text(json.dumps(objects))
    return time.perf_counter() - started


def running_rows(url: str) -> dict[str, int]:
    import sqlalchemy as sa

    from sandboxer.core.store.db import Database
    from sandboxer.core.store.models import Sandbox

    db = Database(url)
    table = Sandbox.__table__
    try:
        with db.read() as conn:
            return dict(conn.execute(sa.select(table.c.state, sa.func.count())
                                     .group_by(table.c.state)).all())
    finally:
        db.dispose()


def fixture_list_s(ctx: Context, home: Path, count: int, rounds: int) -> float:
    """The fixture's own list() at this size (information: part of every reap's figure)."""
    import asyncio

    from bench_scale_adapter import ScaleAdapter

    from sandboxer.adapters.base import LABEL_INSTALL

    install = (home / "install-id").read_text().strip()
    times = []
    with ctx.in_process(home):
        adapter = ScaleAdapter()
        for _ in range(rounds):
            started = time.perf_counter()
            got = asyncio.run(adapter.list({LABEL_INSTALL: install}))
            times.append(time.perf_counter() - started)
    if len(got) != count:
        raise RuntimeError(f"the fixture listed {len(got)} objects, expected {count}")
    return median(times)


# -- fits -----------------------------------------------------------------------------------------


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares (intercept, slope) of ys over xs."""
    n = len(xs)
    if n < 2:
        return (ys[0] if ys else float("nan"), float("nan"))
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - slope * mx, slope


def us_per_row(slope_s: float) -> str:
    return "-" if slope_s != slope_s else f"{slope_s * 1e6:.1f} us/row"


# -- 1-4: the fleet-sized measurements ------------------------------------------------------------


def bench_fleet(ctx: Context, sizes: list[int], rounds: int) -> dict[str, Any]:
    import httpx

    import sandboxer

    stores: dict[str, str | None] = {"sqlite": "sqlite", "postgresql": None}
    homes: dict[tuple[str, int], tuple[Path, str]] = {}
    seeded: dict[str, float] = {}
    for store in ("sqlite", "postgresql"):
        for size in sizes:
            home = ctx.home(f"{store}-{size}")
            url = f"sqlite:///{home / 'sbx.db'}" if store == "sqlite" else make_pg(ctx, str(size))
            if url is None:
                stores["postgresql"] = None
                break
            stores[store] = store
            seeded[f"{store} {size}"] = seed(ctx, home, url, size)
            homes[store, size] = (home, url)
    active = [s for s in stores if stores[s]]
    print(f"   seeded {', '.join(f'{k}: {v:.1f} s' for k, v in seeded.items())}", flush=True)

    envs: dict[tuple[str, int, str], dict[str, str]] = {}
    for (store, size), (home, url) in homes.items():
        base = {"SBX_DATABASE_URL": url}
        envs[store, size, "server"] = ctx.sbx_env(home, **base)
        envs[store, size, "no server"] = ctx.sbx_env(home, SBX_NO_SERVER="1", **base)
        ctx.start_server(envs[store, size, "server"])
    services: dict[int, tuple[str, str]] = {}
    for size in sizes:
        services[size] = ctx.serve(homes["sqlite", size][0], "read")
    clients = {size: sandboxer.Sandboxer(home=homes["sqlite", size][0],
                                         database_url=homes["sqlite", size][1],
                                         actor="sbx-bench") for size in sizes}
    http = {size: httpx.Client(base_url=services[size][0], timeout=120,
                               headers={"Authorization": f"Bearer {services[size][1]}"})
            for size in sizes}
    get_form = "limit=all"

    def get_all(size: int) -> tuple[float, int]:
        """(seconds until the whole listing has arrived, records in it). With `limit=all` the
        client's decoding of the one document is not timed; walking pages, each page is
        decoded in the time (the next request needs its cursor)."""
        nonlocal get_form
        if get_form == "limit=all":
            started = time.perf_counter()
            response = http[size].get("/v1/sandboxes", params={"limit": "all"})
            elapsed = time.perf_counter() - started  # the body is read: httpx reads it all
            if response.status_code == 200:
                body = response.json()
                return elapsed, len(body["items"] if isinstance(body, dict) else body)
            if response.status_code not in (400, 422):
                response.raise_for_status()
            get_form = "pages of 1000 (limit=all refused)"
        count, cursor = 0, None
        started = time.perf_counter()
        while True:
            params = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
            response = http[size].get("/v1/sandboxes", params=params)
            response.raise_for_status()
            body = response.json()
            count += len(body["items"])
            cursor = body.get("next_cursor")
            if not cursor:
                return time.perf_counter() - started, count

    def check(what: str, got: int, size: int) -> None:
        if got != size:
            raise RuntimeError(f"{what} listed {got} sandboxes, expected {size}")

    def reap(env: dict[str, str], what: str) -> float:
        ctx.settle(env)
        elapsed, proc = ctx.run_sbx(env, "reap")
        said = (proc.stdout + proc.stderr).strip()
        if said:
            raise RuntimeError(f"{what}: sbx reap with nothing to do said: {said[:300]}")
        return elapsed

    def sees_fixture(env: dict[str, str], home: Path, what: str) -> None:
        """A reaper that never loaded the fixture would be silent too: hide one object, and
        `sbx reap --dry-run` in this very setting must plan that sandbox lost, and only it."""
        objects_file = home / "scalebench-objects.json"
        original = objects_file.read_text()
        objects = json.loads(original)
        ref, sid = objects["groups"][-1]["refs"].popitem()
        objects_file.write_text(json.dumps(objects))
        try:
            ctx.settle(env)
            _, proc = ctx.run_sbx(env, "reap", "--dry-run", "--json")
        finally:
            objects_file.write_text(original)
        planned = json.loads(proc.stdout).get("planned", [])
        if [(p["id"], p["action"]) for p in planned] != [(sid, "lose")]:
            raise RuntimeError(f"{what}: with {ref} hidden, sbx reap --dry-run planned "
                               f"{planned[:3]}, not that one sandbox lost: the reaper does "
                               "not see the bench fixture")

    times: dict[str, dict[int, list[float]]] = {}

    def timed(key: str, size: int, seconds: float) -> None:
        times.setdefault(key, {}).setdefault(size, []).append(seconds)

    try:
        for size in sizes:  # warm-up and first check of every path, not counted
            for store in active:
                for mode in ("server", "no server"):
                    sees_fixture(envs[store, size, mode], homes[store, size][0],
                                 f"{store} {size} {mode}")
                    reap(envs[store, size, mode], f"{store} {size} {mode}")
            check("Sandboxer.list()", len(clients[size].list()), size)
            _, proc = ctx.run_sbx(envs["sqlite", size, "server"], "ls", "--json")
            check("sbx ls --json", len(json.loads(proc.stdout)), size)
            check("GET /v1/sandboxes", get_all(size)[1], size)
        for r in range(rounds):
            for size in (sizes if r % 2 == 0 else sizes[::-1]):  # no size always goes first
                for store in active:
                    for mode in ("server", "no server"):
                        timed(f"reap {store} {mode}", size,
                              reap(envs[store, size, mode], f"{store} {size} {mode}"))
                started = time.perf_counter()
                got = len(clients[size].list())
                timed("list", size, time.perf_counter() - started)
                check("Sandboxer.list()", got, size)
                env = envs["sqlite", size, "server"]
                ctx.settle(env)
                elapsed, proc = ctx.run_sbx(env, "ls", "--json")
                timed("ls", size, elapsed)
                check("sbx ls --json", len(json.loads(proc.stdout)), size)
                elapsed, got = get_all(size)
                timed("get", size, elapsed)
                check("GET /v1/sandboxes", got, size)
            print(f"   round {r + 1}/{rounds} done", flush=True)
        for (store, size, mode), env in envs.items():  # the server really took them
            if mode == "server" and store in active:
                _, proc = ctx.run_sbx(env, "server", "status", "--json")
                served = json.loads(proc.stdout).get("served", 0)
                if served < rounds:
                    raise RuntimeError(f"{store} {size}: sbx server served {served} commands, "
                                       f"fewer than the {rounds} timed reaps")
    finally:
        for client in clients.values():
            client.close()
        for h in http.values():
            h.close()
        ctx.stop_servers()
    for (store, size), (_, url) in homes.items():
        states = running_rows(url)
        if states != {"running": size}:
            raise RuntimeError(f"{store} {size}: after the idle reaps the database holds "
                               f"{states}")
    fixture = {size: fixture_list_s(ctx, homes["sqlite", size][0], size, rounds)
               for size in sizes}

    names = {f"reap {s} {m}": f"sbx reap, nothing to do, {m}, {s}"
             for s in active for m in ("server", "no server")}
    names.update({"list": "library Sandboxer.list()",
                  "ls": "sbx ls --json, with sbx server",
                  "get": f"GET /v1/sandboxes, {get_form}"})
    medians = {key: {size: median(v) for size, v in per.items()} for key, per in times.items()}
    slopes = {key: fit([float(s) for s in sizes], [m[s] for s in sizes])[1]
              for key, m in medians.items()}
    rows = [[names[key], *[ms(medians[key][s]) for s in sizes], us_per_row(slopes[key])]
            for key in names]
    rows.append(["(bench fixture's own list(), in every reap)", *[ms(fixture[s]) for s in sizes],
                 us_per_row(fit([float(s) for s in sizes], [fixture[s] for s in sizes])[1])])
    print_table(["measure (median)", *[f"{s:,}" for s in sizes], "growth"], rows,
                title=f"1-4. With 100s to 10,000s of live sandboxes ({rounds} rounds, medians)")
    return {"sizes": sizes, "rounds": rounds, "stores": active, "get_form": get_form,
            "names": names, "times_s": times, "median_s": medians, "slope_s_per_row": slopes,
            "fixture_list_s": fixture, "seed_s": seeded}


# -- 5. a reap of N due sandboxes against docker rm -f ---------------------------------------------


REMOVER = Path(__file__).with_name("dockerpy_remover.py")


def due_arm(ctx: Context, arm: str, n: int, r: int, remover: subprocess.Popen) -> float:
    """Seconds to remove N due sandboxes one way (DUE_ARMS), checked: every one gone.
    `remover`: the docker-py process that stays (bench/dockerpy_remover.py stay)."""
    if arm.startswith("docker"):
        cids, _ = bench_reap.docker_containers(ctx, n)
        if arm == "docker":
            rm_s, _ = ctx.run(["docker", "rm", "-f", *cids])
        elif arm == "docker-py":
            rm_s, _ = ctx.run([sys.executable, str(REMOVER), "once", *cids], cwd=ctx.tmp)
        else:
            rm_s = float(ask(remover, " ".join(cids)))
        if ctx.still_present(set(cids)):
            raise RuntimeError(f"{arm} left containers")
        ctx.containers -= set(cids)
        return rm_s
    home = ctx.home(f"due-{n}-{r}-{arm.replace(' ', '-')}")
    if arm == "staying":
        return staying_arm(ctx, home, n)
    ids, _ = bench_reap.make_sandboxes(ctx, home, n, "1m")
    refs = set(ctx.containers)
    if arm == "sbx server":
        ctx.start_server(ctx.sbx_env(home))
        env = ctx.sbx_env(home, SBX_CLOCK_OFFSET="2m")
    else:
        env = ctx.sbx_env(home, SBX_CLOCK_OFFSET="2m", SBX_NO_SERVER="1")
    reap_s, proc = ctx.run_sbx(env, "reap", "--json")
    ctx.stop_servers()
    check_due_reap(ctx, home, ids, refs, json.loads(proc.stdout))
    return reap_s


def staying_arm(ctx: Context, home: Path, n: int) -> float:
    """A reaper that stays (bench/staying_reaper.py) is started and reaps once before the N
    sandboxes are made; their ttl has passed on its clock (SBX_CLOCK_OFFSET), so its next
    cycle, the one timed, finds them due. Each of its cycles gives up after the run's
    timeout, so a line is always read (or the process ends)."""
    env = ctx.sbx_env(home, SBX_CLOCK_OFFSET="2m")
    reaper = staying_process(ctx, [str(Path(__file__).with_name("staying_reaper.py")),
                                   str(ctx.timeout)], env)
    try:
        ids, _ = bench_reap.make_sandboxes(ctx, home, n, "1m")
        refs = set(ctx.containers)
        cycle = json.loads(ask(reaper, "reap"))
    finally:
        end_staying(ctx, reaper)
    check_due_reap(ctx, home, ids, refs, cycle["report"])
    return cycle["seconds"]


def staying_process(ctx: Context, args: list[str], env: dict[str, str]) -> subprocess.Popen:
    """A Python process of this bench that stays, once it has said `ready`."""
    proc = subprocess.Popen([sys.executable, *args], env=env, cwd=ctx.tmp,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"{Path(args[0]).name} did not start (exit {proc.wait()})")
    return proc


def ask(proc: subprocess.Popen, line: str) -> str:
    """One line to a staying process, its one line back."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    answer = proc.stdout.readline()
    if not answer:
        raise RuntimeError(f"a staying process exited {proc.wait()} before answering")
    return answer


def end_staying(ctx: Context, proc: subprocess.Popen) -> None:
    """Its stdin closed, so it ends; killed if it does not within the run's timeout."""
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        if proc.wait(ctx.timeout):
            raise RuntimeError(f"a staying process exited {proc.returncode}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def check_due_reap(ctx: Context, home: Path, ids: list[str], refs: set[str],
                   report: dict[str, Any]) -> None:
    """Every due sandbox destroyed, none failed, no container left, every row destroyed."""
    n = len(ids)
    left = ctx.still_present(refs)
    if sorted(report["destroyed"]) != sorted(ids) or report["failed"] or left:
        raise RuntimeError(f"sbx reap destroyed {len(report['destroyed'])} of {n}; "
                           f"failed {report['failed'][:3]}; {len(left)} left")
    if bench_reap.states(home) != {"destroyed": n}:
        raise RuntimeError(f"after sbx reap the database holds {bench_reap.states(home)}")
    ctx.containers -= refs


def bench_due(ctx: Context, counts: list[int], rounds: int) -> dict[str, Any]:
    """Part 5. A round that fails (the engine stopped answering: dockerd 20.10 on this 2-core
    VM has, after 10-15 minutes of this churn, left a removal unanswered) ends the part; the
    rounds completed before it are kept, and the results say where it stopped. With no
    complete round the error is raised."""
    samples: dict[int, dict[str, list[float]]] = {
        n: {arm: [] for arm in DUE_ARMS} for n in counts}
    stopped = None
    ctx.timeout = DUE_TIMEOUT_S  # kept for the cleanup after it: part 5 is the run's last part
    remover = staying_process(ctx, [str(REMOVER), "stay"], ctx.sbx_env(ctx.home("docker-py")))
    try:
        for r in range(rounds):
            got: dict[int, dict[str, float]] = {n: {} for n in counts}
            try:
                for n in counts:
                    for arm in DUE_ORDERS[r % len(DUE_ORDERS)]:
                        got[n][arm] = due_arm(ctx, arm, n, r, remover)
                    print(f"   round {r + 1}/{rounds}, N={n}: " + ", ".join(
                        f"{DUE_TITLES[arm]} {got[n][arm]:.2f} s" for arm in DUE_ARMS),
                        flush=True)
            except Exception as exc:
                if not r:
                    raise
                stopped = f"round {r + 1} of {rounds} failed, so part 5 has {r}: " + " ".join(
                    f"{type(exc).__name__}: {exc}".split())[:300]
                print(f"   {stopped}", flush=True)
                break
            for n in counts:
                for arm in DUE_ARMS:
                    samples[n][arm].append(got[n][arm])
    finally:
        end_staying(ctx, remover)
    rounds = len(samples[counts[0]][DUE_ARMS[0]])
    med = {n: {k: median(v) for k, v in s.items()} for n, s in samples.items()}
    fits = {k: fit([float(n) for n in counts], [med[n][k] for n in counts]) for k in DUE_ARMS}
    ways = [arm for arm in DUE_ARMS if arm != "docker"]
    rows = [[f"N = {n}", *(secs(med[n][k]) for k in DUE_ARMS),
             *(f"{med[n][k] / med[n]['docker']:.2f}" for k in ways)] for n in counts]
    rows += [[f"fit: fixed + per sandbox ({k})", f"{fits[k][0]:.3f} s + {ms(fits[k][1])}",
              *[""] * (len(DUE_ARMS) + len(ways) - 1)] for k in DUE_ARMS]
    print_table(["N due", *(DUE_TITLES[k] for k in DUE_ARMS),
                 *(f"ratio, {DUE_TITLES[k]}" for k in ways)], rows,
                title=f"5. A reap of N due sandboxes against docker rm -f ({rounds} round(s), "
                      "medians; fresh `sbx reap` with SBX_NO_SERVER=1, with `sbx server`, "
                      "one cycle of a reaper that stays, as `sbx reap --every` runs it; and "
                      "docker-py alone, the least a Python reaper can cost)")
    if stopped:
        print(f"   part 5 stopped early: {stopped}", flush=True)
    return {"counts": counts, "rounds": rounds, "samples_s": samples, "median_s": med,
            "fit": {k: {"fixed_s": f[0], "per_sandbox_s": f[1]} for k, f in fits.items()},
            **({"stopped": stopped} if stopped else {})}


# -- main -------------------------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    values = sorted({int(v) for v in text.split(",") if v.strip()})
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: positive whole numbers, comma-separated")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds of parts 1-4 (default 10)")
    parser.add_argument("--sizes", type=int_list, default=[100, 1000, 10000],
                        help="live sandboxes (default 100,1000,10000)")
    parser.add_argument("--reap-counts", type=int_list, default=[10, 50, 100],
                        help="due sandboxes of part 5 (default 10,50,100)")
    parser.add_argument("--reap-rounds", type=int, default=6,
                        help="rounds of part 5 (default 6, the six ways' orders of DUE_ORDERS "
                             "once: balanced in multiples of 6; 0 leaves it out)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.reap_rounds < 0:
        parser.error("--rounds must be at least 1 and --reap-rounds at least 0")

    meta = common.preflight(TIMEOUT_S)
    if not meta["git_commit"] and os.environ.get("SBX_BENCH_COMMIT"):
        # run from an export (git archive) of a commit, which is no git work tree
        meta["git_commit"] = os.environ["SBX_BENCH_COMMIT"]
        meta["source"] = f"export of {meta['git_commit']} at {common.ROOT}"
    ctx = Context()
    meta.update(run_id=ctx.run_id, label=ctx.label, sbx=" ".join(ctx.sbx), rounds=args.rounds,
                sizes=args.sizes, reap_counts=args.reap_counts, reap_rounds=args.reap_rounds)
    common.print_banner("scale", ctx, meta)
    started = time.perf_counter()
    results: dict[str, Any] = {"meta": meta}
    try:
        results["fleet"] = bench_fleet(ctx, args.sizes, args.rounds)
        if args.reap_rounds:
            results["due"] = bench_due(ctx, args.reap_counts, args.reap_rounds)
    finally:
        ctx.cleanup()
        common.print_notes(ctx)

    fleet, sizes = results["fleet"], args.sizes
    small, large = sizes[0], sizes[-1]
    med = fleet["median_s"]
    summary = []
    for store in fleet["stores"]:
        for mode in ("server", "no server"):
            m = med[f"reap {store} {mode}"]
            growth = m[large] / m[small]
            summary.append((f"sbx reap, nothing to do, {mode}, {store}: {large:,} / {small:,}",
                            growth, TARGET_REAP_GROWTH, f"{growth:.2f}",
                            f"<= {TARGET_REAP_GROWTH}"))
    summary.append((f"library list() at {large:,}", med["list"][large], TARGET_LIST_S,
                    ms(med["list"][large]), f"<= {ms(TARGET_LIST_S)}"))
    summary.append((f"sbx ls --json, with sbx server, at {large:,}", med["ls"][large],
                    TARGET_LS_S, ms(med["ls"][large]), f"<= {ms(TARGET_LS_S)}"))
    info = [[f"GET /v1/sandboxes, {fleet['get_form']}, at {large:,}", ms(med["get"][large]),
             f"growth {us_per_row(fleet['slope_s_per_row']['get'])}", "info"]]
    if "due" in results:
        due = results["due"]
        short = f" ({due['rounds']} of {args.reap_rounds} rounds)" if "stopped" in due else ""
        for n in due["counts"]:
            for arm, how in (("sbx", ""), ("sbx server", ", with sbx server"),
                             ("staying", ", one cycle of a reaper that stays "
                                         "(sbx reap --every)")):
                ratio = due["median_s"][n][arm] / due["median_s"][n]["docker"]
                summary.append((f"sbx reap of {n} due{how} / docker rm -f of {n}{short}", ratio,
                                TARGET_REAP_RATIO, f"{ratio:.2f}", f"<= {TARGET_REAP_RATIO}"))
        for n in due["counts"]:
            m = due["median_s"][n]
            info.append([f"docker-py alone removing {n}, a fresh process / docker rm -f",
                         f"{m['docker-py'] / m['docker']:.2f}", "the least a one-shot reap",
                         "info"])
            info.append([f"docker-py alone removing {n}, a process that stays / docker rm -f",
                         f"{m['docker-py staying'] / m['docker']:.2f}",
                         "the least a reaper that stays", "info"])
            info.append([f"a reaper that stays / docker-py that stays, {n} due",
                         f"{m['staying'] / m['docker-py staying']:.2f}", "sbx's own part",
                         "info"])
        for k, f in due["fit"].items():
            info.append([f"reap of N due, {k}: fixed + per sandbox",
                         f"{f['fixed_s']:.3f} s + {ms(f['per_sandbox_s'])}", "", "info"])
        if "stopped" in due:
            info.append([f"part 5 stopped early: {due['stopped']}", "", "", "info"])
    common.finish(results, summary, info, run_id=ctx.run_id, started=started,
                  json_path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
