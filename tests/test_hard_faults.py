"""Hard faults on real parts: a full disk (a small tmpfs of the test's own holding SBX_HOME)
and an engine restart (a second dockerd of the test's own, never the shared one).

Everything a test makes carries the run label or the test's installation label and is
removed by id; the tmpfs is unmounted and the private engine stopped in teardown.
"""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
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
