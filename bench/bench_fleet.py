"""Fleet-mode benchmark: PostgreSQL beside SQLite, in one run.

    .venv/bin/python bench/bench_fleet.py [--rows N] [--claims N] [--json FILE]

1. `sbx ls --json` over 10,000 sandboxes, fresh process each time, on PostgreSQL and on
   SQLite. Targets: <= 0.5 s on PostgreSQL, <= 0.3 s on SQLite (median of 7).
2. Claiming 1,000 expired sandboxes across 4 reaper processes on PostgreSQL: each process
   walks the expired rows (in its own shuffled order) through `Manager.destroy_if`, the
   reaper's claim (SELECT ... FOR UPDATE SKIP LOCKED, then the event chain's advisory lock),
   on the `stub` backend so only the database is measured. Meanwhile this process samples
   `pg_locks` every 2 ms and records how long each lock wait lasted (PostgreSQL's own
   `waitstart`). Target: no wait longer than 100 ms; the distribution is printed.

Needs the PostgreSQL of scripts/ensure-postgres.sh (SBX_TEST_PG=user:pw@host:port to use
another); makes its own databases and drops them at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import common
from common import median, ms, print_table, secs

PG = os.environ.get("SBX_TEST_PG", "sbx_test:sbx_test@127.0.0.1:5432")
TARGET_LS_PG, TARGET_LS_SQLITE, TARGET_WAIT = 0.5, 0.3, 0.100
CLAIMER = """
import asyncio, random, sys, time, json
from sandboxer.core.store.db import Database
from sandboxer.core.lifecycle.manager import Manager
from sandboxer.adapters.stub import StubAdapter
url, ids = sys.argv[1], json.loads(sys.stdin.read())
random.shuffle(ids)
async def main():
    mgr = Manager(Database(url), adapters={"stub": StubAdapter()})
    done = skipped = 0
    started = time.perf_counter()
    for sid in ids:
        if await mgr.destroy_if(sid, "stub", reason="ttl"):
            done += 1
        else:
            skipped += 1
    await mgr.close()
    print(json.dumps({"destroyed": done, "skipped": skipped,
                      "seconds": time.perf_counter() - started}))
asyncio.run(main())
"""


def admin():
    import psycopg

    return psycopg.connect(f"postgresql://{PG}/postgres", autocommit=True, connect_timeout=10)


def seed(url: str, count: int, *, expired: bool) -> list[str]:
    """`count` sandbox rows (stub backend), migrated schema; expired ones if asked."""
    import sqlalchemy as sa

    from sandboxer.core.rules.clock import to_iso
    from sandboxer.core.rules.ids import new_sandbox_id
    from sandboxer.core.store.db import Database
    from sandboxer.core.store.models import Sandbox

    db = Database(url)
    db.migrate()
    now = time.time()
    from datetime import UTC, datetime, timedelta

    t0 = datetime.fromtimestamp(now, UTC)
    deadline = t0 - timedelta(minutes=5) if expired else t0 + timedelta(minutes=30)
    ids = [new_sandbox_id() for _ in range(count)]
    rows = [dict(id=sid, name=None, profile="stubby", profile_json="{}", backend="stub",
                 backend_ref=f"stub-{sid}", install_id="inst-bench", host="bench",
                 state="running", owner="bench@fleet", labels_json='{"sbx-bench": "1"}',
                 created_at=to_iso(t0 - timedelta(hours=1)), started_at=to_iso(t0),
                 deadline=to_iso(deadline), hard_deadline=to_iso(t0 + timedelta(hours=3)),
                 last_activity_at=to_iso(t0 - timedelta(hours=1)), fence=0)
            for sid in ids]
    with db.write() as conn:
        for i in range(0, len(rows), 2000):
            conn.execute(sa.insert(Sandbox.__table__), rows[i:i + 2000])
    db.dispose()
    return ids


def bench_ls(ctx: common.BenchContext, urls: dict[str, str], rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for store, url in urls.items():
        env = ctx.sbx_env(ctx.home(f"ls-{store}"), SBX_DATABASE_URL=url, SBX_NO_SERVER="1")
        ctx.run_sbx(env, "ls", "--json")  # warm the page cache
        times = []
        for _ in range(rounds):
            elapsed, proc = ctx.run_sbx(env, "ls", "--json")
            times.append(elapsed)
        out[store] = {"median_s": median(times), "max_s": max(times),
                      "rows": len(json.loads(proc.stdout))}
    print_table(["store", "sandboxes listed", "median", "max"],
                [[s, r["rows"], secs(r["median_s"]), secs(r["max_s"])] for s, r in out.items()],
                title=f"1. sbx ls --json, fresh process, {rounds} runs each")
    return out


def bench_claims(url: str, ids: list[str], reapers: int) -> dict[str, Any]:
    import psycopg

    waits: dict[tuple, float] = {}  # (pid, locktype, waitstart) -> longest seen (s)
    sampler = psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), autocommit=True)
    procs = [subprocess.Popen([sys.executable, "-c", CLAIMER, url], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=common.ROOT,
                              env={**os.environ, "PYTHONPATH": str(common.ROOT)})
             for _ in range(reapers)]
    for p in procs:
        p.stdin.write(json.dumps(ids))
        p.stdin.close()
    samples = 0
    while any(p.poll() is None for p in procs):
        rows = sampler.execute(
            "SELECT pid, locktype, waitstart, clock_timestamp() - waitstart FROM pg_locks "
            "WHERE NOT granted AND waitstart IS NOT NULL").fetchall()
        samples += 1
        for pid, locktype, start, waited in rows:
            key = (pid, locktype, start)
            waits[key] = max(waits.get(key, 0.0), waited.total_seconds())
        time.sleep(0.002)
    sampler.close()
    reports = [json.loads(p.stdout.read()) for p in procs]
    durations = sorted(waits.values())
    result = {
        "reapers": reports, "destroyed": sum(r["destroyed"] for r in reports),
        "lock_waits": len(durations), "samples": samples,
        "wait_p50_s": durations[len(durations) // 2] if durations else 0.0,
        "wait_p90_s": durations[int(len(durations) * 0.9)] if durations else 0.0,
        "wait_max_s": durations[-1] if durations else 0.0,
        "waits_over_100ms": sum(d > TARGET_WAIT for d in durations),
        "by_locktype": {},
    }
    for (_, locktype, _), d in waits.items():
        entry = result["by_locktype"].setdefault(locktype, {"count": 0, "max_s": 0.0})
        entry["count"] += 1
        entry["max_s"] = max(entry["max_s"], d)
    print_table(["reaper", "destroyed", "skipped (another had it)", "seconds"],
                [[i + 1, r["destroyed"], r["skipped"], f"{r['seconds']:.2f}"]
                 for i, r in enumerate(reports)],
                title=f"2. {len(ids)} expired sandboxes claimed by {reapers} reapers on PostgreSQL")
    print(f"   lock waits seen: {len(durations)} (pg_locks sampled {samples} times); "
          f"p50 {ms(result['wait_p50_s'])}, p90 {ms(result['wait_p90_s'])}, "
          f"max {ms(result['wait_max_s'])}; over 100 ms: {result['waits_over_100ms']}")
    for locktype, entry in result["by_locktype"].items():
        print(f"   {locktype}: {entry['count']} waits, longest {ms(entry['max_s'])}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--claims", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    ctx = common.BenchContext("sbx-bench-fleet-")
    names = {k: f"sbx_bench_{ctx.run_id}_{k}" for k in ("ls", "claims")}
    with admin() as conn:
        for name in names.values():
            conn.execute(f'CREATE DATABASE "{name}"')
    results: dict[str, Any] = {}
    try:
        urls = {"postgresql": f"postgresql+psycopg://{PG}/{names['ls']}",
                "sqlite": f"sqlite:///{ctx.tmp / 'fleet.db'}"}
        for url in urls.values():
            seed(url, args.rows, expired=False)
        results["ls"] = bench_ls(ctx, urls, args.rounds)
        claims_url = f"postgresql+psycopg://{PG}/{names['claims']}"
        ids = seed(claims_url, args.claims, expired=True)
        results["claims"] = bench_claims(claims_url, ids, 4)
    finally:
        with admin() as conn:
            for name in names.values():
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        ctx.cleanup()
    ls, claims = results["ls"], results["claims"]
    summary = [
        (f"sbx ls --json, {args.rows} sandboxes, PostgreSQL (median)", ls["postgresql"]["median_s"],
         TARGET_LS_PG, secs(ls["postgresql"]["median_s"]), f"<= {TARGET_LS_PG} s"),
        (f"sbx ls --json, {args.rows} sandboxes, SQLite (median)", ls["sqlite"]["median_s"],
         TARGET_LS_SQLITE, secs(ls["sqlite"]["median_s"]), f"<= {TARGET_LS_SQLITE} s"),
        (f"longest lock wait, {args.claims} claims by 4 reapers", claims["wait_max_s"],
         TARGET_WAIT, ms(claims["wait_max_s"]), f"<= {TARGET_WAIT * 1000:.0f} ms"),
    ]
    info = [[f"  destroyed exactly once: {claims['destroyed']} of {args.claims}",
             str(claims["destroyed"] == args.claims), "", "info"]]
    common.finish(results, summary, info, run_id=ctx.run_id, started=started,
                  json_path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
