"""The service's proxy to a sandbox's port (`sbx serve`, /v1/sandboxes/{ref}/ports/{port}/...)
against the same port reached straight on its published loopback address, on the real local
Docker engine.

    .venv/bin/python bench/bench_proxy.py [--rounds N] [--requests N] [--clients N]
                                          [--seconds S] [--json FILE]

One sandbox (the default profile's busybox image on the installation's own bridge, `ports:
[8080]`, published on 127.0.0.1 with a port the engine picks) runs busybox httpd serving a
small file (256 bytes). A real `sbx serve --listen 127.0.0.1:PORT --reap-every 0` process
(its own SBX_HOME, a write key) proxies it. The same client (httpx, one pooled AsyncClient
per side, in this process) asks both sides for the file, in rounds interleaved with the order
alternated each round:

1. latency: `--requests` (200) GETs one after another; p50 and p99 per side, and what the
   proxy adds at p50. Target: p50 added <= 2 ms.
2. throughput: `--clients` (8) concurrent loops of GETs for `--seconds` (2) s; requests per
   second per side. Target: through the proxy / straight >= 0.7.

Every answer is checked (200 and the file's bytes); an error fails the run. busybox httpd
closes each connection after its answer, so both sides open a connection to the published
port per request (the proxy's pool cannot keep one). Network traffic goes to 127.0.0.1 only.
The sandbox is destroyed through sbx; anything still carrying the run's label is removed by
id. Exit 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import common
from bench_service import Context, percentile
from common import median, ms, print_table

TARGET_THROUGHPUT = 0.7  # through the proxy / straight, at least
TARGET_P50_ADDED_S = 0.002
BODY = b"x" * 255 + b"\n"
HTTPD = ["sh", "-c", "mkdir -p /tmp/www && head -c 255 /dev/zero | tr '\\0' x > "
                     "/tmp/www/f && echo >> /tmp/www/f && exec httpd -f -p 8080 -h /tmp/www"]


def profile() -> dict[str, Any]:
    return {"name": "bench-web", "extends": "default", "network": {"mode": "full"},
            "ports": [8080], "command": HTTPD, "ttl": {"default": "1h", "max": "2h"}}


async def get_ok(http: Any, url: str) -> None:
    reply = await http.get(url)
    if reply.status_code != 200 or reply.content != BODY:
        raise RuntimeError(f"GET {url}: {reply.status_code} {reply.content[:200]!r}")


async def latencies(http: Any, url: str, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        await get_ok(http, url)
        times.append(time.perf_counter() - started)
    return times


async def throughput(http: Any, url: str, clients: int, seconds: float) -> float:
    done = 0
    stop = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await get_ok(http, url)
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(clients)))
    return done / (time.perf_counter() - started)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def bench(ctx: Context, url: str, token: str, rounds: int, requests: int, clients: int,
                seconds: float, service_pid: int) -> dict[str, Any]:
    import httpx

    limits = httpx.Limits(max_connections=clients * 2, max_keepalive_connections=clients * 2)
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=auth, timeout=60, trust_env=False,
                                 limits=limits) as api:
        made = await api.post("/v1/sandboxes", json={"profile": profile(),
                                                     "labels": ctx.labels})
        if made.status_code != 201:
            raise RuntimeError(f"create: {made.status_code} {made.text[:300]}")
        box = made.json()
        try:
            ports = (await api.get(f"/v1/sandboxes/{box['id']}/ports")).json()
            direct = f"{ports[0]['url']}/f"
            proxied = f"{url}/v1/sandboxes/{box['id']}/ports/8080/f"
            async with httpx.AsyncClient(timeout=60, trust_env=False,
                                         limits=limits) as straight:
                give_up = time.monotonic() + 60
                while True:  # httpd starts with the container
                    try:
                        await get_ok(straight, direct)
                        break
                    except (httpx.TransportError, RuntimeError):
                        if time.monotonic() > give_up:
                            raise
                        await asyncio.sleep(0.1)
                sides = {"straight": (straight, direct), "proxy": (api, proxied)}
                for client, target in sides.values():  # warm both
                    await latencies(client, target, 50)
                lat: dict[str, list[float]] = {"straight": [], "proxy": []}
                service_cpu = 0.0  # the service's CPU over the proxied GETs one at a time
                rps: dict[str, list[float]] = {"straight": [], "proxy": []}
                for r in range(rounds):
                    order = ["straight", "proxy"] if r % 2 == 0 else ["proxy", "straight"]
                    for side in order:
                        before = cpu_s(service_pid)
                        lat[side] += await latencies(*sides[side], requests)
                        if side == "proxy":
                            service_cpu += cpu_s(service_pid) - before
                    for side in order:
                        rps[side].append(await throughput(*sides[side], clients, seconds))
                    print(f"round {r + 1}/{rounds}: p50 straight "
                          f"{ms(percentile(lat['straight'], 50))} proxy "
                          f"{ms(percentile(lat['proxy'], 50))}; req/s straight "
                          f"{rps['straight'][-1]:.0f} proxy {rps['proxy'][-1]:.0f}",
                          flush=True)
        finally:
            await api.delete(f"/v1/sandboxes/{box['id']}")
    return {"latency_s": lat, "requests_per_s": rps,
            "service_cpu_per_request_s": service_cpu / (rounds * requests)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    meta = common.preflight()
    ctx = Context("sbx-bench-proxy-")
    common.print_banner("proxy", ctx, meta)
    started = time.perf_counter()
    load_before = os.getloadavg()
    try:
        home = ctx.home("served")
        ctx.docker_homes.append(home)
        url, token = ctx.serve(home, "admin")  # the bench's profile is a document: admin
        found = asyncio.run(bench(ctx, url, token, args.rounds, args.requests, args.clients,
                                  args.seconds, ctx.services[-1][0].pid))
    finally:
        ctx.cleanup()
        common.print_notes(ctx)
    lat, rps = found["latency_s"], found["requests_per_s"]
    p = {side: {q: percentile(lat[side], q) for q in (50, 99)} for side in lat}
    added = p["proxy"][50] - p["straight"][50]
    r = {side: median(rps[side]) for side in rps}
    ratio = r["proxy"] / r["straight"]
    rows = [["requests/s (median of rounds)", f"{r['straight']:.0f}", f"{r['proxy']:.0f}",
             f"{ratio:.3f}"],
            ["latency p50", ms(p["straight"][50]), ms(p["proxy"][50]),
             f"{p['proxy'][50] / p['straight'][50]:.3f}"],
            ["latency p99", ms(p["straight"][99]), ms(p["proxy"][99]),
             f"{p['proxy'][99] / p['straight'][99]:.3f}"]]
    print_table(["256-byte GET", "straight to 127.0.0.1", "through sbx serve", "proxy/straight"],
                rows, title=f"{args.rounds} interleaved rounds, {args.clients} clients for "
                            f"throughput; load average {load_before[0]:.1f} before, "
                            f"{os.getloadavg()[0]:.1f} after")
    summary = [
        (f"proxy throughput / straight ({args.clients} clients, 256-byte GET)",
         -ratio, -TARGET_THROUGHPUT, f"{ratio:.3f} ({r['proxy']:.0f} vs {r['straight']:.0f} "
                                     "req/s)", f">= {TARGET_THROUGHPUT}"),
        ("proxy latency added at p50 (256-byte GET)", added, TARGET_P50_ADDED_S,
         f"{added * 1000:.2f} ms (p50 {ms(p['proxy'][50])} vs {ms(p['straight'][50])}; p99 "
         f"{ms(p['proxy'][99])} vs {ms(p['straight'][99])})",
         f"<= {TARGET_P50_ADDED_S * 1000:.0f} ms")]
    cpu = found["service_cpu_per_request_s"]
    info = [["sbx serve's CPU per proxied GET (user + system)", ms(cpu), "", ""]]
    results = {"meta": meta, "service_cpu_per_request_s": cpu, "rounds": args.rounds, "requests": args.requests,
               "clients": args.clients, "seconds": args.seconds,
               "requests_per_s": rps, "latency_p50_s": {s: p[s][50] for s in p},
               "latency_p99_s": {s: p[s][99] for s in p}, "throughput_ratio": ratio,
               "p50_added_s": added,
               "load_average": {"before": load_before, "after": os.getloadavg()}}
    common.finish(results, summary, info, run_id=ctx.run_id, started=started,
                  json_path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
