"""Checkpoints, pause and resume on the real Docker engine, through the real `sbx` CLI.

A checkpoint is a `docker commit` tagged `sandboxer/checkpoint:<ckpt-id>` and labelled with
`sbx.checkpoint`, `sbx.install` and `sbx.id`. The `sbx` fixture removes this test's
containers but not images, so every test here takes the `made` fixture, which first removes
the containers of each installation the test used and then the checkpoint images labelled
with those installations' ids (newest first, by tag), plus any tag the test recorded. Only
what this test made is removed: every installation id is the test's own.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import time
import uuid
from pathlib import Path

import docker
import pytest
from conftest import (
    RUN_ID,
    RUN_LABEL,
    SBX,
    Result,
    SbxRunner,
    install_id_of,
    query,
    remove_test_containers,
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
    tag = f"{REPOSITORY}:{ckpt['id']}"
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
    busy = cpu_percent(docker_api, ref, samples=2)
    # busy again (well above the paused readings; the loop gets less than a core when the
    # machine is shared)
    assert len(busy) == 2 and max(busy) > 20.0, busy

    # paused again, it is still reaped at its deadline
    ok(sbx("pause", burner["id"]))
    offset = {"SBX_CLOCK_OFFSET": "6m"}
    report = ok(sbx("reap", "--json", env=offset)).json()
    assert report["destroyed"] == [burner["id"]], report
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
        assert not tag_exists(docker_api, f"{REPOSITORY}:{old}")
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
        assert not tag_exists(docker_api, f"{REPOSITORY}:{ckpt['id']}")
        assert docker_api.images(name=REPOSITORY,
                                 filters={"label": [f"sbx.checkpoint={ckpt['id']}"]}) == []
    assert set(images_of(docker_api, install_id_of(sbx.home))) == {kept["id"]}

    # `sbx checkpoints prune` does the same on its own
    third = snapshot(sbx, short["id"])
    assert ok(sbx("checkpoints", "prune", "--json")).json() == {"removed": []}
    pruned = ok(sbx("checkpoints", "prune", "--json", env={"SBX_CLOCK_OFFSET": "2h"})).json()
    assert pruned == {"removed": [third["id"]]}
    assert [r["id"] for r in checkpoint_rows(sbx.home)] == [kept["id"]]
    assert not tag_exists(docker_api, f"{REPOSITORY}:{third['id']}")
    assert tag_exists(docker_api, f"{REPOSITORY}:{kept['id']}")


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

    fresh = ok(other("restore", ckpt["id"], "--label", RUN_LABEL, "--json")).json()
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
    tag = f"{REPOSITORY}:{ckpt['id']}"
    assert not tag_exists(docker_api, tag)

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
    tag = f"{REPOSITORY}:{ckpt['id']}"
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
    assert rows[backend]["backend_ref"] == f"{REPOSITORY}:{backend}"
    assert all(r["state"] == "ready" for r in rows.values())
    # an image of this installation that no row claims goes too
    listed = ok(sbx("checkpoints", "--json")).json()
    assert [r["id"] for r in listed] == [backend]
    # and the completed checkpoint restores
    assert restore(sbx, backend)["state"] == "running"


def test_reap_removes_an_image_of_this_installation_that_no_row_claims(sbx, docker_api, made):
    box = sbx.create()
    install = install_id_of(sbx.home)
    orphan = "ckpt-" + uuid.uuid4().hex[:26]
    docker_api.commit(box["backend_ref"], repository=REPOSITORY, tag=orphan, changes=[
        f'LABEL "sbx.checkpoint"="{orphan}"', f'LABEL "sbx.install"="{install}"',
        f'LABEL "sbx.id"="{box["id"]}"'])
    made.tags.append(f"{REPOSITORY}:{orphan}")
    assert orphan in images_of(docker_api, install)
    report = ok(sbx("reap", "--json", env={"SBX_RECONCILE_GRACE": "1s"})).json()
    assert report["failed"] == [], report
    assert [r["action"] for r in report["reconciled"] if r.get("checkpoint") == orphan] == [
        "orphan artifact removed"], report
    assert not tag_exists(docker_api, f"{REPOSITORY}:{orphan}")
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
