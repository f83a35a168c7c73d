"""The dashboard on the real Docker engine: create from the picker, see it running with live
metrics, extend, destroy with confirmation; and an engine that cannot be reached at start,
then comes back (through a forwarding socket this test starts: the real engine is never
stopped, other tests use it). Everything made here carries the per-run label, and only the
containers of this test's installation are removed."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from support import RUN_LABEL
from textual.widgets import Input, OptionList

from sandboxer.core.lifecycle.manager import Manager
from sandboxer.core.rules.clock import from_iso
from sandboxer_tui.dashboard.model import Dashboard
from sandboxer_tui.dashboard.screens.modals import ConfirmScreen
from sandboxer_tui.dashboard.screens.pickers import ProfilePicker

from .helpers import opened, screen_text, select, told, wait_for

pytestmark = pytest.mark.docker
ENGINE = "/var/run/docker.sock"


def test_create_from_the_picker_extend_and_destroy_on_docker(sbx, docker_api):
    dashboard = Dashboard(backends=["docker"])  # the library's client, as `sbx tui` makes it
    mgr = Manager()  # the test's own reader of the inventory

    async def scenario():
        async with opened(dashboard, new_labels=RUN_LABEL) as (app, pilot):
            table = app.main.table
            assert "docker ● up" in screen_text(app).splitlines()[0]
            await pilot.press("n")
            await wait_for(pilot, lambda: isinstance(app.screen, ProfilePicker), what="picker")
            picker = app.screen
            options = picker.query_one("#profile-list", OptionList)
            options.highlighted = [c.name for c in picker.choices].index("default")
            picker.query_one("#new-name", Input).value = "tui-e2e"
            assert picker.query_one("#new-labels", Input).value == RUN_LABEL
            options.focus()
            await pilot.press("enter")
            await wait_for(pilot, lambda: any(table.sandboxes[s].name == "tui-e2e"
                                              for s in table.shown_ids), within=30,
                           what="the new row")
            box = mgr.resolve("tui-e2e")
            await wait_for(pilot, lambda: table.cell_text(box["id"], "state") == "running",
                           within=30, what="running")
            box = mgr.resolve("tui-e2e")
            container = docker_api.inspect_container(box["backend_ref"])
            assert container["State"]["Running"]
            key, value = RUN_LABEL.split("=")
            assert container["Config"]["Labels"][key] == value
            # the engine's stats stream reaches the row: memory in absolute units
            await wait_for(pilot, lambda: table.cell_text(box["id"], "mem").endswith(
                ("KB", "MB")), within=60, what="a memory sample")
            await select(pilot, box["id"])
            await pilot.press("t")
            await wait_for(pilot, lambda: from_iso(mgr.resolve(
                box["id"])["deadline"]) - from_iso(box["deadline"]) == timedelta(minutes=30),
                what="the deadline 30m later")
            await wait_for(pilot, lambda: table.cell_text(box["id"], "ttl").startswith("59m"),
                           what="the countdown")
            await pilot.press("d")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            assert f"sbx destroy {box['id']}" in screen_text(app)
            await pilot.press("y")
            await wait_for(pilot, lambda: not table.is_shown(box["id"]), within=30,
                           what="the row gone")
            assert mgr.resolve(box["id"])["state"] == "destroyed"
            assert docker_api.containers(all=True, filters={"id": box["backend_ref"]}) == []

    asyncio.run(scenario())


class ForwardingSocket:
    """A unix socket that forwards every connection to the real engine's socket: the engine
    "comes back" at a DOCKER_HOST that nobody answered before."""

    def __init__(self, path: str, target: str = ENGINE) -> None:
        self.path, self.target = path, target
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(64)
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.target)
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.server.close()
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.close()
        Path(self.path).unlink(missing_ok=True)


def test_engine_unreachable_at_start_then_back_by_itself(sbx, docker_api, monkeypatch):
    box = sbx.create("--name", "before-outage")
    dead = f"/tmp/sbx-tui-{uuid.uuid4().hex[:12]}.sock"
    assert not Path(dead).exists()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{dead}")
    dashboard = Dashboard(backends=["docker"])
    mgr = Manager()
    proxy = None

    async def scenario():
        nonlocal proxy
        async with opened(dashboard) as (app, pilot):
            header = lambda: screen_text(app).splitlines()[0]  # noqa: E731
            assert "docker ✖ unreachable" in header()
            assert app.main.table.cell_text(box["id"], "state") == "running"  # from the db
            await select(pilot, box["id"])
            await pilot.press("p")
            await wait_for(pilot, lambda: told(app, "error"), what="the error")
            assert "Docker engine unreachable" in told(app, "error")[-1]
            assert mgr.resolve(box["id"])["state"] == "running"
            proxy = ForwardingSocket(dead)
            await wait_for(pilot, lambda: "docker ● up" in header(), within=60,
                           what="the header to recover")
            await pilot.press("p")  # and the engine is usable again, through the same path
            await wait_for(pilot, lambda: app.main.table.cell_text(box["id"], "state")
                           == "paused", within=60, what="paused")
            assert docker_api.inspect_container(box["backend_ref"])["State"]["Paused"]
            await pilot.press("p")
            await wait_for(pilot, lambda: app.main.table.cell_text(box["id"], "state")
                           == "running", within=60, what="resumed")

    try:
        asyncio.run(scenario())
    finally:
        if proxy is not None:
            proxy.close()
