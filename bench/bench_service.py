"""The service (`sbx serve`) against docker-py, under 32 concurrent clients, and listing a large
inventory over HTTP, on the real local Docker engine.

    .venv/bin/python bench/bench_service.py [--rounds N] [--clients N] [--cycles N]
                                            [--rows N] [--list-rounds N] [--json FILE]

Each measurement runs against a real `sbx serve --listen 127.0.0.1:PORT --reap-every 0`
process (its own SBX_HOME, SBX_SERVER_AUTOSTART=0, a key made with `sbx api-keys create`),
driven over HTTP from this process; network traffic goes to 127.0.0.1 only.

1. `AsyncSandboxer(url=, token=).create("default")` + `Sandbox.destroy()` (POST and DELETE
   /v1/sandboxes) against docker-py's `containers.run(detach=True)` + `remove(force=True,
   v=True)` with the image, command, limits and restart policy the docker adapter gives the
   default profile, rounds interleaved with the order alternated each round. Target: ratio
   of medians <= 1.08; a bootstrap 90% interval beside it says how far it could move from
   run to run.
2. 32 concurrent clients (`--clients`), one AsyncSandboxer each, every one doing 16
   (`--cycles`) create / exec(["true"]) / destroy cycles through the service. Targets: 0
   errors, 0 leaked containers (the engine asked for this run's label afterwards, and the
   service's inventory for live sandboxes with it). Median and p99 latency per operation.
3. `GET /v1/sandboxes` with httpx over 10,000 (`--rows`) sandboxes in the service's
   database: one sandbox made on the `stub` backend by the library, its row copied 9,999
   times with new ids (SQLite, one transaction). By default the route answers the first page,
   100 records oldest first, and a `next_cursor`: that is what a client gets by default and
   what the target judges. Target: median <= 50 ms (request, whole body, JSON decode). For
   information: a page of 1,000, the 100 after row 9,000 (a cursor deep in), and the whole
   inventory through the library (`Sandboxer(url=).list()`, pages of 1,000).

The timer (`--reap-every`) is off, so no reaper cycle lands among the timed requests. Every
container carries `sbx-bench=<runid>`; what the run made is destroyed through sbx, and
anything still carrying the label is removed by id. Never prunes. Exit 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import common
from common import BenchContext, median, ms, print_table, ratio_interval

TARGET_RATIO = 1.08
TARGET_LIST_S = 0.050
PROFILE = "default"
DEFAULT_PAGE = 100  # the route's default `limit` (docs/service.md)


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not xs:
        return math.nan
    ordered = sorted(xs)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def docker_spec(ctx: BenchContext) -> dict[str, Any]:
    """docker-py's `containers.run` arguments for what adapters/docker.py makes of the default
    profile (common.DOCKER_LIMITS; the adapter's restart policy and init=False too)."""
    from sandboxer.adapters.docker import KEEPALIVE, RESTART_POLICY

    return dict(image=common.IMAGE, command=KEEPALIVE, detach=True, network_mode="none",
                cap_drop=["ALL"], security_opt=["no-new-privileges"], mem_limit=512 * 1024**2,
                memswap_limit=512 * 1024**2, nano_cpus=10**9, pids_limit=256, init=False,
                restart_policy=dict(RESTART_POLICY), labels=dict(ctx.labels))


class Context(BenchContext):
    """A run that starts real `sbx serve` processes (bench_files.py's too)."""

    def __init__(self, prefix: str = "sbx-bench-service-") -> None:
        super().__init__(prefix)
        self.services: list[tuple[subprocess.Popen, Path]] = []
        self.docker_homes: list[Path] = []

    def served_home(self, name: str = "service", scope: str = "write",
                    ) -> tuple[Path, str, str]:
        """A new home `name` whose Docker sandboxes cleanup removes, served by a real `sbx
        serve` (serve): (the home, its URL, a key of `scope`)."""
        home = self.home(name)
        self.docker_homes.append(home)
        return (home, *self.serve(home, scope))

    def serve(self, home: Path, scope: str) -> tuple[str, str]:
        """A key of `scope` in `home`, then a real `sbx serve` on a free 127.0.0.1 port for
        it; (its URL, the key) once it answers /healthz."""
        import httpx

        env = self.sbx_env(home)
        _, proc = self.run_sbx(env, "api-keys", "create", "--scope", scope, "--owner",
                               "sbx-bench")
        token = proc.stdout.split()[-1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        log = self.tmp / f"serve-{home.name}.log"
        with log.open("w") as out:
            serve = subprocess.Popen([*self.sbx, "serve", "--listen", f"127.0.0.1:{port}",
                                      "--reap-every", "0"], env=env, cwd=self.tmp,
                                     stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        self.services.append((serve, log))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            if serve.poll() is not None:
                raise RuntimeError(f"sbx serve exited {serve.returncode}: "
                                   f"{log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    return url, token
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("sbx serve did not answer /healthz within 60 s")
            time.sleep(0.1)

    def cleanup(self) -> None:
        for serve, log in self.services:
            if serve.poll() is None:
                serve.terminate()
                try:
                    serve.wait(30)
                except subprocess.TimeoutExpired:
                    serve.kill()
                    serve.wait(10)
                    self.notes.append(f"cleanup: sbx serve {serve.pid} killed after 30 s")
            if serve.returncode not in (0, -15):
                self.notes.append(f"sbx serve exited {serve.returncode}: "
                                  f"{log.read_text()[-1000:]}")
        for home in self.docker_homes:  # what the service left live, destroyed through sbx
            env = self.sbx_env(home, SBX_NO_SERVER="1")
            try:
                _, proc = self.run_sbx(env, "ls", "--json")
                ids = [b["id"] for b in json.loads(proc.stdout)]
                if ids:
                    self.run_sbx(env, "destroy", "--yes", *ids, check=False)
                    self.notes.append(f"cleanup: sbx destroy of {len(ids)} sandbox(es) in "
                                      f"{home.name}")
            except Exception as exc:  # keep going: the label sweep below removes the rest
                self.notes.append(f"cleanup of {home}: {exc}")
        super().cleanup()


# -- 1. create + destroy through the service against docker-py --------------------------------


async def bench_create_destroy(ctx: Context, url: str, token: str,
                               rounds: int) -> dict[str, Any]:
    """The service, docker-py, and (for information: what HTTP adds) the library in process
    on a home of its own, in an order rotated each round."""
    import docker

    import sandboxer

    client = docker.from_env(version="auto")
    spec = docker_spec(ctx)
    times: dict[str, list[float]] = {"service": [], "docker": [], "library": []}

    async def docker_once() -> float:
        started = time.perf_counter()
        container = client.containers.run(**spec)
        ctx.containers.add(container.id)
        container.remove(force=True, v=True)
        elapsed = time.perf_counter() - started
        ctx.containers.discard(container.id)
        return elapsed

    async def sbx_once(sbx: sandboxer.AsyncSandboxer) -> float:
        started = time.perf_counter()
        box = await sbx.create(PROFILE, labels=ctx.labels)
        await box.destroy()
        return time.perf_counter() - started

    library_home = ctx.home("library")
    ctx.docker_homes.append(library_home)
    try:
        async with sandboxer.AsyncSandboxer(url=url, token=token) as remote, \
                sandboxer.AsyncSandboxer(home=library_home, actor="sbx-bench") as local:
            arms = {"service": lambda: sbx_once(remote), "docker": docker_once,
                    "library": lambda: sbx_once(local)}
            names = list(arms)
            for _ in range(2):  # warm-up: the service's first create, the connections, caches
                for name in names:
                    await arms[name]()
            for i in range(rounds):
                for name in names[i % 3:] + names[:i % 3]:
                    times[name].append(await arms[name]())
    finally:
        client.close()
    result: dict[str, Any] = {name: {"samples_s": v, "median_s": median(v)}
                              for name, v in times.items()}
    med = {name: r["median_s"] for name, r in result.items()}
    result["ratio"] = med["service"] / med["docker"]
    result["ratio_library_to_docker"] = med["library"] / med["docker"]
    result["ratio_service_to_library"] = med["service"] / med["library"]
    result["http_adds_s"] = med["service"] - med["library"]
    low, high = result["ratio_interval"] = ratio_interval(times["service"], times["docker"])
    print_table(["create + destroy (median)", "HTTP service", "docker-py", "ratio",
                 "90% interval", "target"],
                [["seconds", ms(med["service"]), ms(med["docker"]), f"{result['ratio']:.3f}",
                  f"{low:.3f}-{high:.3f}", f"<= {TARGET_RATIO}"]],
                title=f"1. create + destroy, {rounds} interleaved rounds")
    print(f"   for information: the library in process {ms(med['library'])} "
          f"({result['ratio_library_to_docker']:.3f}x docker-py); the service over HTTP adds "
          f"{ms(result['http_adds_s'])} to it ({result['ratio_service_to_library']:.3f}x)")
    return result


# -- 2. concurrent clients ----------------------------------------------------------------------


async def bench_concurrent(ctx: Context, url: str, token: str, clients: int,
                           cycles: int) -> dict[str, Any]:
    import sandboxer

    latency: dict[str, list[float]] = {"create": [], "exec": [], "destroy": []}
    errors: list[dict[str, str]] = []
    labels = {**ctx.labels, "sbx-bench-part": "concurrent"}

    async def one_client(n: int, sbx: sandboxer.AsyncSandboxer) -> None:
        for _ in range(cycles):
            started = time.perf_counter()
            try:
                box = await sbx.create(PROFILE, labels=labels)
            except Exception as exc:
                errors.append({"client": str(n), "op": "create", "error": repr(exc)[:300]})
                continue
            latency["create"].append(time.perf_counter() - started)
            started = time.perf_counter()
            try:
                result = await box.exec(["true"])
                if result.exit_code != 0:
                    raise RuntimeError(f"exec exited {result.exit_code}")
                latency["exec"].append(time.perf_counter() - started)
            except Exception as exc:
                errors.append({"client": str(n), "op": "exec", "error": repr(exc)[:300]})
            started = time.perf_counter()
            try:
                await box.destroy()
                latency["destroy"].append(time.perf_counter() - started)
            except Exception as exc:
                errors.append({"client": str(n), "op": "destroy", "error": repr(exc)[:300]})

    sbxs = [sandboxer.AsyncSandboxer(url=url, token=token) for _ in range(clients)]
    try:
        await asyncio.gather(*(s.profile(PROFILE) for s in sbxs))  # untimed: each connects
        started = time.perf_counter()
        await asyncio.gather(*(one_client(n, s) for n, s in enumerate(sbxs)))
        wall = time.perf_counter() - started
        # leaks: live sandboxes the service still lists, containers the engine still holds
        live = [b.id for b in await sbxs[0].list(labels=labels)]
    finally:
        await asyncio.gather(*(s.close() for s in sbxs), return_exceptions=True)
    leaked = ctx.labelled()  # the run's label: the only containers left should be none
    ops = {op: {"count": len(v), "median_s": median(v), "p99_s": percentile(v, 99),
                "max_s": max(v) if v else math.nan, "samples_s": v}
           for op, v in latency.items()}
    result = {"clients": clients, "cycles": cycles, "wall_s": wall,
              "cycles_per_s": clients * cycles / wall, "ops": ops, "errors": errors,
              "error_count": len(errors), "leaked_containers": leaked,
              "leaked_count": len(leaked), "live_sandboxes_listed": live}
    print_table(["operation", "count", "median", "p99", "max"],
                [[op, r["count"], ms(r["median_s"]), ms(r["p99_s"]), ms(r["max_s"])]
                 for op, r in ops.items()],
                title=f"2. {clients} concurrent clients x {cycles} create/exec/destroy cycles "
                      f"through the service")
    print(f"   {clients * cycles} cycles in {wall:.1f} s ({result['cycles_per_s']:.1f} "
          f"cycles/s); errors: {len(errors)}; containers left with {ctx.label}: "
          f"{len(leaked)}; live sandboxes the service lists: {len(live)}")
    for err in errors[:5]:
        print(f"   error: client {err['client']} {err['op']}: {err['error']}")
    return result


# -- 3. GET /v1/sandboxes over 10,000 rows ------------------------------------------------------


def seed(ctx: Context, home: Path, count: int) -> float:
    """`count` sandboxes in `home`'s database: one made by the library on the stub backend,
    its row copied with new ids, one millisecond apart. Returns the seconds it took."""
    from datetime import timedelta

    import sqlalchemy as sa

    import sandboxer
    from sandboxer.core.rules.clock import from_iso, to_iso
    from sandboxer.core.rules.ids import new_sandbox_id
    from sandboxer.core.rules.profiles import Profile
    from sandboxer.core.store.db import Database
    from sandboxer.core.store.models import Sandbox

    started = time.perf_counter()
    with sandboxer.Sandboxer(home=home, actor="sbx-bench") as sbx:
        first = sbx.create(Profile(name="bench-stub", backend="stub"), labels=ctx.labels)
    db = Database(f"sqlite:///{home / 'sbx.db'}")
    table = Sandbox.__table__
    try:
        with db.read() as conn:
            row = dict(conn.execute(sa.select(table).where(table.c.id == first.id))
                       .mappings().one())
        t0 = from_iso(row["created_at"]) - timedelta(milliseconds=count)
        rows = []
        for i in range(count - 1):
            sid = new_sandbox_id()
            rows.append({**row, "id": sid, "backend_ref": f"stub-{sid}",
                         "created_at": to_iso(t0 + timedelta(milliseconds=i))})
        with db.write() as conn:
            for i in range(0, len(rows), 2000):
                conn.execute(sa.insert(table), rows[i:i + 2000])
    finally:
        db.dispose()
    return time.perf_counter() - started


def bench_list(ctx: Context, rows: int, rounds: int) -> dict[str, Any]:
    import httpx

    import sandboxer

    home = ctx.home("list")
    seed_s = seed(ctx, home, rows)
    url, token = ctx.serve(home, "read")

    def timed(http: httpx.Client, **params: Any) -> tuple[float, dict[str, Any]]:
        started = time.perf_counter()
        response = http.get("/v1/sandboxes",
                            params={k: v for k, v in params.items() if v is not None})
        response.raise_for_status()
        body = response.json()
        return time.perf_counter() - started, body

    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                      timeout=60) as http:
        for _ in range(3):  # warm-up: the connection, the service's first read, page cache
            timed(http)
        _, body = timed(http)
        if len(body["items"]) != min(DEFAULT_PAGE, rows) or (rows > DEFAULT_PAGE) != bool(
                body["next_cursor"]):
            raise RuntimeError(f"the default page held {len(body['items'])} records "
                               f"(next_cursor {body['next_cursor']!r}), expected "
                               f"{min(DEFAULT_PAGE, rows)} of {rows}")
        bytes_default = len(http.get("/v1/sandboxes").content)
        # a cursor deep in: the one after the 9,000th row (90% of them, in hundreds)
        deep_at = rows * 9 // 10 // DEFAULT_PAGE * DEFAULT_PAGE
        step = 1000 if deep_at % 1000 == 0 else DEFAULT_PAGE
        cursor = None
        for _ in range(deep_at // step):
            cursor = timed(http, limit=step, cursor=cursor)[1]["next_cursor"]
        times: dict[str, list[float]] = {"default": [], "limit_1000": [], "deep": []}
        for i in range(rounds):
            times["default"].append(timed(http)[0])
            if i % 2 == 0:  # half as many of the larger pages
                elapsed, body = timed(http, limit=1000)
                times["limit_1000"].append(elapsed)
                if cursor:
                    times["deep"].append(timed(http, cursor=cursor)[0])
    walk = []
    with sandboxer.Sandboxer(url=url, token=token) as remote:
        listed = len(remote.list())
        if listed != rows:
            raise RuntimeError(f"the library listed {listed} sandboxes, expected {rows}")
        for _ in range(max(3, rounds // 10)):
            started = time.perf_counter()
            remote.list()
            walk.append(time.perf_counter() - started)
    result = {"rows": rows, "seed_s": seed_s, "default_page": DEFAULT_PAGE,
              "default_page_bytes": bytes_default, "deep_after_row": deep_at,
              "times_s": {**times, "library_list_all": walk},
              "median_s": {k: median(v) for k, v in {**times, "library_list_all": walk}.items()},
              "p90_s": {k: common.p90(v) for k, v in {**times, "library_list_all": walk}.items()}}
    m, p = result["median_s"], result["p90_s"]
    print_table(["GET /v1/sandboxes", "records", "median", "p90"],
                [["default (limit 100, first page)", min(DEFAULT_PAGE, rows), ms(m["default"]),
                  ms(p["default"])],
                 ["limit=1000, first page", min(1000, rows), ms(m["limit_1000"]),
                  ms(p["limit_1000"])],
                 [f"default, cursor after row {deep_at}", DEFAULT_PAGE, ms(m["deep"]),
                  ms(p["deep"])],
                 ["Sandboxer(url=).list(): all, pages of 1000", rows,
                  ms(m["library_list_all"]), ms(p["library_list_all"])]],
                title=f"3. GET /v1/sandboxes over {rows} sandboxes ({rounds} rounds of the "
                      f"default page)")
    print(f"   seeded in {seed_s:.2f} s (one stub create, then its row copied); the default "
          f"answer is {bytes_default} bytes; target: default page median <= "
          f"{ms(TARGET_LIST_S)}")
    return result


# -- main ----------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 60: one create + destroy spreads by 15% or so on the engine alone; with 20 rounds the
    # median ratio moved between 1.02 and 1.13 from one run to the next, and at 40 the
    # interval printed was still about +-5%
    parser.add_argument("--rounds", type=int, default=60, help="create + destroy rounds")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--cycles", type=int, default=16, help="cycles per client")
    parser.add_argument("--rows", type=int, default=10_000, help="sandboxes to list")
    parser.add_argument("--list-rounds", type=int, default=50)
    parser.add_argument("--json", dest="json_path", metavar="FILE")
    args = parser.parse_args()
    started = time.perf_counter()
    meta = common.preflight()
    ctx = Context()
    common.print_banner("service", ctx, meta)
    results: dict[str, Any] = {"meta": meta, "run_id": ctx.run_id,
                               "args": {k: v for k, v in vars(args).items() if k != "json_path"}}
    try:
        _, url, token = ctx.served_home()
        cd = results["create_destroy"] = asyncio.run(
            bench_create_destroy(ctx, url, token, args.rounds))
        cc = results["concurrent"] = asyncio.run(
            bench_concurrent(ctx, url, token, args.clients, args.cycles))
        ls = results["list"] = bench_list(ctx, args.rows, args.list_rounds)
    finally:
        ctx.cleanup()
        common.print_notes(ctx)
    load = f"{args.clients} clients x {args.cycles} cycles"
    summary = [
        ("create + destroy: HTTP service / docker-py", cd["ratio"], TARGET_RATIO,
         "{:.3f} (90% interval {:.3f}-{:.3f})".format(cd["ratio"], *cd["ratio_interval"]),
         f"<= {TARGET_RATIO}"),
        (f"{load}: errors", cc["error_count"], 0, str(cc["error_count"]), "0"),
        (f"{load}: leaked containers", cc["leaked_count"], 0, str(cc["leaked_count"]), "0"),
        (f"GET /v1/sandboxes over {args.rows:,} rows (default page of {DEFAULT_PAGE}): median",
         ls["median_s"]["default"], TARGET_LIST_S, ms(ls["median_s"]["default"]),
         f"<= {ms(TARGET_LIST_S)}"),
    ]
    info = [["create + destroy: HTTP service (median)", ms(cd["service"]["median_s"]), "-",
             "info"],
            ["create + destroy: docker-py (median)", ms(cd["docker"]["median_s"]), "-", "info"],
            ["create + destroy: library in process / docker-py",
             f"{cd['ratio_library_to_docker']:.3f}", "-", "info"]]
    for op, r in cc["ops"].items():
        info.append([f"{load}: {op} median / p99", f"{ms(r['median_s'])} / {ms(r['p99_s'])}",
                     "-", "info"])
    info.append([f"{load}: throughput", f"{cc['cycles_per_s']:.1f} cycles/s", "-", "info"])
    info.append([f"GET /v1/sandboxes?limit=1000 over {args.rows:,} rows: median",
                 ms(ls["median_s"]["limit_1000"]), "-", "info"])
    info.append([f"all {args.rows:,} through Sandboxer(url=).list(): median",
                 ms(ls["median_s"]["library_list_all"]), "-", "info"])
    common.finish(results, summary, info, run_id=ctx.run_id, started=started,
                  json_path=args.json_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
