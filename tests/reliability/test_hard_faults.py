"""Hard faults on real parts: a full disk (a small tmpfs of the test's own holding SBX_HOME)
and an engine restart (a second dockerd of the test's own, never the shared one).

Everything a test makes carries the run label or the test's installation label and is
removed by id; the tmpfs is unmounted and the private engine stopped in teardown.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from support import (
    ROOT,
    RUN_LABEL,
    SbxRunner,
    containers_of,
    events_of,
    install_id_of,
    query,
    remove_test_containers,
    show,
)

pytestmark = pytest.mark.docker

MiB = 1024**2
UNWANTED = ("sqlalchemy", "sqlite:", "Background on this error", "Traceback", "OperationalError")


# == 1. A full disk ==========================================================================


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs of this test's own."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs",
                              str(mount)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN), which this run lacks: "
                    f"{mounted.stderr.strip()}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(folder: Path) -> Path:
    """Write a file in `folder` until its filesystem has no byte left."""
    path = folder / "fill"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        size = MiB
        while size >= 1:
            try:
                os.write(fd, b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                size //= 2
    finally:
        os.close(fd)
    assert os.statvfs(folder).f_bavail == 0
    return path


def digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def untouched(home: Path) -> dict[str, object]:
    """What a write would change, read without SQLite (which cannot open anything on a full
    disk): the database file, the event log's anchor, the WAL's size (0 or none when nothing
    was written since the last process closed the database)."""
    wal = home / "sbx.db-wal"
    return {"db": digest(home / "sbx.db"), "anchor": digest(home / "sbx.db.head"),
            "wal": wal.stat().st_size if wal.exists() else 0}


def one_line_naming(result, home: Path) -> None:
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert str(home) in lines[0] and "nothing was changed" in lines[0], lines[0]
    assert not any(word in result.out + result.err for word in UNWANTED), result.err


def test_a_full_disk_refuses_writes_in_one_line_and_sandboxes_still_end(
        small_disk, tmp_path, docker_api):
    home = small_disk / "sbx-home"
    sbx = SbxRunner(home, tmp_path)
    try:
        boxes = [sbx.create("--ttl", "10m") for _ in range(3)]
        install = install_id_of(home)
        refs = {b["backend_ref"] for b in boxes}
        reserve = home / "sbx.db.reserve"
        assert reserve.stat().st_blocks * 512 >= 8 * MiB  # allocated, not a hole
        filler = fill(small_disk)
        before = untouched(home)

        # a create, and any other write: exit 5, one line, nothing written, nothing made
        created = sbx("create", "--label", RUN_LABEL, "--ttl", "10m")
        assert created.code == 5, (created.code, created.out, created.err)
        one_line_naming(created, home)
        as_json = sbx("create", "--label", RUN_LABEL, "--json")
        assert as_json.code == 5 and as_json.json()["error"]["code"] == 5, as_json.out
        extended = sbx("extend", boxes[0]["id"], "5m")
        assert extended.code == 5, (extended.code, extended.out, extended.err)
        one_line_naming(extended, home)
        assert untouched(home) == before
        assert {c["Id"] for c in containers_of(docker_api, install)} == refs
        assert reserve.exists()

        # a destroy still ends its sandbox: it releases the reserve first
        destroyed = sbx("destroy", boxes[0]["id"])
        assert destroyed.code == 0, (destroyed.code, destroyed.out, destroyed.err)
        assert not reserve.exists()
        assert boxes[0]["backend_ref"] not in {c["Id"] for c in containers_of(docker_api, install)}

        # space comes back: the next command makes the reserve again; then the disk fills up
        # again, and the reaper ends what is past its deadline
        filler.unlink()
        assert show(sbx, boxes[1]["id"])["state"] == "running"
        assert reserve.stat().st_blocks * 512 >= 8 * MiB
        filler = fill(small_disk)
        reaped = sbx("reap", "--json", env={"SBX_CLOCK_OFFSET": "11m"})
        assert reaped.code == 0, (reaped.code, reaped.out, reaped.err)
        assert sorted(reaped.json()["destroyed"]) == sorted(b["id"] for b in boxes[1:])
        assert containers_of(docker_api, install) == []

        filler.unlink()
        verified = sbx("events", "verify")
        assert verified.code == 0, (verified.out, verified.err)
        states = {r["id"]: r["state"] for r in query(home, "SELECT id, state FROM sandboxes")}
        assert states == {b["id"]: "destroyed" for b in boxes}  # no row for the refused ones
        for box in boxes:
            assert [e["type"] for e in events_of(sbx, box["id"])][-1] == "sandbox.destroyed"
    finally:
        remove_test_containers(home)


# == 2. An engine restart ====================================================================


class PrivateEngine:
    """A dockerd of this test's own: its own data root, exec root, socket and pid file, no
    bridge and no iptables rules, in a network namespace of its own (a dockerd started with
    --bridge=none deletes the host's docker0, the shared engine's default bridge), so
    starting and stopping it touches nothing the shared engine runs."""

    def __init__(self) -> None:
        # short: containerd's socket lives under the exec root, and unix paths are short
        self.folder = Path(tempfile.mkdtemp(prefix="sbx-engine-", dir="/tmp"))
        self.socket = self.folder / "docker.sock"
        self.url = f"unix://{self.socket}"
        (self.folder / "daemon.json").write_text("{}\n")  # not the host's /etc/docker one
        self.log = self.folder / "dockerd.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        binary = shutil.which("dockerd")
        assert binary, "dockerd is not installed (make test installs docker.io)"
        isolate = shutil.which("unshare")
        assert isolate, "unshare is not installed (util-linux)"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(  # unshare execs dockerd: the same process
                [isolate, "--net", binary, "--config-file", str(self.folder / "daemon.json"),
                 "--data-root", str(self.folder / "data"),
                 "--exec-root", str(self.folder / "exec"), "-H", self.url,
                 "--pidfile", str(self.folder / "docker.pid"), "--bridge=none",
                 "--iptables=false", "--ip-masq=false", "--log-level=warn"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 90
        while True:
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            try:
                with self.client() as api:
                    api.ping()
                return
            except docker.errors.DockerException:
                assert time.monotonic() < deadline, "the private dockerd did not answer"
                time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM, as an engine restart or a host shutdown sends it; wait for the end."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def client(self) -> docker.APIClient:
        return docker.APIClient(base_url=self.url, version="auto", timeout=60)

    def close(self, install: str | None) -> None:
        if self.proc is not None and self.proc.poll() is None and install:
            with self.client() as api:
                for info in containers_of(api, install):
                    api.remove_container(info["Id"], force=True, v=True)
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture
def private_engine(sbx) -> Iterator[PrivateEngine]:
    engine = PrivateEngine()
    try:
        engine.start()
        built = subprocess.run([sys.executable, "-m", "sandboxer.adapters.docker_image"], cwd=ROOT,
                               env={**os.environ, "DOCKER_HOST": engine.url},
                               capture_output=True, text=True, timeout=300)
        assert built.returncode == 0, built.stderr
        yield engine
    finally:
        engine.close(install_id_of(sbx.home))


def container_state(engine: PrivateEngine, ref: str) -> dict:
    with engine.client() as api:
        return api.inspect_container(ref)["State"]


@pytest.mark.slow
def test_an_engine_restart_brings_sandboxes_back_and_says_so(sbx, private_engine):
    engine = private_engine
    env = {"DOCKER_HOST": engine.url}
    running = sbx.create("--ttl", "10m", env=env)
    paused = sbx.create("--ttl", "10m", env=env)
    assert sbx("pause", paused["id"], env=env).code == 0
    # one that cannot come back: its container has no restart policy (as one made before
    # sbx asked for it, or changed by hand)
    stays_down = sbx.create("--ttl", "10m", env=env)
    with engine.client() as api:
        api.update_container(stays_down["backend_ref"], restart_policy={"Name": "no"})
    time.sleep(2.5)  # the listing's times are whole seconds: let the restart be told apart

    engine.restart()

    reconciled = sbx("reconcile", "--json", env=env)
    assert reconciled.code == 0, (reconciled.out, reconciled.err)
    report = reconciled.json()
    assert report["failed"] == [], report
    assert {(r["id"], r["action"], r["state"]) for r in report["reconciled"]} == {
        (running["id"], "restart", "running"), (paused["id"], "restart", "paused"),
        (stays_down["id"], "lose", "lost")}

    assert show(sbx, running["id"])["state"] == "running"
    assert container_state(engine, running["backend_ref"])["Running"]
    (restarted,) = [e for e in events_of(sbx, running["id"]) if e["type"] == "sandbox.restarted"]
    assert restarted["reason"] == "restarted"
    assert restarted["payload"]["paused_again"] is False
    hello = sbx("exec", running["id"], "--", "echo", "back", env=env)
    assert (hello.code, hello.out) == (0, "back\n"), hello.err

    assert show(sbx, paused["id"])["state"] == "paused"
    assert container_state(engine, paused["backend_ref"])["Paused"]  # paused again
    (again,) = [e for e in events_of(sbx, paused["id"]) if e["type"] == "sandbox.restarted"]
    assert again["payload"]["paused_again"] is True
    assert sbx("resume", paused["id"], env=env).code == 0
    assert sbx("exec", paused["id"], "--", "true", env=env).code == 0

    assert show(sbx, stays_down["id"])["state"] == "lost"
    lost = events_of(sbx, stays_down["id"])[-1]
    assert (lost["type"], lost["reason"]) == ("sandbox.lost", "stopped")

    # recorded once: the next cycles have nothing to say, and nothing is reaped early
    for command in ("reconcile", "reap"):
        again = sbx(command, "--json", env=env)
        assert again.code == 0, (again.out, again.err)
        assert not any(again.json().values()), again.out  # every list (and the reasons) empty
    assert [e["type"] for e in events_of(sbx, running["id"])].count("sandbox.restarted") == 1
    verified = sbx("events", "verify")
    assert verified.code == 0, verified.err
