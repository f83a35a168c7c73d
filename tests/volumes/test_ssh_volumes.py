"""Volumes on the ssh backend (docs/volumes.md), through the real `sbx` CLI against a real
OpenSSH server on 127.0.0.1 (tests/sshd.py), whose inventory user is this test's (root): "the
host" is this machine, so the volume's folder (~/.sbx/volumes/<id>) and the bind mounts
are seen directly. A volume outlives the sandbox that wrote it, a read-only mount refuses
writes, files go in and out without a sandbox, the reaper and `rm` remove the folder, and
bad input is refused with exit 2 and changes nothing."""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sshd import sshd_server  # noqa: F401 (a fixture)
from support import RUN_LABEL, SBX, table_rows, write_profile

pytestmark = pytest.mark.sshd


def adapter_rows(home: Path, table: str) -> list[dict]:
    """Rows of the ssh adapter's own file (ssh_volumes, ssh_mounts, ssh_leases)."""
    path = home / "ssh-leases.db"
    if not path.exists():
        return []
    with sqlite3.connect(path) as conn:
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute(f"SELECT * FROM {table}")]  # noqa: S608
        except sqlite3.OperationalError:  # the table was never made
            return []


def mounted(path: Path) -> bool:
    target = str(path).replace(" ", "\\040")
    return any(line.split()[1] == target for line in Path("/proc/self/mounts").read_text()
               .splitlines())


@pytest.fixture
def ssh(sbx, sshd_server, tmp_path) -> Iterator[dict]:  # noqa: F811
    """Two hosts (two ports of one sshd) in $SBX_SSH_INVENTORY, a profile that may take
    either, and one that takes only the second; afterwards what a failed test left (leases
    destroyed, mounts undone, the volumes' folders removed by id)."""
    hosts = [sshd_server.inventory_entry(f"host-{i}", port, {"slot": str(i)})
             for i, port in enumerate(sshd_server.ports[:2], 1)]
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": hosts}))
    body = ("backend: ssh\nnetwork: {mode: full}\nresources: {memory: null, pids: null}\n")
    any_host = write_profile(tmp_path, "attach", body + yaml.safe_dump(
        {"options": {"inventory": str(inventory), "connect_timeout": 5}}))
    second = write_profile(tmp_path, "second", body + yaml.safe_dump(
        {"options": {"inventory": str(inventory), "connect_timeout": 5,
                     "match": {"slot": "2"}}}))
    env = {"SBX_SSH_INVENTORY": str(inventory)}
    yield {"env": env, "any": str(any_host), "second": str(second)}
    for lease in adapter_rows(sbx.home, "ssh_leases"):
        sbx("destroy", lease["sandbox_id"], "--yes", env=env)
    for mount in adapter_rows(sbx.home, "ssh_mounts"):
        subprocess.run(["umount", "-l", mount["path"]], capture_output=True)
    for volume in adapter_rows(sbx.home, "ssh_volumes"):
        folder = Path(volume["folder"])
        if folder.name == volume["volume_id"] and (folder / "sbx-volume.json").is_file():
            shutil.rmtree(folder)


def volume_ok(sbx, env, *args: str) -> dict:
    result = sbx("volume", *args, "--json", env=env)
    assert result.code == 0, result.err
    return result.json()


def folder_of(sbx, volume_id: str) -> Path:
    [row] = [r for r in adapter_rows(sbx.home, "ssh_volumes") if r["volume_id"] == volume_id]
    return Path(row["folder"])


def test_a_volume_outlives_its_sandbox_and_a_read_only_mount_refuses_writes(sbx, ssh,
                                                                           tmp_path):
    env = ssh["env"]
    vol = volume_ok(sbx, env, "create", "memory", "--backend", "ssh", "--label", "team=a")
    assert (vol["backend"], vol["labels"]) == ("ssh", {"team": "a"})
    data = folder_of(sbx, vol["id"]) / "volume"
    assert data.is_dir() and list(data.iterdir()) == []
    mark = json.loads((data.parent / "sbx-volume.json").read_text())  # sbx's, by its labels
    assert mark["sbx.volume"] == vol["id"] and mark["team"] == "a"

    work = tmp_path / "work"  # not there yet: made for the mount, removed after it
    first = sbx.create("--profile-file", ssh["any"], "--volume", f"memory:{work}", env=env)
    assert first["backend_ref"].startswith("host-1/")  # the host that keeps the volume
    assert mounted(work)
    wrote = sbx("exec", first["id"], "--", "sh", "-c", f"echo learnt > {work}/notes", env=env)
    assert wrote.code == 0, wrote.err
    shown = volume_ok(sbx, env, "show", "memory")
    assert shown["mounted_by"] == [{"sandbox": first["id"], "path": str(work),
                                    "read_only": False}]
    assert shown["size_bytes"] >= len("learnt\n")
    assert sbx("destroy", first["id"], "--yes", env=env).code == 0
    assert not mounted(work) and not work.exists()
    assert (data / "notes").read_text() == "learnt\n"  # the volume stays

    seen = tmp_path / "seen"
    seen.mkdir()  # there already: kept after the mount ends
    second = sbx.create("--profile-file", ssh["any"], "--volume", f"memory:{seen}:ro",
                        env=env)
    read = sbx("exec", second["id"], "--", "cat", f"{seen}/notes", env=env)
    assert (read.code, read.out) == (0, "learnt\n")
    refused = sbx("exec", second["id"], "--", "sh", "-c", f"echo more >> {seen}/notes",
                  env=env)
    assert refused.code != 0 and "Read-only file system" in refused.err
    assert (data / "notes").read_text() == "learnt\n"
    assert sbx("destroy", second["id"], "--yes", env=env).code == 0
    assert not mounted(seen) and seen.is_dir()
    assert adapter_rows(sbx.home, "ssh_mounts") == []


def test_files_without_a_sandbox_and_rm_removes_the_folder(sbx, ssh, tmp_path):
    env = ssh["env"]
    vol = volume_ok(sbx, env, "create", "repo", "--backend", "ssh")
    source = tmp_path / "checkout"
    (source / "src").mkdir(parents=True)
    (source / "src" / "a.txt").write_text("alpha\n")
    put = sbx("volume", "put", "repo", str(source), "/", env=env)
    assert put.code == 0, put.err
    folder = folder_of(sbx, vol["id"])
    assert (folder / "volume" / "checkout" / "src" / "a.txt").read_text() == "alpha\n"

    out = tmp_path / "out"
    out.mkdir()
    got = sbx("volume", "get", "repo", "/checkout/src", str(out), env=env)
    assert got.code == 0, got.err
    assert (out / "src" / "a.txt").read_text() == "alpha\n"
    proc = subprocess.run([*SBX, "volume", "get", "repo", "/checkout/src/a.txt", "-"],
                          cwd=sbx.cwd, env=sbx.env(env), capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        assert tar.getnames() == ["a.txt"]
        assert tar.extractfile("a.txt").read() == b"alpha\n"

    missing = sbx("volume", "get", "repo", "/checkout/nope", str(out), env=env)
    assert missing.code == 3 and "/checkout/nope does not exist in volume 'repo'" in missing.err
    assert str(folder) not in missing.err and len(missing.err.strip().splitlines()) == 1
    moved = [e["payload"] for e in sbx("events", "--json").json() if e["type"] == "volume.file"]
    assert [(p["op"], p["path"]) for p in moved] == [
        ("upload", "/"), ("download", "/checkout/src"), ("download", "/checkout/src/a.txt")]

    assert sbx("volume", "rm", "repo", env=env).code == 0
    assert not folder.exists()
    assert adapter_rows(sbx.home, "ssh_volumes") == []
    assert sbx("volume", "rm", "repo", env=env).code == 3


def test_the_reaper_removes_an_expired_ssh_volume(sbx, ssh):
    env = ssh["env"]
    vol = volume_ok(sbx, env, "create", "scratch", "--backend", "ssh", "--ttl", "10m")
    folder = folder_of(sbx, vol["id"])
    reaped = sbx("reap", "--json", env={**env, "SBX_CLOCK_OFFSET": "1h"})
    assert reaped.code == 0, reaped.err
    assert {"volume": vol["id"], "action": "expired volume removed",
            "reason": "ttl"} in reaped.json()["reconciled"]
    assert not folder.exists() and volume_ok(sbx, env, "ls") == []


def test_bad_input_is_refused_and_changes_nothing(sbx, ssh, tmp_path):
    env = ssh["env"]
    # no inventory to keep it on: nothing made
    bare = sbx("volume", "create", "lost", "--backend", "ssh")
    assert bare.code == 2 and "set $SBX_SSH_INVENTORY" in bare.err, bare.err
    assert len(bare.err.strip().splitlines()) == 1 and "Traceback" not in bare.err
    assert table_rows(sbx.home, "volumes") == [] and adapter_rows(sbx.home, "ssh_volumes") == []

    # a profile that cannot run on the volume's host: refused before anything is leased
    volume_ok(sbx, env, "create", "kept", "--backend", "ssh")
    events = table_rows(sbx.home, "events")
    elsewhere = sbx("create", "--label", RUN_LABEL, "--profile-file", ssh["second"],
                    "--volume", f"kept:{tmp_path / 'k'}", env=env)
    assert elsewhere.code == 2, elsewhere.err
    assert "is kept on ssh host 'host-1'" in elsewhere.err
    assert len(elsewhere.err.strip().splitlines()) == 1 and "127.0.0.1" not in elsewhere.err
    assert table_rows(sbx.home, "sandboxes") == [] and table_rows(sbx.home, "events") == events
    assert adapter_rows(sbx.home, "ssh_leases") == [] and not (tmp_path / "k").exists()

    # a mount path that is not absolute: the core's rule, as on docker
    relative = sbx("create", "--label", RUN_LABEL, "--profile-file", ssh["any"],
                   "--volume", "kept:relative", env=env)
    assert relative.code == 2 and "is not a mount path" in relative.err
    assert table_rows(sbx.home, "sandboxes") == [] and adapter_rows(sbx.home, "ssh_mounts") == []
