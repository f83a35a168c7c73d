"""Make the dashboard's screenshots (SVG) from the real app on the real Docker engine.

    .venv/bin/python screenshots/make_screenshots.py [--out screenshots/]

Seeds a temporary SBX_HOME through the core (the same Manager as `sbx create`): a few
sandboxes of the `default` profile with owners, tasks and labels, one paused, one with a short
TTL, a checkpoint and a sandbox restored from it; runs a CPU and memory load in one of them;
lets the dashboard stream metrics for a while; then drives the app (Textual's pilot,
headless, 120x36) and saves:

  dashboard-main.svg         the main view, with the overview of the selected sandbox
  dashboard-metrics.svg      the metrics tab (CPU and memory over time)
  dashboard-checkpoints.svg  the checkpoints tab (lineage)
  dashboard-confirm.svg      the confirmation before destroying two marked sandboxes
  dashboard-picker.svg       the profile picker of a new sandbox

Everything made carries the label `sbx-screenshots=<run id>` and is removed at the end (the
sandboxes destroyed through the core, the checkpoint images removed, then anything still
labelled, by id). Needs the engine and the base image (`make image`); about 40 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# busy for a moment, idle for a second, memory growing 4 MB a round: for 45 s
LOAD = ("end=$(($(date +%s)+45)); x=''; n=0; "
        "while [ $(date +%s) -lt $end ]; do "
        "i=0; while [ $i -lt 150000 ]; do i=$((i+1)); done; "
        "if [ $n -lt 12 ]; then x=\"$x$(head -c 4000000 /dev/zero | tr '\\0' a)\"; n=$((n+1)); fi; "
        "sleep 1; done")


async def seed(labels: dict[str, str]):
    from sandboxer.core.lifecycle.checkpoints import Checkpoints
    from sandboxer.core.lifecycle.manager import Manager
    from sandboxer.core.rules.profiles import ProfileLoader

    mgr = Manager(actor="alice@laptop")
    default = ProfileLoader().load("default")
    made = {}
    made["api"] = await mgr.create(default, name="api-dev", ttl=timedelta(hours=2),
                                   task="build the payments api",
                                   labels={**labels, "team": "payments"})
    made["ci"] = await mgr.create(default, name="ci-runner-42", ttl=timedelta(minutes=4),
                                  owner="ci@build-7", task="integration tests #4242",
                                  labels={**labels, "ci": "true"})
    made["nb"] = await mgr.create(default, name="notebook", ttl=timedelta(seconds=100),
                                  owner="bob@laptop", labels=labels)
    made["batch"] = await mgr.create(default, name="batch-7", ttl=timedelta(hours=1),
                                     owner="bob@laptop", task="nightly export", labels=labels)
    await mgr.pause(made["batch"]["id"])
    ckpt = await Checkpoints(mgr).snapshot(made["api"]["id"], "before-migration")
    made["fork"] = await Checkpoints(mgr).restore(ckpt["id"], name="api-fork",
                                                  ttl=timedelta(minutes=90),
                                                  labels={**labels, "team": "payments"})
    made["checkpoint"] = ckpt
    await Checkpoints(mgr).snapshot(made["fork"]["id"], "after-migration")  # lineage
    await mgr.close()
    return made


async def shoot(out: Path, made: dict) -> list[Path]:
    from sandboxer_tui.dashboard.app import SandboxerApp
    from sandboxer_tui.dashboard.model import Dashboard
    from sandboxer_tui.dashboard.screens.modals import ConfirmScreen
    from sandboxer_tui.dashboard.screens.pickers import ProfilePicker

    app = SandboxerApp(Dashboard())
    saved = []

    async def until(pilot, predicate, seconds: float = 20) -> None:
        for _ in range(int(seconds / 0.1)):
            if predicate():
                return
            await pilot.pause(0.1)
        raise SystemExit("the dashboard did not get there in time")

    def save(name: str) -> None:
        app.save_screenshot(name, str(out))
        saved.append(out / name)

    async with app.run_test(size=(120, 36)) as pilot:
        main = app.main
        table = main.table
        await until(pilot, lambda: table.loaded and main.health.statuses)
        api = made["api"]["id"]
        await until(pilot, lambda: table.cell_text(api, "cpu").endswith("%"))
        await pilot.pause(20)  # let the sparklines fill
        table.move_cursor(row=table.get_row_index(api), animate=False)
        await pilot.pause(1)
        save("dashboard-main.svg")
        await pilot.press("4")
        await pilot.pause(1.5)
        save("dashboard-metrics.svg")
        fork = made["fork"]["id"]
        table.move_cursor(row=table.get_row_index(fork), animate=False)
        await pilot.press("5")
        await until(pilot, lambda: made["checkpoint"]["id"] in str(
            main.query_one("#ckpt-tree").root.children[0].label) if
            main.query_one("#ckpt-tree").root.children else False)
        await pilot.pause(0.5)
        save("dashboard-checkpoints.svg")
        await pilot.press("1")
        for key in ("ci", "nb"):
            table.move_cursor(row=table.get_row_index(made[key]["id"]), animate=False)
            await pilot.pause()
            await pilot.press("space")
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.pause(0.5)
        save("dashboard-confirm.svg")
        await pilot.press("n")  # cancel
        await until(pilot, lambda: app.screen is main)
        await pilot.press("escape")  # clear the marks
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, ProfilePicker))
        await pilot.pause(0.5)
        save("dashboard-picker.svg")
        await pilot.press("escape")
        await pilot.pause(0.2)
    return saved


async def clean_up(label: str) -> None:
    from sandboxer.core.lifecycle.checkpoints import Checkpoints
    from sandboxer.core.lifecycle.manager import Manager

    mgr = Manager()
    try:
        for row in mgr.list():
            await mgr.destroy(row["id"])
        for ckpt in Checkpoints(mgr).list():
            await Checkpoints(mgr).remove(ckpt["id"])
    finally:
        await mgr.close()
    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={label}"],
                          capture_output=True, text=True).stdout.split()
    if left:
        subprocess.run(["docker", "rm", "-f", *left], capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args()
    run_id = uuid.uuid4().hex[:12]
    label = f"sbx-screenshots={run_id}"
    with tempfile.TemporaryDirectory(prefix="sbx-screenshots-") as tmp:
        for key in [k for k in os.environ if k.startswith(("SBX_", "E2B_", "MODAL_"))]:
            del os.environ[key]
        os.environ.update(SBX_HOME=str(Path(tmp) / "home"),
                          XDG_CONFIG_HOME=str(Path(tmp) / "xdg-config"),
                          SBX_ACTOR="alice@laptop")
        os.chdir(tmp)
        loads = []
        try:
            made = asyncio.run(seed({"sbx-screenshots": run_id}))
            loads = [subprocess.Popen(  # CPU and memory for the sparklines, from elsewhere
                [sys.executable, "-m", "sandboxer_tui.cli", "exec", made[key]["id"],
                 "--timeout", "60s", "--", "sh", "-c", LOAD],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for key in ("api", "ci")]
            saved = asyncio.run(shoot(args.out, made))
        finally:
            for load in loads:
                load.kill()
                load.wait()
            asyncio.run(clean_up(label))
    for path in saved:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
