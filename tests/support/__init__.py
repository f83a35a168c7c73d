"""What the tests share: the run label, the real `sbx` in a subprocess (the entry point users
run: `python -m sandboxer_tui`, pip's `sbx` script's code), reading a test's own database, removing what a test made; and the fixtures
tests/conftest.py registers. Every test gets its own SBX_HOME (so its own database and
installation id); everything a test creates on the engine carries the per-run label
`sbx-test-run`, and teardown removes only those containers, by id."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Cloud credentials a developer's shell may hold never reach a test: every E2B_/MODAL_
# variable a test sees is one it set itself, pointing at a local stand-in.
for _name in [n for n in os.environ if n.startswith(("E2B_", "MODAL_"))]:
    del os.environ[_name]
# Every test runs sbx as a user gets it by default: no server is started on first use unless
# SBX_SERVER_AUTOSTART=1 (a developer's shell may set it; tests/cli/test_autostart.py turns it on
# where it is the point).
os.environ.pop("SBX_SERVER_AUTOSTART", None)
RUN_ID = uuid.uuid4().hex[:12]
RUN_LABEL = f"sbx-test-run={RUN_ID}"
# `sbx` exactly as pip's script runs it (sandboxer_tui.__main__:main): a command runs
# in this process unless an `sbx server` a test started for its SBX_HOME takes it.
SBX = [sys.executable, "-m", "sandboxer_tui"]


@pytest.fixture
def sbx_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "sbx-home"
    monkeypatch.setenv("SBX_HOME", str(home))
    monkeypatch.delenv("SBX_DATABASE_URL", raising=False)
    monkeypatch.delenv("SBX_PROFILE_PATH", raising=False)
    monkeypatch.delenv("SBX_CLOCK_OFFSET", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.chdir(tmp_path)
    return home


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


@dataclass
class SbxRunner:
    """Runs the real `sbx` in a subprocess with the test's own SBX_HOME."""

    home: Path
    cwd: Path

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
        env.update(SBX_HOME=str(self.home), XDG_CONFIG_HOME=str(self.cwd / "xdg-config"))
        env.update(extra or {})
        return env

    def __call__(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120,
                 input: str | None = None) -> Result:
        proc = subprocess.run([*SBX, *args], cwd=self.cwd, env=self.env(env), text=True,
                              capture_output=True, timeout=timeout, input=input)
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def create(self, *args: str, env: dict[str, str] | None = None) -> dict:
        """`sbx create --json` with the run label; fails the test if it does not work."""
        result = self("create", "--label", RUN_LABEL, *args, "--json", env=env)
        assert result.code == 0, result.err or result.out
        return result.json()


@pytest.fixture
def sbx(sbx_home: Path, tmp_path: Path) -> Iterator[SbxRunner]:
    runner = SbxRunner(sbx_home, tmp_path)
    yield runner
    remove_test_containers(sbx_home)


def one_json(out: str):
    """stdout holds exactly one JSON document and nothing else."""
    decoder = json.JSONDecoder()
    text = out.strip()
    assert text, "nothing on stdout, expected one JSON document"
    doc, end = decoder.raw_decode(text)
    assert text[end:].strip() == "", f"more than one JSON document on stdout: {out!r}"
    return doc


def write_profile(folder: Path, name: str, body: str) -> Path:
    """A profile file `name`.yaml in `folder`; its path."""
    path = folder / f"{name}.yaml"
    path.write_text(body)
    return path


def events_of(sbx: SbxRunner, sandbox_id: str) -> list[dict]:
    """`sbx events ID --json`, which must succeed: the sandbox's events, oldest first."""
    result = sbx("events", sandbox_id, "--json")
    assert result.code == 0, result.err
    return result.json()


def show(sbx: SbxRunner, sandbox_id: str) -> dict:
    """`sbx show ID --json`, which must succeed: the sandbox as the CLI reports it."""
    result = sbx("show", sandbox_id, "--json")
    assert result.code == 0, result.err
    return result.json()


def install_id_of(home: Path) -> str | None:
    path = home / "install-id"
    return path.read_text().strip() if path.exists() else None


def containers_of(docker_api, install: str) -> list[dict]:
    """Every container on the engine (running or not) made by the installation `install`."""
    return docker_api.containers(all=True, filters={"label": [f"sbx.install={install}"]})


def remove_test_containers(home: Path) -> None:
    """Remove, by id, the containers this test's installation made (and only those), then
    its bridge network (`network: full`), if it made one, and the checkpoint images it made
    (they carry its `sbx.install` label; left behind, every later full look lists them)."""
    install = install_id_of(home)
    if install is None:
        return
    try:
        import docker
    except ImportError:
        return
    try:
        api = docker.APIClient(version="auto")
        for info in containers_of(api, install):
            api.remove_container(info["Id"], force=True, v=True)
        for network in api.networks(filters={"label": [f"sbx.install={install}"]}):
            api.remove_network(network["Id"])
        for image in api.images(filters={"label": [f"sbx.install={install}"]}):
            with contextlib.suppress(docker.errors.APIError):  # gone, or used by another's
                api.remove_image(image["Id"], force=True)
        api.close()
    except docker.errors.DockerException:
        pass


# -- reading the installation's database directly (read-only) -------------------------------


def _connect(home: Path) -> sqlite3.Connection:
    """A read-only connection to `home`'s database (it must exist)."""
    path = home / "sbx.db"
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)


def query(home: Path, sql: str, *params) -> list[dict]:
    """The rows of one read-only query on `home`'s database, as dicts."""
    conn = _connect(home)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, params).fetchall()]
    finally:
        conn.close()


def table_rows(home: Path, table: str) -> list[tuple]:
    """Every row of a table, in primary-key order; [] when the database or the table does not
    exist yet."""
    if not (home / "sbx.db").exists():
        return []
    conn = _connect(home)
    try:
        return conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise
    finally:
        conn.close()


@pytest.fixture
def docker_api() -> Iterator[object]:
    """The real engine's API client. `make test` starts the engine; without one this fails,
    it does not skip: the Docker tests are the point of the suite."""
    import docker

    api = docker.APIClient(version="auto")
    api.ping()
    yield api
    api.close()


class NothingHere:
    """A backend holding none of this installation's objects: stands in for the other
    registered backends when a unit test runs a Reaper on the stub alone."""

    capabilities = frozenset()
    test_double = True

    def supports(self, capability) -> bool:
        return False

    async def list(self, labels):
        return []

    async def instance_id(self):
        return None

    async def close(self) -> None:
        pass


# -- a real terminal ------------------------------------------------------------------------


class Tmux:
    """A tmux server on a socket of its own (the only one the test kills): a session `main`
    runs a program, `keys` types into it, `screen` reads it as the user sees it."""

    def __init__(self) -> None:
        self.socket = f"sbx-tui-test-{uuid.uuid4().hex[:10]}"

    def __call__(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args],
                              capture_output=True, text=True, timeout=20)
        if check:
            assert done.returncode == 0, done.stderr
        return done.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "main")

    def keys(self, *keys: str) -> None:
        self("send-keys", "-t", "main", *keys)

    def wait(self, predicate, within: float, what: str) -> float:
        started = time.monotonic()
        while True:
            screen = self.screen()
            if predicate(screen):
                return time.monotonic() - started
            if time.monotonic() - started > within:
                raise AssertionError(f"no {what} within {within}s; the screen:\n{screen}")
            time.sleep(0.05)

    def kill(self) -> None:
        self("kill-server", check=False)


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    server = Tmux()
    yield server
    server.kill()


def dashboard_script(folder: Path, env: dict[str, str], cwd: Path, then: str = "") -> Path:
    """folder/dashboard.sh: runs the dashboard (`python -m sandboxer_tui.cli`) in `cwd` with
    `env`, prints `exit=CODE` when it ends, runs `then` (shell lines, each ending in a
    newline), and keeps the pane open for a minute."""
    import shlex

    script = folder / "dashboard.sh"
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items()
                        if k.isidentifier())
    script.write_text(f"""{exports}
cd {shlex.quote(str(cwd))}
{shlex.quote(sys.executable)} -m sandboxer_tui.cli
echo "exit=$?"
{then}sleep 60
""")
    return script


def row_line(screen: str, name: str) -> str | None:
    """The dashboard's line for the sandbox `name` on `screen`, if there is one."""
    return next((line for line in screen.splitlines() if f" {name} " in line), None)


# -- sbx server ------------------------------------------------------------------------------


@dataclass
class Launcher(SbxRunner):
    """Like the `sbx` fixture, with `argv` to run and the `sbx server` status at hand: a server
    running for the test's SBX_HOME takes the commands."""

    argv: list[str] = field(default_factory=lambda: SBX)

    def __call__(self, *args: str | bytes, env: dict[str, str] | None = None,
                 timeout: float = 120, input: str | None = None) -> Result:
        proc = subprocess.run([*self.argv, *args], cwd=self.cwd, env=self.env(env), text=True,
                              capture_output=True, timeout=timeout, input=input)
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def status(self) -> dict:
        result = Launcher(self.home, self.cwd)("server", "status", "--json")
        assert result.code == 0, result.err
        return result.json()


# -- a command's input and output as an adapter takes them (the backends' files tests) ------


async def chunks(data: bytes, size: int = 65536) -> AsyncIterator[bytes]:
    """`data` as an async iterator of pieces: a caller's streamed stdin or upload."""
    for at in range(0, len(data), size):
        yield data[at:at + size]


async def gather(stream: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in stream])


class SourceBroke(Exception):
    """What `breaking()` raises: a caller's stream that fails midway."""


async def breaking() -> AsyncIterator[bytes]:
    yield b"partial\n"
    raise SourceBroke("the caller's stream broke")


def alive(pid: int) -> bool:
    """A process of this host that exists and has not ended (a zombie has ended)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return "\nState:\tZ" not in status and "\nState:\tX" not in status


async def terminal_until(term, wanted: bytes, limit: float = 30, seen: bytes = b"") -> bytes:
    """`seen` and a PtyChannel's further output, read until `wanted` is in them; an
    AssertionError saying what came if it ends or `limit` passes first."""
    import asyncio


    async def read() -> None:
        nonlocal seen
        while wanted not in seen:
            chunk = await term.read()
            assert chunk, f"the terminal ended before {wanted!r}: {seen[-300:]!r}"
            seen += chunk

    try:
        await asyncio.wait_for(read(), limit)
    except TimeoutError:
        raise AssertionError(f"no {wanted!r} within {limit}s: {seen[-300:]!r}") from None
    return seen


def wait_ended(pids, limit: float = 30) -> list[int]:
    """Those of `pids` (processes of this host) still alive after up to `limit` seconds."""
    deadline = time.monotonic() + limit
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


async def library_terminal(home: Path, actor: str, profile: str | dict) -> tuple[bytes, int | None]:
    """box.pty() through the library on `profile` (a name, or a dict checked first): asks for
    90x20 and reads `stty size`, resizes to 120x40 and waits for it, then `exit 4`. The
    terminal's output up to `sum=42` and its exit code; the sandbox is destroyed."""
    import asyncio

    import sandboxer

    client = sandboxer.AsyncSandboxer(home=home, actor=actor)
    try:
        if isinstance(profile, dict):
            profile = await client.check_profile(profile)
        box = await client.create(profile, ttl="10m")
        try:
            term = await box.pty(cols=90, rows=20)
            await term.write("stty size; echo sum=$((6*7))\r")
            seen = await terminal_until(term, b"sum=42")
            await term.resize(120, 40)
            await term.write("stty size\r")
            await terminal_until(term, b"40 120")
            await term.write("exit 4\r")
            return seen, await asyncio.wait_for(term.wait(), 30)
        finally:
            await box.destroy()
    finally:
        await client.close()


# -- the library's two transports (tests/api, tests/integrations) ----------------------------


@contextmanager
def service_for(transport: str, home: Path) -> Iterator[object | None]:
    """A live service (tests/service/live.py) over `home` when `transport` is `remote`; None
    when it is `local`."""
    if transport == "local":
        yield None
        return
    from tests.service.live import LiveService

    live = LiveService(home).start()
    yield live
    live.stop()


def library_client(cls, service, home: Path, actor: str):
    """`cls` (Sandboxer or AsyncSandboxer) in process on `home` as `actor` when `service` is
    None, else a client of that live service with its admin key."""
    if service is None:
        return cls(home=home, actor=actor)
    return cls(url=service.url, token=service.key())


def modal_sdk_env(monkeypatch: pytest.MonkeyPatch, url: str, token_id: str, token_secret: str,
                  config: Path) -> None:
    """The modal SDK (here and in an `sbx` the test starts) pointed at the stand-in at `url`
    with that token; its config file `config` (never ~/.modal.toml), no profile, environment
    or sandbox-v2 choice from the developer's shell."""
    monkeypatch.setenv("MODAL_SERVER_URL", url)
    monkeypatch.setenv("MODAL_TOKEN_ID", token_id)
    monkeypatch.setenv("MODAL_TOKEN_SECRET", token_secret)
    monkeypatch.setenv("MODAL_CONFIG_PATH", str(config))
    for name in ("MODAL_PROFILE", "MODAL_ENVIRONMENT", "MODAL_SANDBOX_V2"):
        monkeypatch.delenv(name, raising=False)
