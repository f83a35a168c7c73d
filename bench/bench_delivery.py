"""Event delivery throughput: the webhook and the JSON Lines sinks.

    .venv/bin/python bench/bench_delivery.py [--events N] [--rounds N] [--json FILE]

N events (default 5,000) are seeded once, in this process, by a Manager on the `stub` backend
(a test double: create, exec, extend, destroy, 6 events a sandbox) in a temporary SBX_HOME.
Each measurement then runs on a fresh copy of that home (nothing delivered yet):

1. webhook, in-process: `Deliverer.run()` with only the webhook sink, to a receiver on
   127.0.0.1 (ThreadingHTTPServer, HTTP/1.1 keep-alive, answers 200 at once);
2. webhook, `sbx events deliver` in a fresh process (the JSON Lines sink disabled in the
   settings file); the wall time includes the process start, which is also measured alone
   (a deliver with nothing pending) and shown;
3. JSON Lines, in-process and `sbx events deliver` (no webhook configured).

Every run is checked: all N delivered, each exactly once, in order. Rates are events/s over
the whole run; "worst 1k window" is the slowest run of 1,000 consecutive events as the
receiver saw them arrive (sustained rate). Target: webhook >= 500 events/s, in-process and
through the CLI. Exit 0 whatever the figures (non-zero only on a crash). Network: 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import common  # also puts the project on sys.path
from common import git_commit, median, print_table

TARGET_EPS = 500.0
WINDOW = 1000
SECRET = "whsec_" + "YmVuY2gtd2ViaG9vay1zZWNyZXQtb2YtMzItYnl0ZXM="  # 32 bytes


# -- the receiver ---------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def server_bind(self) -> None:  # no reverse DNS lookup
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class Receiver:
    """Answers 200 to every POST; records each CloudEvent id and when it arrived."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.arrivals: list[tuple[float, str]] = []
        self.first: tuple[bytes, dict[str, str]] | None = None  # its signature is checked
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                event_id = json.loads(body)["id"]
                with receiver.lock:
                    receiver.arrivals.append((time.perf_counter(), event_id))
                    if receiver.first is None:
                        receiver.first = (body, dict(self.headers.items()))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def reset(self) -> None:
        with self.lock:
            self.arrivals.clear()
            self.first = None

    def take(self) -> list[tuple[float, str]]:
        with self.lock:
            return list(self.arrivals)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- environment ----------------------------------------------------------------------------


@contextmanager
def acting_on(home: Path, config: Path) -> Iterator[None]:
    """This process acts as an sbx client of `home`, with `config` as XDG_CONFIG_HOME."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("SBX_") or k == "XDG_CONFIG_HOME"}
    for key in list(saved):
        del os.environ[key]
    os.environ.update(SBX_HOME=str(home), XDG_CONFIG_HOME=str(config), SBX_ACTOR="sbx-bench")
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith("SBX_") or k == "XDG_CONFIG_HOME"]:
            del os.environ[key]
        os.environ.update(saved)


def sbx_env(home: Path, config: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    env.update(SBX_HOME=str(home), XDG_CONFIG_HOME=str(config), SBX_ACTOR="sbx-bench", **extra)
    return env


def sbx_cmd() -> list[str]:
    sbx = Path(sys.executable).parent / "sbx"
    return [str(sbx)] if sbx.exists() else [sys.executable, "-m", "sandboxer_tui.cli"]


def write_settings(config: Path, text: str) -> None:
    path = config / "sandboxer" / "settings.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# -- seeding --------------------------------------------------------------------------------


def seed(home: Path, config: Path, events: int) -> tuple[int, float]:
    """At least `events` events on the stub backend, in this process. (count, seconds)"""
    from sandboxer.adapters.stub import StubAdapter
    from sandboxer.core.lifecycle.manager import Manager
    from sandboxer.core.rules.profiles import ProfileLoader

    profile_path = home.parent / "bench-stub.yaml"
    profile_path.write_text("backend: stub\nttl: {default: 10m, max: 1h}\n")
    with acting_on(home, config):
        profile = ProfileLoader().load_file(profile_path)
        StubAdapter.reset()

        async def go() -> int:
            mgr = Manager()
            try:
                for _ in range(-(-events // 6)):
                    row = await mgr.create(profile, labels={"sbx-bench": "delivery"})
                    await mgr.exec(row["id"], ["true"])
                    await mgr.extend(row["id"], timedelta(minutes=5))
                    await mgr.destroy(row["id"])
                return len(mgr.events())
            finally:
                await mgr.close()

        started = time.perf_counter()
        count = asyncio.run(go())
        elapsed = time.perf_counter() - started
        StubAdapter.reset()
    return count, elapsed


def event_hashes(home: Path, config: Path) -> list[str]:
    from sandboxer.core.lifecycle.manager import Manager

    with acting_on(home, config):
        mgr = Manager()
        try:
            return [e["hash"] for e in mgr.events()]
        finally:
            mgr.db.dispose()


def fresh_copy(template: Path, into: Path) -> Path:
    if into.exists():
        shutil.rmtree(into)
    shutil.copytree(template, into)
    return into


# -- the measurements -----------------------------------------------------------------------


def worst_window(arrivals: list[tuple[float, str]]) -> float:
    """Events/s of the slowest WINDOW consecutive arrivals (the whole run when shorter)."""
    times = [t for t, _ in arrivals]
    if len(times) < 2:
        return float("nan")
    span = min(WINDOW, len(times) - 1)
    worst = max(times[i + span] - times[i] for i in range(len(times) - span))
    return span / worst if worst > 0 else float("inf")


def check(label: str, got: list[str], want: list[str]) -> None:
    if got != want:
        dupes = len(got) - len(set(got))
        raise SystemExit(f"{label}: delivered {len(got)} of {len(want)} ({dupes} duplicates), "
                         "not every event exactly once in order")


def check_signed(label: str, receiver: Receiver) -> None:
    """The first delivery verifies as a hub would verify it (outside the timed run)."""
    from standardwebhooks import Webhook, WebhookVerificationError

    body, headers = receiver.first or (b"", {})
    try:
        Webhook(SECRET).verify(body, headers)
    except WebhookVerificationError as exc:
        raise SystemExit(f"{label}: the delivery does not verify: {exc}") from None


def in_process(home: Path, config: Path, sink: str, receiver: Receiver | None) -> float:
    """Seconds for one Deliverer.run() with only `sink`."""
    from sandboxer.core.observe.delivery import Deliverer, DeliverySettings, JsonlSink, WebhookSink
    from sandboxer.core.rules import settings
    from sandboxer.core.rules.clock import Clock
    from sandboxer.core.store.db import Database

    with acting_on(home, config):
        os.environ["SBX_WEBHOOK_SECRET"] = SECRET
        chosen = (WebhookSink(receiver.url) if sink == "webhook"
                  else JsonlSink(home / "events.jsonl"))
        db = Database(settings.database_url())
        deliverer = Deliverer(db, DeliverySettings([chosen], max_attempts=8, backoff_s=0),
                              Clock(), install_id=settings.install_id(), owner="bench",
                              lease_ttl=timedelta(minutes=2))
        db.migrate()  # opening the database is not delivery
        started = time.perf_counter()
        reports = deliverer.run()
        elapsed = time.perf_counter() - started
        db.dispose()
    if reports[0].error:
        raise SystemExit(f"in-process {sink}: {reports[0].error}")
    return elapsed


def via_cli(home: Path, config: Path, sink: str, receiver: Receiver | None) -> float:
    """Wall seconds of `sbx events deliver --json` in a fresh process."""
    extra = {"SBX_WEBHOOK_URL": receiver.url, "SBX_WEBHOOK_SECRET": SECRET} \
        if sink == "webhook" else {}
    write_settings(config, "[sinks.jsonl]\nenabled = false\n" if sink == "webhook" else "")
    started = time.perf_counter()
    proc = subprocess.run([*sbx_cmd(), "events", "deliver", "--json"],
                          env=sbx_env(home, config, **extra), cwd=home.parent,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"sbx events deliver ({sink}) exited {proc.returncode}: {proc.stderr}")
    return elapsed


def jsonl_ids(home: Path) -> list[str]:
    path = home / "events.jsonl"
    return [json.loads(line)["id"] for line in path.read_bytes().splitlines()] \
        if path.exists() else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=5000, help="events to deliver (5000)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each measurement (3)")
    parser.add_argument("--json", dest="json_path", help="write the results here")
    args = parser.parse_args()

    began = time.perf_counter()
    print(f"sbx delivery benchmark  commit {git_commit()}  python {sys.version.split()[0]}  "
          f"{os.cpu_count()} cpus  {args.events} events x {args.rounds} rounds", flush=True)
    with tempfile.TemporaryDirectory(prefix="sbx-bench-delivery-") as tmp_name:
        tmp = Path(tmp_name)
        config = tmp / "xdg-config"
        template = tmp / "template"
        count, seed_s = seed(template, config, args.events)
        hashes = event_hashes(template, config)
        print(f"seeded {count} events on the stub backend in {seed_s:.1f} s "
              f"({count / seed_s:.0f} events/s, in-process Manager)", flush=True)
        receiver = Receiver()
        results: dict[str, Any] = {"events": count, "seed_s": seed_s, "runs": {}}
        try:
            # the fixed cost of a fresh `sbx events deliver` (nothing pending)
            idle = fresh_copy(template, tmp / "idle")
            via_cli(idle, config, "webhook", receiver)
            startup = [via_cli(idle, config, "webhook", receiver) for _ in range(3)]
            receiver.reset()
            for sink, how in [("webhook", "in-process"), ("webhook", "cli"),
                              ("jsonl", "in-process"), ("jsonl", "cli")]:
                name = f"{sink} {how}"
                runs = []
                for n in range(args.rounds):
                    home = fresh_copy(template, tmp / f"{sink}-{how}-{n}")
                    receiver.reset()
                    run = in_process if how == "in-process" else via_cli
                    elapsed = run(home, config, sink, receiver)
                    if sink == "webhook":
                        arrivals = receiver.take()
                        check(name, [i for _, i in arrivals], hashes)
                        check_signed(name, receiver)
                        worst = worst_window(arrivals)
                    else:
                        check(name, jsonl_ids(home), hashes)
                        worst = float("nan")
                    runs.append({"seconds": elapsed, "eps": count / elapsed, "worst_window_eps": worst})
                    shutil.rmtree(home)
                    print(f"  {name:<19} round {n + 1}: {elapsed:.3f} s  "
                          f"{count / elapsed:,.0f} events/s", flush=True)
                results["runs"][name] = runs
        finally:
            receiver.close()

    cli_fixed = median(startup)
    rows, summary = [], []
    for name, runs in results["runs"].items():
        eps = median([r["eps"] for r in runs])
        worst_eps = min(r["eps"] for r in runs)
        windows = [r["worst_window_eps"] for r in runs if r["worst_window_eps"] == r["worst_window_eps"]]
        secs = median([r["seconds"] for r in runs])
        net = count / (secs - cli_fixed) if name.endswith("cli") and secs > cli_fixed else None
        rows.append([name, f"{secs:.3f} s", f"{eps:,.0f}", f"{worst_eps:,.0f}",
                     f"{min(windows):,.0f}" if windows else "-",
                     f"{net:,.0f}" if net else "-"])
        if name.startswith("webhook"):
            summary.append([f"{name} (worst round)", f"{worst_eps:,.0f} events/s",
                            f">= {TARGET_EPS:.0f}", "PASS" if worst_eps >= TARGET_EPS else "MISS"])
    print_table(["run", "median time", "median ev/s", "worst round ev/s", "worst 1k window ev/s",
                 "ev/s minus start"], rows,
                title=f"RESULTS ({count} events; `sbx events deliver` with nothing pending: "
                      f"{cli_fixed:.3f} s)")
    print_table(["measurement", "value", "target", "result"], summary,
                title=f"SUMMARY ({time.perf_counter() - began:.0f} s)")
    results.update(cli_fixed_s=cli_fixed, meta=common.preflight_meta(), summary=[
        {"measurement": m, "shown": v, "target_shown": t, "pass": r == "PASS"}
        for m, v, t, r in summary])
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"results written to {args.json_path}")


if __name__ == "__main__":
    main()
