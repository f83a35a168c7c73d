"""A live `sbx serve` for tests: the service's app on real uvicorn, listening on 127.0.0.1 on
a free port, in a thread of the test process (so the stub test double, which lives in this
process only, is the service's too), or as a real `sbx serve` process."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import sandboxer
from tests.support import remove_test_containers

SERVICE_ACTOR = "the-service"


@dataclass
class LiveService:
    """The service over its own AsyncSandboxer on `home`, in a thread."""

    home: Path
    reap_every: timedelta | None = None
    socket_path: str | None = None
    evidence_key: str | None = None
    url: str = ""
    client: sandboxer.AsyncSandboxer | None = None
    _server: object = None
    _thread: threading.Thread | None = None
    _sockets: list[socket.socket] = field(default_factory=list)

    def start(self) -> LiveService:
        import uvicorn

        from sandboxer_tui.service.app import build_app
        from sandboxer_tui.service.server import Listen, tcp_socket, unix_socket, uvicorn_config

        self.client = sandboxer.AsyncSandboxer(home=self.home, actor=SERVICE_ACTOR)
        tcp = tcp_socket(Listen("127.0.0.1", 0))
        self._sockets = [tcp]
        if self.socket_path:
            self._sockets.append(unix_socket(self.socket_path))
        self.url = f"http://127.0.0.1:{tcp.getsockname()[1]}"
        app = build_app(self.client, actor=SERVICE_ACTOR, socket_path=self.socket_path,
                        reap_every=self.reap_every, evidence_key=self.evidence_key)
        server = uvicorn.Server(uvicorn_config(app, graceful_shutdown_s=2))  # what ships
        self._server = server
        self._thread = threading.Thread(
            target=lambda: asyncio.run(server.serve(sockets=self._sockets)),
            name="sbx-serve-test", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the service did not start")
            time.sleep(0.01)
        return self

    def key(self, scope: str = "admin", owner: str = "api-test") -> str:
        """A new API key of the service."""
        return self.new_key(scope, owner)[1]

    def new_key(self, scope: str = "admin", owner: str = "api-test"):
        """A new API key of the service and its record (whose id revokes it)."""
        local = sandboxer.Sandboxer(home=self.home, actor="test-setup")
        try:
            return local.create_api_key(scope, owner=owner)
        finally:
            local.close()

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(15)
        for sock in self._sockets:
            sock.close()
        if self.socket_path and os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        if self.client is not None:
            self.client._transport.close_blocking()


@contextmanager
def served_profile(home: Path, folder: Path, monkeypatch, name: str,
                   profile: dict) -> Iterator[LiveService]:
    """A live service over `home` whose profile path is `folder`, holding `name`.yaml
    (`profile`); afterwards it stops and the containers the test made are removed."""
    folder.mkdir()
    (folder / f"{name}.yaml").write_text(json.dumps(profile))
    monkeypatch.setenv("SBX_PROFILE_PATH", str(folder))
    live = LiveService(home).start()
    try:
        yield live
    finally:
        live.stop()
        remove_test_containers(home)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_process(sbx_cmd: list[str], env: dict[str, str], *args: str,
                  cwd: Path | None = None) -> tuple[subprocess.Popen, str]:
    """A real `sbx serve --listen 127.0.0.1:PORT` process; (the process, its URL) once it
    answers /healthz."""
    import httpx

    port = free_port()
    proc = subprocess.Popen([*sbx_cmd, "serve", "--listen", f"127.0.0.1:{port}", *args],
                            env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"sbx serve exited {proc.returncode}: {proc.stderr.read()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("sbx serve did not answer within 60s")
        time.sleep(0.1)


def stop_process(proc: subprocess.Popen) -> tuple[str, str]:
    proc.terminate()
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return out, err
