"""Checkpoints, pause and resume on the real Docker engine, through the real `sbx` CLI.

A checkpoint is a `docker commit` tagged `sandboxer/checkpoint:<ckpt-id>-<installation digest>`
(the tag of the installation holding it, `tag_of`) and labelled with `sbx.checkpoint`,
`sbx.install` and `sbx.id`; an archive names the image `sandboxer/checkpoint:<ckpt-id>`. The `sbx` fixture removes this test's
containers but not images, so every test here takes the `made` fixture, which first removes
the containers of each installation the test used and then the checkpoint images labelled
with those installations' ids (newest first, by tag), plus any tag the test recorded. Only
what this test made is removed: every installation id is the test's own.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import docker
import pytest
from support import (
    RUN_ID,
    RUN_LABEL,
    SBX,
    Result,
    SbxRunner,
    containers_of,
    events_of,
    install_id_of,
    query,
    remove_test_containers,
    show,
    table_rows,
    write_profile,
)

pytestmark = pytest.mark.docker

REPOSITORY = "sandboxer/checkpoint"
BURNER = 'extends: default\ncommand: ["sh", "-c", "while :; do :; done"]\n'


# -- cleanup --------------------------------------------------------------------------------


class Made:
    """What one test made on the engine beyond its containers: checkpoint images of its
    installations (found by their `sbx.install` label) and tags it recorded."""

    def __init__(self, api, home: Path) -> None:
        self.api = api
        self.homes = [home]
        self.tags: list[str] = []
        self.image_ids: list[str] = []  # images the test made itself, removed by id

    def runner(self, sbx: SbxRunner, name: str) -> SbxRunner:
        """Another installation (its own SBX_HOME) on the same engine, cleaned up likewise."""
        home = sbx.cwd / name
        self.homes.append(home)
        return SbxRunner(home, sbx.cwd)

    def _images(self) -> list[dict]:
        found: dict[str, dict] = {}
        for home in self.homes:
            install = install_id_of(home)
            if install:
                for info in self.api.images(all=True,
                                            filters={"label": [f"sbx.install={install}"]}):
                    found[info["Id"]] = info
        return sorted(found.values(), key=lambda i: i.get("Created", 0), reverse=True)

    def _remove(self, ref: str) -> None:
        try:
            self.api.remove_image(ref, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError:
            pass  # a parent whose child goes later; the second pass takes it

    def cleanup(self) -> None:
        for home in self.homes:
            remove_test_containers(home)
        for tag in self.tags:
            self._remove(tag)
        for image_id in self.image_ids:
            self._remove(image_id)
        for _ in range(2):  # children first (newest first); a second pass for their parents
            for info in self._images():
                tags = [t for t in info.get("RepoTags") or [] if t != "<none>:<none>"]
                for ref in tags or [info["Id"]]:
                    self._remove(ref)


@pytest.fixture
def made(sbx, docker_api):
    tracker = Made(docker_api, sbx.home)
    yield tracker
    tracker.cleanup()


# -- helpers --------------------------------------------------------------------------------


def ok(result: Result) -> Result:
    assert result.code == 0, (result.code, result.out, result.err)
    return result


def sh(sbx: SbxRunner, box_id: str, script: str) -> str:
    """`sbx exec ID -- sh -c SCRIPT`, which must succeed; its stdout."""
    return ok(sbx("exec", box_id, "--", "sh", "-c", script)).out


def snapshot(sbx: SbxRunner, box_id: str, *args: str, env: dict[str, str] | None = None) -> dict:
    return ok(sbx("snapshot", box_id, *args, "--json", env=env)).json()


def restore(sbx: SbxRunner, ckpt_id: str, *args: str) -> dict:
    return ok(sbx("restore", ckpt_id, "--label", RUN_LABEL, *args, "--json")).json()


def checkpoint_rows(home: Path) -> list[dict]:
    """The installation's checkpoint rows, oldest first, read from its database."""
    if not (home / "sbx.db").exists():
        return []
    return query(home, "SELECT * FROM checkpoints ORDER BY created_at, id")


def images_of(api, install: str) -> dict[str, dict]:
    """The installation's checkpoint images on the engine, by their `sbx.checkpoint` label."""
    return {info["Labels"]["sbx.checkpoint"]: info
            for info in api.images(filters={"label": [f"sbx.install={install}"]})
            if (info.get("Labels") or {}).get("sbx.checkpoint")}


def events(home: Path, sandbox_id: str) -> list[dict]:
    """The sandbox's events, oldest first, read from the database (payload decoded)."""
    rows = query(home, "SELECT type, reason, payload_json FROM events WHERE sandbox_id = ? "
                       "ORDER BY id", sandbox_id)
    return [{**r, "payload": json.loads(r["payload_json"] or "{}")} for r in rows]


def state_of(home: Path, sandbox_id: str) -> str:
    return query(home, "SELECT state FROM sandboxes WHERE id = ?", sandbox_id)[0]["state"]


def docker_sh(api, ref: str, script: str) -> str:
    """Read inside a container straight from the engine (checks only; quicker than sbx exec)."""
    exec_id = api.exec_create(ref, ["sh", "-c", script])["Id"]
    out = api.exec_start(exec_id).decode()
    assert api.exec_inspect(exec_id)["ExitCode"] == 0, out
    return out


def tag_exists(api, ref: str) -> bool:
    try:
        api.inspect_image(ref)
        return True
    except docker.errors.NotFound:
        return False


def tag_of(home: Path, ckpt_id: str) -> str:
    """The tag by which the installation at `home` holds the checkpoint's image."""
    from sandboxer.adapters.docker import holder_tag

    return holder_tag(ckpt_id, install_id_of(home))


def container_exists(api, ref: str) -> bool:
    try:
        api.inspect_container(ref)
        return True
    except docker.errors.NotFound:
        return False


def one_line(result: Result) -> str:
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sbx: "), result.err
    assert result.out == "", result.out
    return lines[0]


def cpu_percent(api, ref: str, samples: int = 2) -> list[float]:
    """CPU % of the container as `docker stats` computes it, over `samples` consecutive
    one-second intervals of the engine's stats stream."""
    found: list[float] = []
    previous = None
    stream = api.stats(ref, stream=True, decode=True)
    try:
        for stats in stream:
            cpu = stats["cpu_stats"]
            if previous is not None and cpu.get("system_cpu_usage"):
                used = cpu["cpu_usage"]["total_usage"] - previous["cpu_usage"]["total_usage"]
                system = cpu["system_cpu_usage"] - previous["system_cpu_usage"]
                cores = cpu.get("online_cpus") or 1
                found.append(used / system * cores * 100 if system > 0 else 0.0)
            previous = cpu
            if len(found) >= samples:
                return found
    finally:
        stream.close()
    return found


# -- 1. the same bytes back -----------------------------------------------------------------


def test_snapshot_destroy_restore_gives_back_the_same_bytes(sbx, docker_api, made):
    box = sbx.create()
    digest = sh(sbx, box["id"], "head -c 4096 /dev/urandom > /work/blob && "
                                "sha256sum /work/blob").split()[0]
    ckpt = snapshot(sbx, box["id"], "--name", "blob")
    assert ckpt["state"] == "ready" and ckpt["kind"] == "filesystem"
    assert ckpt["sandbox_id"] == box["id"] and ckpt["parent_id"] is None
    assert ckpt["name"] == "blob"
    tag = tag_of(sbx.home, ckpt["id"])
    assert ckpt["backend_ref"] == tag
    labels = docker_api.inspect_image(tag)["Config"]["Labels"]
    assert labels["sbx.checkpoint"] == ckpt["id"]
    assert labels["sbx.install"] == install_id_of(sbx.home)
    assert labels["sbx.id"] == box["id"]

    ok(sbx("destroy", "--yes", box["id"]))
    assert not container_exists(docker_api, box["backend_ref"])
    assert tag_exists(docker_api, tag), "the checkpoint must outlive its sandbox"

    again = restore(sbx, ckpt["id"])
    assert again["state"] == "running" and again["id"] != box["id"]
    assert docker_api.inspect_container(again["backend_ref"])["Config"]["Image"] == tag
    assert sh(sbx, again["id"], "sha256sum /work/blob").split()[0] == digest
    assert again["profile"] == box["profile"]
    created = [e for e in events(sbx.home, again["id"]) if e["type"] == "sandbox.creating"]
    assert created and created[0]["payload"]["restored_from"] == ckpt["id"]


# -- 2. lineage -----------------------------------------------------------------------------


def test_three_generations_show_their_lineage(sbx, docker_api, made):
    box0 = sbx.create()
    change = "cat /work/gen 2>/dev/null; echo {} >> /work/gen"
    assert docker_sh(docker_api, box0["backend_ref"], change.format(1)) == ""
    gen1 = snapshot(sbx, box0["id"])
    box1 = restore(sbx, gen1["id"])
    assert docker_sh(docker_api, box1["backend_ref"], change.format(2)) == "1\n"
    gen2 = snapshot(sbx, box1["id"])
    box2 = restore(sbx, gen2["id"])
    assert docker_sh(docker_api, box2["backend_ref"], change.format(3)) == "1\n2\n"
    gen3 = snapshot(sbx, box2["id"], "--name", "third")

    assert (gen1["parent_id"], gen2["parent_id"], gen3["parent_id"]) == (
        None, gen1["id"], gen2["id"])
    assert (gen1["sandbox_id"], gen2["sandbox_id"], gen3["sandbox_id"]) == (
        box0["id"], box1["id"], box2["id"])

    tree = ok(sbx("checkpoints", "--tree", "--json")).json()
    assert [n["id"] for n in tree] == [gen1["id"]]
    root = tree[0]
    assert root["parent_id"] is None and [c["id"] for c in root["children"]] == [gen2["id"]]
    middle = root["children"][0]
    assert middle["parent_id"] == gen1["id"]
    assert [c["id"] for c in middle["children"]] == [gen3["id"]]
    leaf = middle["children"][0]
    assert leaf["parent_id"] == gen2["id"] and leaf["children"] == []
    assert leaf["name"] == "third"
    for node in (root, middle, leaf):
        assert node["kind"] == "filesystem" and node["state"] == "ready"
        assert "profile_json" not in node

    human = ok(sbx("checkpoints", "--tree")).out.splitlines()
    assert len(human) == 3, human
    assert human[0].startswith(gen1["id"] + " "), human
    assert human[1].startswith("   └─ " + gen2["id"] + " "), human
    assert human[2].startswith("      └─ " + gen3["id"] + " third "), human

    # every generation is on the engine, tagged and labelled; the last has all three changes
    images = images_of(docker_api, install_id_of(sbx.home))
    assert set(images) == {gen1["id"], gen2["id"], gen3["id"]}
    last = restore(sbx, gen3["id"])
    assert docker_sh(docker_api, last["backend_ref"], "cat /work/gen") == "1\n2\n3\n"


# -- 3. fork --------------------------------------------------------------------------------


def test_fork_three_sandboxes_from_one_checkpoint_do_not_share(sbx, docker_api, made):
    box = sbx.create()
    sh(sbx, box["id"], "echo base > /work/shared")
    ckpt = snapshot(sbx, box["id"])

    procs = [subprocess.Popen([*SBX, "restore", ckpt["id"], "--label", RUN_LABEL, "--json"],
                              cwd=sbx.cwd, env=sbx.env(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(3)]
    forks = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        forks.append(json.loads(out))
    assert len({f["id"] for f in forks}) == 3
    assert len({f["backend_ref"] for f in forks}) == 3

    for i, fork in enumerate(forks):
        sh(sbx, fork["id"], f"echo {i} > /work/mine-{i} && echo {i} >> /work/shared")
    for i, fork in enumerate(forks):
        assert fork["state"] == "running"
        seen = docker_sh(docker_api, fork["backend_ref"], "ls /work; echo --; cat /work/shared")
        assert seen == f"mine-{i}\nshared\n--\nbase\n{i}\n", (i, seen)
    # the original is untouched by its forks
    assert docker_sh(docker_api, box["backend_ref"], "ls /work; cat /work/shared") == \
        "shared\nbase\n"
    rows = checkpoint_rows(sbx.home)
    assert [r["id"] for r in rows] == [ckpt["id"]]


# -- 4. pause and resume --------------------------------------------------------------------


def test_paused_sandbox_burns_no_cpu_resumes_intact_and_is_reaped_on_time(
        sbx, docker_api, made, tmp_path):
    burner = sbx.create("--profile-file", str(write_profile(tmp_path, "burner", BURNER)),
                        "--ttl", "5m")
    ref = burner["backend_ref"]
    before = docker_api.inspect_container(ref)["State"]

    paused = ok(sbx("pause", burner["id"], "--json")).json()
    assert paused["state"] == "paused"
    assert state_of(sbx.home, burner["id"]) == "paused"
    assert docker_api.inspect_container(ref)["State"]["Status"] == "paused"
    idle = cpu_percent(docker_api, ref, samples=2)
    assert len(idle) == 2 and max(idle) < 1.0, idle

    resumed = ok(sbx("resume", burner["id"], "--json")).json()
    assert resumed["state"] == "running"
    after = docker_api.inspect_container(ref)["State"]
    assert after["Status"] == "running"
    assert (after["Pid"], after["StartedAt"]) == (before["Pid"], before["StartedAt"]), \
        "resume must continue the same processes, not restart the container"
    pid1 = sh(sbx, burner["id"], "tr '\\0' ' ' < /proc/1/cmdline")
    assert "while :; do :; done" in pid1, pid1
    busy = cpu_percent(docker_api, ref, samples=3)
    # busy again, well above the paused readings (under 1 %). The loop gets less than a core
    # when the machine is shared: at a load average of 10 on two cores its fair share is
    # near a fifth of one, and CI saw a burner read 9 % for a second.
    assert len(busy) == 3 and max(busy) > 5.0, busy

    # paused again, it is still reaped at its deadline
    ok(sbx("pause", burner["id"]))
    offset = {"SBX_CLOCK_OFFSET": "6m"}
    report = ok(sbx("reap", "--json", env=offset)).json()
    assert report["destroyed"] == [burner["id"]], report
    assert report["reasons"] == {burner["id"]: "ttl"}, report  # why, as its event says
    assert report["failed"] == [], report
    assert state_of(sbx.home, burner["id"]) == "destroyed"
    destroying = [e for e in events(sbx.home, burner["id"]) if e["type"] == "sandbox.destroying"]
    assert destroying and destroying[-1]["reason"] == "ttl", destroying
    assert not container_exists(docker_api, ref)


# -- 5. retention ---------------------------------------------------------------------------


def test_retention_keep_two_leaves_the_newest_two(sbx, docker_api, made, tmp_path):
    profile = write_profile(tmp_path, "keeper", "extends: default\ncheckpoints:\n  keep: 2\n")
    box = sbx.create("--profile-file", str(profile))
    made_ids = []
    for i in range(4):
        docker_sh(docker_api, box["backend_ref"], f"echo {i} > /work/n")
        made_ids.append(snapshot(sbx, box["id"])["id"])
    newest = made_ids[-2:]
    assert [r["id"] for r in checkpoint_rows(sbx.home)] == newest
    listed = ok(sbx("checkpoints", box["id"], "--json")).json()
    assert [r["id"] for r in listed] == newest
    assert sorted(images_of(docker_api, install_id_of(sbx.home))) == sorted(newest)
    for old in made_ids[:2]:
        assert not tag_exists(docker_api, tag_of(sbx.home, old))
    removed = [e["payload"]["checkpoint"] for e in events(sbx.home, box["id"])
               if e["type"] == "checkpoint.removed" and e["reason"] == "retention"]
    assert removed == made_ids[:2]
    # the newest kept is the newest content
    fork = restore(sbx, newest[-1])
    assert docker_sh(docker_api, fork["backend_ref"], "cat /work/n") == "3\n"


def test_retention_ttl_expires_checkpoints_on_reap_and_prune(sbx, docker_api, made, tmp_path):
    profile = write_profile(tmp_path, "brief", "extends: default\ncheckpoints:\n  ttl: 1h\n")
    short = sbx.create("--profile-file", str(profile), "--ttl", "3h")
    lasting = sbx.create("--ttl", "3h")  # the default profile: its checkpoints never expire
    expiring = [snapshot(sbx, short["id"]) for _ in range(2)]
    for ckpt in expiring:
        assert ckpt["expires_at"] is not None and ckpt["expires_at"] > ckpt["created_at"]
    kept = snapshot(sbx, lasting["id"])
    assert kept["expires_at"] is None

    # not due yet: a reap and a prune now remove nothing
    assert ok(sbx("reap", "--json")).json()["failed"] == []
    assert ok(sbx("checkpoints", "prune", "--json")).json() == {"removed": []}
    assert len(checkpoint_rows(sbx.home)) == 3

    report = ok(sbx("reap", "--json", env={"SBX_CLOCK_OFFSET": "2h"})).json()
    assert report["failed"] == [], report
    assert report["destroyed"] == [], report  # the sandboxes had 3h
    expired_ids = {c["id"] for c in expiring}
    assert {r.get("checkpoint") for r in report["reconciled"]} >= expired_ids, report
    assert [r["id"] for r in checkpoint_rows(sbx.home)] == [kept["id"]]
    for ckpt in expiring:
        assert not tag_exists(docker_api, tag_of(sbx.home, ckpt["id"]))
        assert docker_api.images(name=REPOSITORY,
                                 filters={"label": [f"sbx.checkpoint={ckpt['id']}"]}) == []
    assert set(images_of(docker_api, install_id_of(sbx.home))) == {kept["id"]}

    # `sbx checkpoints prune` does the same on its own
    third = snapshot(sbx, short["id"])
    assert ok(sbx("checkpoints", "prune", "--json")).json() == {"removed": []}
    pruned = ok(sbx("checkpoints", "prune", "--json", env={"SBX_CLOCK_OFFSET": "2h"})).json()
    assert pruned == {"removed": [third["id"]]}
    assert [r["id"] for r in checkpoint_rows(sbx.home)] == [kept["id"]]
    assert not tag_exists(docker_api, tag_of(sbx.home, third["id"]))
    assert tag_exists(docker_api, tag_of(sbx.home, kept["id"]))


# -- 6. export and import -------------------------------------------------------------------


def test_export_then_import_in_a_fresh_home_restores_the_same_file(sbx, docker_api, made):
    box = sbx.create()
    digest = sh(sbx, box["id"], "head -c 4096 /dev/urandom > /work/blob && "
                                "sha256sum /work/blob").split()[0]
    ckpt = snapshot(sbx, box["id"], "--name", "travel")
    archive = sbx.cwd / "travel.tar.gz"
    ok(sbx("checkpoint", "export", ckpt["id"], "-o", str(archive)))
    assert archive.stat().st_mode & 0o777 == 0o600
    with tarfile.open(archive, "r:gz") as tar:
        assert sorted(tar.getnames()) == ["artifact.tar", "manifest.json"]
        manifest = json.load(tar.extractfile("manifest.json"))
    assert manifest["format"] == "sandboxer-checkpoint/1"
    assert manifest["checkpoint"]["id"] == ckpt["id"]
    assert "backend_ref" not in manifest["checkpoint"]

    other = made.runner(sbx, "home-b")
    assert checkpoint_rows(other.home) == []
    imported = ok(other("checkpoint", "import", str(archive), "--json")).json()
    assert imported["id"] == ckpt["id"] and imported["state"] == "ready"
    assert imported["name"] == "travel" and imported["kind"] == "filesystem"
    assert imported["install_id"] == install_id_of(other.home) != install_id_of(sbx.home)
    assert [r["id"] for r in checkpoint_rows(other.home)] == [ckpt["id"]]

    fresh = ok(other("restore", ckpt["id"], "--profile", "default", "--label", RUN_LABEL,
                     "--json")).json()
    assert fresh["install"] == install_id_of(other.home)
    out = ok(other("exec", fresh["id"], "--", "sha256sum", "/work/blob")).out
    assert out.split()[0] == digest

    again = other("checkpoint", "import", str(archive))
    assert again.code == 4, again
    one_line(again)


def _archive(path: Path, members: list[tuple[str, bytes] | tuple[str, bytes, str]]) -> Path:
    """A tar.gz with these members, names exactly as given (no normalising), in order; a
    third element makes the member a symlink to it."""
    with tarfile.open(path, "w:gz") as tar:
        for member in members:
            info = tarfile.TarInfo(member[0])
            if len(member) == 3:
                info.type, info.linkname = tarfile.SYMTYPE, member[2]
                tar.addfile(info)
            else:
                info.size = len(member[1])
                tar.addfile(info, io.BytesIO(member[1]))
    return path


def test_import_refuses_crafted_archives_and_writes_nothing(sbx, docker_api, made, tmp_path):
    box = sbx.create()
    sh(sbx, box["id"], "echo payload > /work/file")
    ckpt = snapshot(sbx, box["id"])
    real = tmp_path / "real.tar.gz"
    ok(sbx("checkpoint", "export", ckpt["id"], "-o", str(real)))
    with tarfile.open(real, "r:gz") as tar:
        manifest = tar.extractfile("manifest.json").read()
        artifact = tar.extractfile("artifact.tar").read()
    ok(sbx("checkpoint", "rm", ckpt["id"]))  # so an import that loaded it would show
    tag = f"{REPOSITORY}:{ckpt['id']}"  # what a load of the archive would tag
    assert not tag_exists(docker_api, tag) and not tag_exists(docker_api, ckpt["backend_ref"])

    outside = tmp_path / "abs-evil"
    foreign = json.loads(manifest)
    foreign["format"] = "someone-else/1"
    cases = {
        "dotdot": [("manifest.json", manifest), ("artifact.tar", artifact),
                   ("../evil", b"escaped\n")],
        "absolute": [("manifest.json", manifest), ("artifact.tar", artifact),
                     (str(outside), b"escaped\n")],
        "foreign-manifest": [("manifest.json", json.dumps(foreign).encode()),
                             ("artifact.tar", artifact)],
        "symlink": [("manifest.json", manifest), ("artifact.tar", b"", "/etc/passwd")],
    }
    other = made.runner(sbx, "home-c")
    scratch = tmp_path / "scratch"
    (scratch / "tmp").mkdir(parents=True)
    env = {"TMPDIR": str(scratch / "tmp")}
    (tmp_path / "crafted").mkdir()
    for case, members in cases.items():
        path = _archive(tmp_path / "crafted" / f"{case}.tgz", members)
        result = other("checkpoint", "import", str(path), env=env)
        assert result.code == 2, (case, result)
        one_line(result)
        assert table_rows(other.home, "checkpoints") == [], case
        assert not tag_exists(docker_api, tag), case
        assert docker_api.images(filters={"label": [f"sbx.checkpoint={ckpt['id']}"]}) == [], case
        assert not outside.exists(), case
        assert not (scratch / "evil").exists(), case
        assert not (tmp_path / "evil").exists() and not (tmp_path.parent / "evil").exists(), case
        assert list((scratch / "tmp").iterdir()) == [], case
    events = table_rows(other.home, "events")
    assert not [e for e in events if "checkpoint" in str(e)], events


def test_import_refuses_an_artifact_that_is_not_the_checkpoint_it_names(
        sbx, docker_api, made, tmp_path):
    """The image inside the archive must be the checkpoint the manifest names: otherwise an
    archive could (re)tag any image on the engine, `sandboxer/base:busybox` included."""
    box = sbx.create()
    ckpt = snapshot(sbx, box["id"])
    tag = ckpt["backend_ref"]
    real = tmp_path / "real.tar.gz"
    ok(sbx("checkpoint", "export", ckpt["id"], "-o", str(real)))
    with tarfile.open(real, "r:gz") as tar:
        manifest = tar.extractfile("manifest.json").read()
    stranger = f"sbx-test-foreign-{RUN_ID}"
    made.tags.append(f"{stranger}:x")
    docker_api.tag(tag, stranger, "x")
    disguised = b"".join(docker_api.get_image(f"{stranger}:x"))
    docker_api.remove_image(f"{stranger}:x")
    ok(sbx("checkpoint", "rm", ckpt["id"]))
    assert not tag_exists(docker_api, f"{stranger}:x") and not tag_exists(docker_api, tag)

    path = _archive(tmp_path / "disguised.tgz",
                    [("manifest.json", manifest), ("artifact.tar", disguised)])
    other = made.runner(sbx, "home-d")
    result = other("checkpoint", "import", str(path))
    assert result.code == 2, result
    one_line(result)
    assert table_rows(other.home, "checkpoints") == []
    assert not tag_exists(docker_api, f"{stranger}:x")


# -- 7. a crash in the middle of a snapshot -------------------------------------------------


@pytest.mark.parametrize("command", ["reconcile", "reap"])
def test_killed_snapshot_leaves_no_row_without_image_nor_image_without_row(
        sbx, docker_api, made, command):
    box = sbx.create()
    install = install_id_of(sbx.home)
    crashed = []
    for point in ("snapshot.after-intent", "snapshot.after-backend"):
        result = sbx("snapshot", box["id"], "--json",
                     env={"SBX_FAILPOINT": point, "SBX_LEASE_TTL": "1s"})
        assert result.code == -9, (point, result)
        rows = [r for r in checkpoint_rows(sbx.home) if r["id"] not in crashed]
        assert len(rows) == 1 and rows[0]["state"] == "pending", rows
        crashed.append(rows[0]["id"])
        time.sleep(1.2)  # its lease (1s) lapses before the next snapshot takes it
    intent, backend = crashed
    images = images_of(docker_api, install)
    assert intent not in images, "killed before the commit: no image yet"
    assert backend in images, "killed after the commit: the image exists"

    time.sleep(0.5)
    settle = {"SBX_RECONCILE_GRACE": "1s"}
    report = ok(sbx(command, "--json", env=settle)).json()
    assert report["failed"] == [], report

    rows = {r["id"]: r for r in checkpoint_rows(sbx.home)}
    images = images_of(docker_api, install)
    assert set(rows) == set(images), (rows, images)
    assert intent not in rows
    assert rows[backend]["state"] == "ready"
    assert rows[backend]["backend_ref"] == tag_of(sbx.home, backend)
    assert all(r["state"] == "ready" for r in rows.values())
    # an image of this installation that no row claims goes too
    listed = ok(sbx("checkpoints", "--json")).json()
    assert [r["id"] for r in listed] == [backend]
    # and the completed checkpoint restores
    assert restore(sbx, backend)["state"] == "running"


def test_reap_removes_an_image_of_this_installation_that_no_row_claims(sbx, docker_api, made):
    """Held by this installation's tag, or (made before holder tags) by the bare tag of a
    checkpoint labelled with this installation."""
    box = sbx.create()
    install = install_id_of(sbx.home)
    orphans = {}
    for form in ("holder", "bare"):
        orphan = "ckpt-" + uuid.uuid4().hex[:26]
        tag = tag_of(sbx.home, orphan) if form == "holder" else f"{REPOSITORY}:{orphan}"
        docker_api.commit(box["backend_ref"], repository=REPOSITORY, tag=tag.split(":")[1],
                          changes=[f'LABEL "sbx.checkpoint"="{orphan}"',
                                   f'LABEL "sbx.install"="{install}"',
                                   f'LABEL "sbx.id"="{box["id"]}"'])
        made.tags.append(tag)
        orphans[orphan] = tag
        assert orphan in images_of(docker_api, install)
    report = ok(sbx("reap", "--json", env={"SBX_RECONCILE_GRACE": "1s"})).json()
    assert report["failed"] == [], report
    for orphan, tag in orphans.items():
        assert [r["action"] for r in report["reconciled"] if r.get("checkpoint") == orphan] == [
            "orphan artifact removed"], report
        assert not tag_exists(docker_api, tag)
        assert docker_api.images(all=True, filters={"label": [f"sbx.checkpoint={orphan}"]}) == []
    assert checkpoint_rows(sbx.home) == []


# -- 8. bad input ---------------------------------------------------------------------------


def test_bad_input_exits_with_its_code_and_writes_nothing(sbx, docker_api, made):
    gone = sbx.create()
    ok(sbx("destroy", "--yes", gone["id"]))
    live = sbx.create()
    ok(sbx("pause", live["id"]))
    install = install_id_of(sbx.home)

    def state():
        return (table_rows(sbx.home, "sandboxes"), table_rows(sbx.home, "events"),
                table_rows(sbx.home, "checkpoints"), sorted(images_of(docker_api, install)))

    before = state()
    cases = [
        (("snapshot", gone["id"]), 4),
        (("restore", "ckpt-" + "0" * 26, "--json"), 3),
        (("pause", live["id"]), 4),
        (("resume", gone["id"]), 4),
    ]
    for args, code in cases:
        result = sbx(*args)
        assert result.code == code, (args, result)
        if "--json" in args:
            assert result.json()["error"]["code"] == code
        else:
            one_line(result)
        assert state() == before, args
    assert docker_api.inspect_container(live["backend_ref"])["State"]["Status"] == "paused"


# -- 9. memory checkpoints are a capability -------------------------------------------------


def test_memory_checkpoints_are_not_offered_here_and_every_checkpoint_is_filesystem(
        sbx, docker_api, made):
    assert not docker_api.info().get("ExperimentalBuild"), "this engine is not experimental"
    doctor = ok(sbx("doctor", "--json")).json()
    docker_report = next(b for b in doctor["backends"] if b["name"] == "docker")
    assert docker_report["reachable"] is True
    capabilities = docker_report["capabilities"]
    assert "snapshot" in capabilities and "pause" in capabilities
    assert "memory-checkpoint" not in capabilities

    box = sbx.create()
    ok(sbx("pause", box["id"]))
    ckpt = snapshot(sbx, box["id"])  # even of a paused sandbox: its filesystem
    assert ckpt["kind"] == "filesystem"
    listed = ok(sbx("checkpoints", "--json")).json()
    assert [r["id"] for r in listed] == [ckpt["id"]]
    assert {r["kind"] for r in listed} == {"filesystem"}
    assert {r["kind"] for r in checkpoint_rows(sbx.home)} == {"filesystem"}
    created = [e for e in events(sbx.home, box["id"]) if e["type"] == "checkpoint.created"]
    assert [e["payload"]["kind"] for e in created] == ["filesystem"]


# -- 10. an imported checkpoint is input from outside ---------------------------------------
#
# Each archive below is a real export whose manifest (or image archive) was then rewritten,
# as anyone handing over an archive can: sbx must take nothing from it on trust.


def _exported(sbx: SbxRunner, tmp_path: Path, *snapshot_args: str) -> tuple[dict, dict, bytes]:
    """A checkpoint of a new sandbox of `sbx`, exported: the checkpoint, its archive's
    manifest and the image archive inside it."""
    box = sbx.create()
    ckpt = snapshot(sbx, box["id"], *snapshot_args)
    path = tmp_path / f"{ckpt['id']}.tar.gz"
    ok(sbx("checkpoint", "export", ckpt["id"], "-o", str(path)))
    with tarfile.open(path, "r:gz") as tar:
        return (ckpt, json.loads(tar.extractfile("manifest.json").read()),
                tar.extractfile("artifact.tar").read())


def _with_manifest(path: Path, manifest: dict, artifact: bytes) -> Path:
    return _archive(path, [("manifest.json", json.dumps(manifest).encode()),
                           ("artifact.tar", artifact)])


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# What an archive's author would like a restore to run: every field a profile of this host
# must decide instead.
FOREIGN_PROFILE = {
    "backend": "docker", "image": "sandboxer/base:busybox",
    "command": ["sh", "-c", "echo owned; trap 'exit 0' TERM; while :; do sleep 1; done"],
    "resources": {"cpu": 2, "memory": None, "pids": None},
    "network": {"mode": "full"},
    "secrets": {"X": "env:SOME_HOST_VAR"},
    "ttl": {"default": "3650d", "max": "36500d"},
}


def test_restore_of_an_import_runs_under_a_profile_of_this_host(sbx, docker_api, made, tmp_path):
    first, manifest_a, artifact_a = _exported(sbx, tmp_path)
    second, manifest_b, artifact_b = _exported(sbx, tmp_path)
    elsewhere = f"elsewhere-{RUN_ID}"  # a profile only the archive's author has
    for manifest, profile_name in ((manifest_a, "default"), (manifest_b, elsewhere)):
        manifest["checkpoint"]["profile"] = profile_name
        manifest["checkpoint"]["profile_json"] = json.dumps({**FOREIGN_PROFILE,
                                                             "name": profile_name})
    other = made.runner(sbx, "home-e")
    secret = f"host-secret-{RUN_ID}"
    host = {"SOME_HOST_VAR": secret}
    for manifest, artifact in ((manifest_a, artifact_a), (manifest_b, artifact_b)):
        path = _with_manifest(tmp_path / f"{manifest['checkpoint']['id']}.tgz", manifest,
                              artifact)
        ok(other("checkpoint", "import", str(path), env=host))
    recorded = query(other.home, "SELECT profile_json FROM checkpoints WHERE id = ?",
                     first["id"])[0]["profile_json"]
    assert json.loads(recorded)["network"] == {"mode": "full"}, "kept, as a record"

    def runs_under_local_default(view: dict) -> None:
        info = docker_api.inspect_container(view["backend_ref"])
        limits = info["HostConfig"]
        assert limits["NetworkMode"] == "none", limits["NetworkMode"]
        assert (limits["Memory"], limits["PidsLimit"], limits["NanoCpus"]) == (
            512 * 1024**2, 256, 10**9)
        env = info["Config"]["Env"] or []
        assert not [e for e in env if e.startswith("X=") or secret in e], env
        assert "owned" not in json.dumps(info["Config"]["Cmd"]), info["Config"]["Cmd"]
        assert _utc(view["hard_deadline"]) - _utc(view["created_at"]) == timedelta(hours=4)
        assert _utc(view["deadline"]) - _utc(view["created_at"]) == timedelta(minutes=30)
        assert show(other, view["id"])["profile"] == "default"

    def restore_in_other(*args: str, env: dict[str, str] | None = None) -> Result:
        return other("restore", *args, "--label", RUN_LABEL, "--json", env={**host, **(env or {})})

    def state() -> tuple:
        return (table_rows(other.home, "sandboxes"), table_rows(other.home, "events"),
                sorted(c["Id"] for c in containers_of(docker_api, install_id_of(other.home))))

    # the recorded name is a profile here, but the archive's author chose that name: the
    # user names the profile, unless this host's profile of that name accepts imports
    before = state()
    refused = other("restore", first["id"], "--label", RUN_LABEL, env=host)
    assert refused.code == 2 and "--profile" in one_line(refused), refused
    assert "accept_imports" in one_line(refused)
    assert state() == before
    runs_under_local_default(ok(restore_in_other(first["id"], "--profile", "default")).json())
    too_long = restore_in_other(first["id"], "--profile", "default", "--ttl", "100d")
    assert too_long.code == 2 and "4h" in too_long.json()["error"]["message"], too_long
    accepting = tmp_path / "accepting"
    accepting.mkdir()
    (accepting / "default.yaml").write_text(
        "extends: default\ncheckpoints: {accept_imports: true}\n")
    runs_under_local_default(ok(restore_in_other(
        first["id"], env={"SBX_PROFILE_PATH": str(accepting)})).json())

    # a recorded name this host does not have: the user chooses
    before = state()
    for args in ((second["id"],), (second["id"], "--profile", f"nope-{RUN_ID}")):
        refused = other("restore", *args, "--label", RUN_LABEL, env=host)
        assert refused.code == 2, (args, refused)
        assert "--profile" in one_line(refused), refused
        assert state() == before, args
    runs_under_local_default(ok(restore_in_other(second["id"], "--profile", "default")).json())


def test_an_import_keeps_its_own_time_and_name_and_joins_no_local_lineage(
        sbx, docker_api, made, tmp_path):
    travelled, manifest, artifact = _exported(sbx, tmp_path, "--name", "travel")
    ok(sbx("checkpoint", "rm", travelled["id"]))  # so an import that loaded it would show
    other = made.runner(sbx, "home-f")
    box = other.create()
    local = snapshot(other, box["id"], "--name", "travel")
    fork = restore(other, local["id"])
    grandchild = snapshot(other, fork["id"])
    # the archive claims to be the newest checkpoint of a local sandbox, child of a local one,
    # taken under a profile that keeps only the newest checkpoint of its sandbox
    keep_one = {**json.loads(manifest["checkpoint"]["profile_json"]), "checkpoints": {"keep": 1}}
    manifest["checkpoint"].update(created_at="2999-12-31T23:59:59.000000Z",
                                  sandbox_id=box["id"], parent_id=local["id"],
                                  install_id=install_id_of(other.home),
                                  profile_json=json.dumps(keep_one))
    path = _with_manifest(tmp_path / "forged.tgz", manifest, artifact)

    def state() -> tuple:
        return (table_rows(other.home, "checkpoints"), table_rows(other.home, "events"),
                table_rows(other.home, "sandboxes"))

    before = state()
    shadowing = other("checkpoint", "import", str(path))
    assert shadowing.code == 4, shadowing
    assert "--name" in one_line(shadowing)
    taken = other("checkpoint", "import", str(path), "--name", "travel", "--json")
    assert taken.code == 4 and taken.json()["error"]["code"] == 4, taken
    assert state() == before
    assert not tag_exists(docker_api, f"{REPOSITORY}:{travelled['id']}")

    started = _now_iso()
    imported = ok(other("checkpoint", "import", str(path), "--name", "travel-from-a",
                        "--json")).json()
    assert started <= imported["created_at"] <= _now_iso()
    assert imported["exported_at"] == manifest["exported_at"]
    assert (imported["name"], imported["sandbox_id"], imported["parent_id"]) == (
        "travel-from-a", None, None)
    assert (imported["origin_sandbox_id"], imported["origin_parent_id"]) == (
        box["id"], local["id"]), "the archive's claims, kept as such"

    # `sbx restore travel` still means the local checkpoint
    again = restore(other, "travel")
    creating = [e for e in events(other.home, again["id"]) if e["type"] == "sandbox.creating"]
    assert creating[0]["payload"]["restored_from"] == local["id"]

    # the local sandboxes' lineage, events and evidence hold nothing of the import
    listed = ok(other("checkpoints", box["id"], "--json")).json()
    assert [c["id"] for c in listed] == [local["id"]]
    roots = {n["id"]: n for n in ok(other("checkpoints", "--tree", "--json")).json()}
    assert set(roots) == {local["id"], imported["id"]}
    assert [c["id"] for c in roots[local["id"]]["children"]] == [grandchild["id"]]
    assert roots[local["id"]]["children"][0]["children"] == []
    assert roots[imported["id"]]["children"] == []
    human = ok(other("checkpoints", "--tree")).out
    assert f"{imported['id']} travel-from-a  from an import " in human, human
    for sandbox in (box, fork, again):
        assert imported["id"] not in json.dumps(events_of(other, sandbox["id"]))
        bundle = tmp_path / f"evidence-{sandbox['id']}.json"
        ok(other("evidence", sandbox["id"], "--output", str(bundle)))
        assert imported["id"] not in bundle.read_text(), sandbox["id"]
    owners = query(other.home, "SELECT sandbox_id FROM events WHERE type = 'checkpoint.imported'")
    assert owners == [{"sandbox_id": None}]
    # nor does its profile's retention reach them
    assert ok(other("checkpoints", "prune", "--json")).json() == {"removed": []}
    assert {r["id"] for r in checkpoint_rows(other.home)} == {
        local["id"], grandchild["id"], imported["id"]}


def test_import_checks_the_manifest_against_its_schema(sbx, docker_api, made, tmp_path):
    ckpt, manifest, artifact = _exported(sbx, tmp_path)
    ok(sbx("checkpoint", "rm", ckpt["id"]))

    def changed(**fields) -> dict:
        doc = json.loads(json.dumps(manifest))
        for key, value in fields.items():
            if value is None:
                del doc["checkpoint"][key]
            else:
                doc["checkpoint"][key] = value
        return doc

    no_checkpoint = {k: v for k, v in manifest.items() if k != "checkpoint"}
    cases = {
        "checkpoint.backend": changed(backend=None),
        "checkpoint.profile_json": changed(profile_json=None),
        "checkpoint.kind": changed(kind="memory"),
        "checkpoint.id": changed(id=42),
        "checkpoint.profile": changed(profile="../../../tmp/evil"),
        "checkpoint.created_at": changed(created_at="yesterday"),
        "checkpoint.name": changed(name="n" * 200),
        "checkpoint.size_bytes": changed(size_bytes=-1),
        "checkpoint": no_checkpoint,
        "exported_at": {**manifest, "exported_at": "soon"},
    }
    other = made.runner(sbx, "home-g")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    for field, doc in cases.items():
        path = _with_manifest(tmp_path / "schema.tgz", doc, artifact)
        result = other("checkpoint", "import", str(path), env={"TMPDIR": str(scratch)})
        assert result.code == 2, (field, result)
        assert f"manifest.json: {field}: " in one_line(result), (field, result.err)
        assert table_rows(other.home, "checkpoints") == [], field
        assert table_rows(other.home, "events") == [], field
        assert list(scratch.iterdir()) == [], field
        assert not tag_exists(docker_api, f"{REPOSITORY}:{ckpt['id']}"), field


class _Filler(io.RawIOBase):
    """`size` bytes of one value, made as they are read (never held whole)."""

    def __init__(self, size: int, byte: bytes = b"\0") -> None:
        self.left, self.byte = size, byte

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        count = min(len(buffer), self.left)
        buffer[:count] = self.byte * count
        self.left -= count
        return count


def _bomb(path: Path, members: list[tuple[str, int, bytes] | tuple[str, bytes]],
          pax_bomb: int = 0) -> Path:
    """A tar.gz whose members are declared (name, size, filler byte) or given (name, data);
    with `pax_bomb`, a pax header of that size comes first."""
    with gzip.open(path, "wb") as raw:
        if pax_bomb:
            header = tarfile.TarInfo("././@PaxHeader")
            header.type, header.size = tarfile.XHDTYPE, pax_bomb
            raw.write(header.tobuf(format=tarfile.USTAR_FORMAT))
            shutil.copyfileobj(_Filler(pax_bomb, b"a"), raw, 1024 * 1024)
            raw.write(b"\0" * (-pax_bomb % tarfile.BLOCKSIZE))
        with tarfile.open(fileobj=raw, mode="w|", format=tarfile.USTAR_FORMAT) as tar:
            for member in members:
                info = tarfile.TarInfo(member[0])
                if len(member) == 3:
                    info.size = member[1]
                    tar.addfile(info, _Filler(member[1], member[2]))
                else:
                    info.size = len(member[1])
                    tar.addfile(info, io.BytesIO(member[1]))
    return path


def _run_bounded(runner: SbxRunner, *args: str, env: dict[str, str],
                 max_file: int) -> tuple[Result, int]:
    """Run `sbx` unable to write any file past `max_file` bytes (RLIMIT_FSIZE: a longer write
    fails); its result and its peak resident memory in MiB."""

    # sbx is forked by a small Python that sets the limit and reports the peak. A process
    # forked from pytest itself (or exec'd in a child of it) starts its peak at pytest's own
    # resident size, which Linux counts at exec: 300 MiB late in a run.
    bounded = ("import os, resource, sys; "
               f"resource.setrlimit(resource.RLIMIT_FSIZE, ({max_file}, {max_file})); "
               "pid = os.fork(); "
               "pid or os.execv(sys.executable, [sys.executable, *sys.argv[2:]]); "
               "_, status, usage = os.wait4(pid, 0); "
               "open(sys.argv[1], 'w').write(str(usage.ru_maxrss)); "
               "sys.exit(os.waitstatus_to_exitcode(status))")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as peak:
        proc = subprocess.Popen([sys.executable, "-c", bounded, peak.name, *SBX[1:], *args],
                                cwd=runner.cwd, env=runner.env(env), stdout=out, stderr=err,
                                start_new_session=True)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.seek(0)
        err.seek(0)
        peak_kib = int(peak.read() or 0)
        return (Result(proc.returncode, out.read().decode(), err.read().decode()),
                peak_kib // 1024)


def _files(folder: Path) -> dict[str, int]:
    """The folder's files and their sizes; SQLite's -wal and -shm aside (this test's own
    read-only queries leave them; the tables are compared instead)."""
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*")
            if p.is_file() and not p.name.endswith(("-wal", "-shm"))}


def test_import_caps_are_read_from_the_headers_before_anything_is_written(
        sbx, docker_api, made, tmp_path):
    ckpt, manifest, artifact = _exported(sbx, tmp_path)
    ok(sbx("checkpoint", "rm", ckpt["id"]))
    real_manifest = json.dumps(manifest).encode()
    bombs = tmp_path / "bombs"
    bombs.mkdir()
    cases = {
        # a 64 MiB artifact (in a 64 KiB archive), over a cap lowered to 16 MiB
        "artifact": (_bomb(bombs / "artifact.tgz", [("manifest.json", real_manifest),
                                                    ("artifact.tar", 64 * 1024**2, b"\0")]),
                     {"SBX_IMPORT_MAX_ARTIFACT": "16MiB"}, "SBX_IMPORT_MAX_ARTIFACT"),
        # a 300 MiB manifest (spaces before the JSON) over the default cap of 1 MiB
        "manifest": (_bomb(bombs / "manifest.tgz", [("manifest.json", 300 * 1024**2, b" "),
                                                    ("artifact.tar", artifact)]),
                     {}, "SBX_IMPORT_MAX_MANIFEST"),
        # a 300 MiB pax header before any member
        "pax": (_bomb(bombs / "pax.tgz", [("manifest.json", real_manifest),
                                          ("artifact.tar", artifact)],
                      pax_bomb=300 * 1024**2), {}, "header"),
    }
    for path, _, _ in cases.values():
        assert path.stat().st_size < 2 * 1024**2, path
    other = made.runner(sbx, "home-h")
    ok(other("checkpoints"))  # the home and its database exist before
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    home_before = _files(other.home)
    for case, (path, env, named) in cases.items():
        result, peak_mib = _run_bounded(other, "checkpoint", "import", str(path),
                                        env={"TMPDIR": str(scratch), **env},
                                        max_file=8 * 1024**2)
        assert result.code == 2, (case, result)
        assert named in one_line(result), (case, result.err)
        assert peak_mib < 150, (case, peak_mib)
        assert list(scratch.iterdir()) == [], case
        assert _files(other.home) == home_before, case
        assert table_rows(other.home, "checkpoints") == [], case
        assert not tag_exists(docker_api, f"{REPOSITORY}:{ckpt['id']}"), case
        assert docker_api.images(filters={"label": [f"sbx.checkpoint={ckpt['id']}"]}) == [], case
    bad_cap = other("checkpoint", "import", str(cases["artifact"][0]),
                    env={"SBX_IMPORT_MAX_ARTIFACT": "lots"})
    assert bad_cap.code == 2 and "SBX_IMPORT_MAX_ARTIFACT" in one_line(bad_cap), bad_cap


def _rewritten_image(artifact: bytes, replace: dict[str, bytes],
                     add: list[tuple[str, bytes] | tuple[str, bytes, str]]) -> bytes:
    """The `docker save` archive `artifact` with members' contents replaced and members added
    (a third element makes a symlink to it)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(artifact)) as src, \
            tarfile.open(fileobj=out, mode="w") as dst:
        for member in src.getmembers():
            if member.name in replace:
                data = replace[member.name]
                member.size = len(data)
                dst.addfile(member, io.BytesIO(data))
            else:
                dst.addfile(member, src.extractfile(member) if member.isfile() else None)
        for extra in add:
            info = tarfile.TarInfo(extra[0])
            if len(extra) == 3:
                info.type, info.linkname = tarfile.SYMTYPE, extra[2]
                dst.addfile(info)
            else:
                info.size = len(extra[1])
                dst.addfile(info, io.BytesIO(extra[1]))
    return out.getvalue()


@pytest.fixture
def victim(sbx, docker_api, made) -> tuple[str, str]:
    """An image of this test's own, tagged `sbx-test-victim:<run id>`: (tag, image id)."""
    box = sbx.create()
    image_id = docker_api.commit(box["backend_ref"], repository="sbx-test-victim",
                                 tag=RUN_ID)["Id"]
    made.image_ids.append(image_id)
    return f"sbx-test-victim:{RUN_ID}", image_id


def test_import_refuses_an_image_archive_that_names_another_tag(
        sbx, docker_api, made, tmp_path, victim):
    victim_tag, victim_id = victim
    ckpt, manifest, artifact = _exported(sbx, tmp_path)
    tag = f"{REPOSITORY}:{ckpt['id']}"  # the archive's name for it
    image_hex = docker_api.inspect_image(ckpt["backend_ref"])["Id"].removeprefix("sha256:")
    ok(sbx("checkpoint", "rm", ckpt["id"]))
    assert not tag_exists(docker_api, tag) and not tag_exists(docker_api, ckpt["backend_ref"])
    with tarfile.open(fileobj=io.BytesIO(artifact)) as inner:
        assert "repositories" in inner.getnames(), "this engine's `docker save` writes one"
    naming_victim = json.dumps({"sbx-test-victim": {RUN_ID: image_hex},
                                REPOSITORY: {ckpt["id"]: image_hex}}).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": f"sha256:{image_hex}", "size": 2, "annotations": {
            "io.containerd.image.name": f"docker.io/library/{victim_tag}",
            "org.opencontainers.image.ref.name": RUN_ID}}]}).encode()
    layout = b'{"imageLayoutVersion": "1.0.0"}'
    cases = {
        "repositories": _rewritten_image(artifact, {"repositories": naming_victim}, []),
        "index.json": _rewritten_image(artifact, {}, [("oci-layout", layout),
                                                      ("index.json", index)]),
        "through a link": _rewritten_image(artifact, {}, [("d", b"", "."),
                                                          ("d/repositories", naming_victim)]),
        "twice": _rewritten_image(artifact, {}, [("./repositories", naming_victim)]),
    }
    other = made.runner(sbx, "home-i")
    for case, image in cases.items():
        path = _with_manifest(tmp_path / "named.tgz", manifest, image)
        result = other("checkpoint", "import", str(path))
        assert result.code == 2, (case, result)
        one_line(result)
        assert docker_api.inspect_image(victim_tag)["Id"] == victim_id, case
        assert not tag_exists(docker_api, tag), case
        assert table_rows(other.home, "checkpoints") == [], case
    # the archive as exported still comes in
    path = _with_manifest(tmp_path / "plain.tgz", manifest, artifact)
    ok(other("checkpoint", "import", str(path)))
    assert docker_api.inspect_image(victim_tag)["Id"] == victim_id


def test_a_load_that_moves_another_tag_is_undone_and_refused(
        sbx, docker_api, made, tmp_path, victim, monkeypatch):
    """Should an engine take a name from somewhere the archive check does not look, the
    Docker adapter puts back every tag the load moved and refuses the artifact."""
    from sandboxer.adapters import docker as docker_adapter
    from sandboxer.adapters.base import ArtifactRefused

    victim_tag, victim_id = victim
    ckpt, _, artifact = _exported(sbx, tmp_path)
    tag = f"{REPOSITORY}:{ckpt['id']}"
    with tarfile.open(fileobj=io.BytesIO(artifact)) as inner:
        saved = json.loads(inner.extractfile("manifest.json").read())
    saved[0]["RepoTags"] = [tag, victim_tag]
    image = tmp_path / "image.tar"
    image.write_bytes(_rewritten_image(artifact, {"manifest.json": json.dumps(saved).encode()},
                                       []))
    ok(sbx("checkpoint", "rm", ckpt["id"]))
    monkeypatch.setattr(docker_adapter, "_check_saved_image", lambda path, name: None)

    async def load() -> str:
        adapter = docker_adapter.DockerAdapter()
        try:
            return await adapter.import_artifact(str(image), ckpt["id"])
        finally:
            await adapter.close()

    with pytest.raises(ArtifactRefused, match=victim_tag):
        asyncio.run(load())
    assert docker_api.inspect_image(victim_tag)["Id"] == victim_id
    assert not tag_exists(docker_api, tag)


def test_import_never_moves_a_checkpoint_tag_another_installation_holds(
        sbx, docker_api, made, tmp_path):
    """Two installations on one engine: an archive naming the other's checkpoint id, with an
    image of its own labelled as that checkpoint, must not take over its tag: each holds its
    own, and the other's checkpoint stays what it was."""
    ckpt, manifest, _ = _exported(sbx, tmp_path)
    tag = f"{REPOSITORY}:{ckpt['id']}"  # the archive's name for it
    held = docker_api.inspect_image(ckpt["backend_ref"])["Id"]
    box = sbx.create()
    sh(sbx, box["id"], "echo forged > /work/file")
    forged_id = docker_api.commit(box["backend_ref"], repository="sbx-test-forged", tag=RUN_ID,
                                  changes=[f'LABEL "sbx.checkpoint"="{ckpt["id"]}"'])["Id"]
    made.image_ids.append(forged_id)
    saved = b"".join(docker_api.get_image(f"sbx-test-forged:{RUN_ID}"))
    docker_api.remove_image(f"sbx-test-forged:{RUN_ID}")
    with tarfile.open(fileobj=io.BytesIO(saved)) as inner:
        entries = json.loads(inner.extractfile("manifest.json").read())
    entries[0]["RepoTags"] = [tag]
    hex_id = forged_id.removeprefix("sha256:")
    image = _rewritten_image(saved, {
        "manifest.json": json.dumps(entries).encode(),
        "repositories": json.dumps({REPOSITORY: {ckpt["id"]: hex_id}}).encode()}, [])
    path = _with_manifest(tmp_path / "takeover.tgz", manifest, image)

    other = made.runner(sbx, "home-j")
    ok(other("checkpoint", "import", str(path)))  # the archive's content, as its own
    assert docker_api.inspect_image(ckpt["backend_ref"])["Id"] == held
    assert docker_api.inspect_image(tag_of(other.home, ckpt["id"]))["Id"] == forged_id
    assert not tag_exists(docker_api, tag)
    fork = restore(sbx, ckpt["id"])  # the other installation's checkpoint is still its own
    assert docker_sh(docker_api, fork["backend_ref"], "cat /work/file 2>&1 || true") != "forged\n"
    # a tag of that name held before (as checkpoints made before holder tags are) is never
    # moved: that import is refused
    docker_api.tag(held, REPOSITORY, ckpt["id"])
    made.tags.append(tag)
    ok(other("checkpoint", "rm", ckpt["id"]))
    result = other("checkpoint", "import", str(path))
    assert result.code == 2, result
    assert tag in one_line(result)
    assert docker_api.inspect_image(tag)["Id"] == held
    assert table_rows(other.home, "checkpoints") == []
