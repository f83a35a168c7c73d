"""Volumes on the real Docker engine, through the real `sbx` CLI (docs/volumes.md): a volume
outlives the sandboxes that mount it, read-only mounts refuse writes, the sharing rule refuses
a second read-write mount and changes nothing, the reaper removes an expired volume only once
no live sandbox mounts it, files go in and out without a sandbox, and bad input is refused
with exit 2 before anything is made."""

from __future__ import annotations

import io
import json
import tarfile

import docker
import pytest
from support import RUN_LABEL, events_of, install_id_of, table_rows

pytestmark = pytest.mark.usefixtures("volumes_cleanup")


def volume_ok(sbx, *args: str) -> dict:
    result = sbx("volume", *args, "--json")
    assert result.code == 0, result.err
    return result.json()


def docker_volumes(home) -> list[str]:
    api = docker.APIClient(version="auto")
    try:
        found = api.volumes(filters={"label": [f"sbx.install={install_id_of(home)}"]}) or {}
        return sorted(v["Name"] for v in found.get("Volumes") or [])
    finally:
        api.close()


def helpers_left() -> list[dict]:
    api = docker.APIClient(version="auto")
    try:
        return [c for c in api.containers(all=True, filters={"label": ["sbx.volume"]})]
    finally:
        api.close()


def ids_of(docker_api) -> list[str]:
    return sorted(c["Id"] for c in docker_api.containers(all=True,
                                                         filters={"label": [RUN_LABEL]}))


def test_a_volume_outlives_its_sandbox_and_a_read_only_mount_refuses_writes(sbx):
    vol = volume_ok(sbx, "create", "work", "--label", "team=a")
    assert vol["name"] == "work" and vol["labels"] == {"team": "a"} and vol["mounted_by"] == []
    first = sbx.create("--volume", "work:/work")
    wrote = sbx("exec", first["id"], "--", "sh", "-c", "echo kept > /work/memory.txt")
    assert wrote.code == 0, wrote.err
    shown = volume_ok(sbx, "show", "work")
    assert shown["mounted_by"] == [{"sandbox": first["id"], "path": "/work",
                                    "read_only": False}]
    assert shown["size_bytes"] is not None and shown["size_bytes"] >= len("kept\n")
    assert sbx("destroy", first["id"]).code == 0

    second = sbx.create("--volume", "work:/data:ro")
    read = sbx("exec", second["id"], "--", "cat", "/data/memory.txt")
    assert (read.code, read.out) == (0, "kept\n")
    refused = sbx("exec", second["id"], "--", "sh", "-c", "echo x > /data/other.txt")
    assert refused.code != 0 and "Read-only file system" in refused.err
    assert volume_ok(sbx, "show", vol["id"])["mounted_by"] == [
        {"sandbox": second["id"], "path": "/data", "read_only": True}]

    mounted = [e for e in events_of(sbx, first["id"]) + events_of(sbx, second["id"])
               if e["type"] == "volume.mounted"]
    assert [(e["sandbox_id"], e["payload"]) for e in mounted] == [
        (first["id"], {"volume": vol["id"], "name": "work", "path": "/work", "read_only": False}),
        (second["id"], {"volume": vol["id"], "name": "work", "path": "/data", "read_only": True})]


def test_a_second_read_write_mount_is_refused_and_changes_nothing(sbx, docker_api):
    volume_ok(sbx, "create", "cache")
    writer = sbx.create("--volume", "cache:/cache")
    before = (table_rows(sbx.home, "sandboxes"), table_rows(sbx.home, "mounts"),
              table_rows(sbx.home, "events"),
              ids_of(docker_api))
    refused = sbx("create", "--label", RUN_LABEL, "--volume", "cache:/cache")
    assert refused.code == 4
    assert "volume 'cache' is mounted read-write by " + writer["id"] in refused.err
    assert (table_rows(sbx.home, "sandboxes"), table_rows(sbx.home, "mounts"),
            table_rows(sbx.home, "events"),
            ids_of(docker_api)) == before

    removing = sbx("volume", "rm", "cache")  # refused while a live sandbox mounts it
    assert removing.code == 4 and writer["id"] in removing.err
    assert len(table_rows(sbx.home, "volumes")) == 1 and len(docker_volumes(sbx.home)) == 1

    reader = sbx.create("--volume", "cache:/cache:ro")  # read-only beside the writer: fine
    assert {m["sandbox"] for m in volume_ok(sbx, "show", "cache")["mounted_by"]} == {
        writer["id"], reader["id"]}

    volume_ok(sbx, "create", "both", "--shared")  # sharing allowed: two writers
    one = sbx.create("--volume", "both:/both")
    two = sbx.create("--volume", "both:/both")
    wrote = sbx("exec", one["id"], "--", "sh", "-c", "echo from-one > /both/f")
    assert wrote.code == 0, wrote.err
    assert sbx("exec", two["id"], "--", "cat", "/both/f").out == "from-one\n"


def test_the_reaper_skips_a_mounted_volume_and_removes_it_once_unmounted(sbx):
    vol = volume_ok(sbx, "create", "scratch", "--ttl", "10m")
    assert vol["expires_at"] is not None
    box = sbx.create("--ttl", "3h", "--volume", "scratch:/s")
    later = {"SBX_CLOCK_OFFSET": "1h"}  # the volume is due, the sandbox is not

    kept = sbx("reap", "--json", env=later)
    assert kept.code == 0, kept.err
    assert {"id": vol["id"], "error": "a live sandbox mounts it"} in kept.json()["skipped"]
    assert [v["id"] for v in volume_ok(sbx, "ls")] == [vol["id"]]
    assert len(docker_volumes(sbx.home)) == 1

    assert sbx("destroy", box["id"]).code == 0
    reaped = sbx("reap", "--json", env=later)
    assert reaped.code == 0, reaped.err
    assert {"volume": vol["id"], "action": "expired volume removed",
            "reason": "ttl"} in reaped.json()["reconciled"]
    assert volume_ok(sbx, "ls") == [] and docker_volumes(sbx.home) == []
    removed = [e for e in sbx("events", "--json").json() if e["type"] == "volume.removed"]
    assert [(e["reason"], e["payload"]["volume"]) for e in removed] == [("ttl", vol["id"])]


def test_files_go_into_and_out_of_a_volume_without_a_sandbox(sbx, tmp_path):
    volume_ok(sbx, "create", "repo")
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("alpha\n")
    (src / "sub" / "b.bin").write_bytes(bytes(range(256)) * 300)

    put = sbx("volume", "put", "repo", str(src), "/checkout", "--json")
    assert put.code == 0, put.err
    assert put.json()["path"] == "/checkout" and put.json()["entries"] == 4
    assert sbx("ls", "--json").json() == []  # no sandbox was made for it
    assert helpers_left() == []  # and the helper container is gone

    out = tmp_path / "out"
    out.mkdir()
    got = sbx("volume", "get", "repo", "/checkout/src", str(out))
    assert got.code == 0, got.err
    assert (out / "src" / "a.txt").read_text() == "alpha\n"
    assert (out / "src" / "sub" / "b.bin").read_bytes() == bytes(range(256)) * 300

    streamed = sbx.__class__(sbx.home, sbx.cwd)  # `-`: the tar stream on stdout
    import subprocess

    from support import SBX
    proc = subprocess.run([*SBX, "volume", "get", "repo", "/checkout/src/a.txt", "-"],
                          cwd=streamed.cwd, env=streamed.env(), capture_output=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        assert tar.getnames() == ["a.txt"]
        assert tar.extractfile("a.txt").read() == b"alpha\n"
    assert helpers_left() == []

    missing = sbx("volume", "get", "repo", "/checkout/nope", str(out))
    assert missing.code == 3 and "/checkout/nope does not exist in volume 'repo'" in missing.err

    box = sbx.create("--volume", "repo:/repo:ro")  # what went in is what a sandbox sees
    assert sbx("exec", box["id"], "--", "cat", "/repo/checkout/src/a.txt").out == "alpha\n"
    moved = [e["payload"] for e in sbx("events", "--json").json() if e["type"] == "volume.file"]
    assert [(p["op"], p["direction"], p["path"]) for p in moved] == [
        ("upload", "in", "/checkout"), ("download", "out", "/checkout/src"),
        ("download", "out", "/checkout/src/a.txt")]


def test_a_checkpoint_names_its_volumes_and_a_restore_mounts_them_again(sbx, tmp_path):
    volume_ok(sbx, "create", "state")
    box = sbx.create("--volume", "state:/state")
    wrote = sbx("exec", box["id"], "--", "sh", "-c",
                "echo before > /state/v && echo rootfs > /tmp/r")
    assert wrote.code == 0, wrote.err
    snap = sbx("snapshot", box["id"], "--json")
    assert snap.code == 0, snap.err
    ckpt = snap.json()
    assert ckpt["volumes"] == [{"name": "state", "path": "/state", "read_only": False}]
    assert sbx("exec", box["id"], "--", "sh", "-c", "echo after > /state/v").code == 0
    assert sbx("destroy", box["id"]).code == 0

    restored = sbx("restore", ckpt["id"], "--label", RUN_LABEL, "--json")
    assert restored.code == 0, restored.err
    again = restored.json()["id"]
    # the filesystem is the checkpoint's; the volume is not in it: mounted again, as it is now
    assert sbx("exec", again, "--", "cat", "/tmp/r", "/state/v").out == "rootfs\nafter\n"

    archive = tmp_path / "c.tar.gz"
    exported = sbx("checkpoint", "export", ckpt["id"], "-o", str(archive))
    assert exported.code == 0, exported.err
    assert "the archive holds no volume data; its sandbox mounted state at /state" in \
        exported.err
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
    assert manifest["volumes_not_included"] == ckpt["volumes"]

    assert sbx("destroy", again).code == 0
    assert sbx("volume", "rm", "state").code == 0
    rows = table_rows(sbx.home, "sandboxes")
    refused = sbx("restore", ckpt["id"], "--label", RUN_LABEL)
    assert refused.code == 3
    assert "no volume 'state': the checkpoint's sandbox mounted it at /state" in refused.err
    assert table_rows(sbx.home, "sandboxes") == rows
    assert sbx("checkpoint", "rm", ckpt["id"]).code == 0


@pytest.mark.parametrize(("args", "code", "said"), [
    (("volume", "create", "../up"), 2, "bad volume name '../up'"),
    (("volume", "create", "vol-1"), 2, "names may not start with 'vol-'"),
    (("volume", "create", "ok", "--ttl", "-5m"), 2, "--ttl"),
    (("volume", "create", "ok", "--backend", "stub"), 2, "the stub backend keeps no volumes"),
    (("volume", "create", "ok", "--backend", "e2b"), 5, "no E2B API key: set E2B_API_KEY"),
    (("volume", "create", "ok", "--backend", "nope"), 2, "unknown backend 'nope'"),
    (("create", "--volume", "absent:/d"), 3, "no volume 'absent'"),
    (("create", "--volume", "absent:relative"), 2, "'relative' is not a mount path"),
    (("create", "--volume", "absent:/a/../b"), 2, "is not a mount path"),
    (("volume", "put", "absent", ".", "/x"), 3, "no volume 'absent'"),
    (("volume", "show", "/etc/passwd"), 2, "bad volume name"),
])
def test_bad_input_is_refused_and_changes_nothing(sbx, args, code, said):
    result = sbx(*args, env={"SBX_ADAPTERS": "docker,stub,e2b,modal"})
    assert result.code == code, result.err
    assert said in result.err and len(result.err.strip().splitlines()) == 1
    assert "Traceback" not in result.err and str(sbx.home) not in result.err
    assert table_rows(sbx.home, "volumes") == [] and table_rows(sbx.home, "sandboxes") == []
    assert install_id_of(sbx.home) is None or docker_volumes(sbx.home) == []


def test_compose_mounts_the_engines_named_volume_and_its_down_leaves_it(sbx, tmp_path):
    """The compose backend mounts sbx's volume into the project's service as an external
    volume: `compose down --volumes` at destroy leaves it, and a later project reads it."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    project = {"services": {"app": {"image": "sandboxer/base:busybox", "command": [
        "sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $$!; done"]}}}
    (folder / "stack.yaml").write_text(json.dumps({
        "backend": "compose", "compose": {"project": project, "service": "app"}}))
    env = {"SBX_PROFILE_PATH": str(folder)}
    made = sbx("volume", "create", "shared-data", "--backend", "compose", "--json", env=env)
    assert made.code == 0, made.err
    seed = tmp_path / "seed.txt"
    seed.write_text("seeded\n")
    assert sbx("volume", "put", "shared-data", str(seed), "/", env=env).code == 0

    first = sbx("create", "--label", RUN_LABEL, "--profile", "stack", "--volume",
                "shared-data:/data", "--json", env=env)
    assert first.code == 0, first.err
    box = first.json()["id"]
    wrote = sbx("exec", box, "--", "sh", "-c", "cat /data/seed.txt > /data/copy.txt", env=env)
    assert wrote.code == 0, wrote.err
    assert sbx("destroy", box, env=env).code == 0
    assert len(docker_volumes(sbx.home)) == 1  # compose down --volumes left it

    second = sbx("create", "--label", RUN_LABEL, "--profile", "stack", "--volume",
                 "shared-data:/data:ro", "--json", env=env)
    assert second.code == 0, second.err
    read = sbx("exec", second.json()["id"], "--", "cat", "/data/copy.txt", env=env)
    assert (read.code, read.out) == (0, "seeded\n")
    assert helpers_left() == []
