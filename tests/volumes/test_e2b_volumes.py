"""Volumes on the e2b backend (docs/volumes.md), through the real `sbx` CLI and the real `e2b`
SDK against the local stand-in of E2B (tests/standins/e2b_server.py): its `/volumes` API and
volume content API, a volume's files a folder of the stand-in, bind-mounted on this host at
the mount's path for a sandbox that mounts it. A volume outlives the sandbox that wrote it, a
read-only mount is refused (E2B cannot make one), files go in and out without a sandbox,
`rm` deletes the E2B volume and leaves one sbx did not make, and bad input changes nothing.
"""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import subprocess
import tarfile
from collections.abc import Iterator

import pytest
from standins.e2b_server import E2BStandIn
from support import RUN_LABEL, SBX, install_id_of, table_rows

KEY = f"e2b_sbxtest_{secrets.token_hex(12)}"


@pytest.fixture
def standin() -> Iterator[E2BStandIn]:
    server = E2BStandIn({KEY: "team-a"}).start()
    yield server
    server.stop()
    assert server.problems == [], f"the stand-in met what it does not know: {server.problems}"


@pytest.fixture
def env(standin, monkeypatch) -> dict[str, str]:
    """The stand-in's environment for `sbx`, and for the adapter in this process."""
    for name in [n for n in os.environ if n.startswith("E2B_")]:
        monkeypatch.delenv(name)
    values = {"E2B_API_URL": standin.url, "E2B_SANDBOX_URL": standin.url, "E2B_API_KEY": KEY,
              "E2B_CONNECTION_RETRIES": "0", "SBX_E2B_RATE_LIMIT_BACKOFF": "0.01"}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def ok(sbx, env, *args: str) -> dict:
    result = sbx(*args, "--json", env=env)
    assert result.code == 0, result.err
    assert KEY not in result.out + result.err
    return result.json()


def refused(result, code: int, said: str) -> None:
    assert result.code == code, result.err
    assert said in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err
    assert KEY not in result.err


def the_volume(standin: E2BStandIn):
    [volume] = standin.volumes.values()
    return volume


def test_a_volume_outlives_its_sandbox_and_read_only_is_refused(sbx, env, standin, tmp_path):
    vol = ok(sbx, env, "volume", "create", "memory", "--backend", "e2b", "--label", "team=a")
    assert (vol["backend"], vol["labels"]) == ("e2b", {"team": "a"})
    kept = the_volume(standin)  # an E2B volume named as sbx's, of the key's team
    assert kept.name == f"sbx_{install_id_of(sbx.home)}_{vol['id']}" and kept.team == "team-a"
    assert list(kept.files.iterdir()) == []

    work = tmp_path / "memory"  # the mount's path: made for the mount, removed after it
    first = sbx.create("--profile", "e2b", "--volume", f"memory:{work}", env=env)
    wrote = sbx("exec", first["id"], "--", "sh", "-c", f"echo learnt > {work}/notes", env=env)
    assert wrote.code == 0, wrote.err
    shown = ok(sbx, env, "volume", "show", "memory")
    assert shown["mounted_by"] == [{"sandbox": first["id"], "path": str(work),
                                    "read_only": False}]
    assert shown["size_bytes"] == len("learnt\n")  # from the content API's listing
    assert sbx("destroy", first["id"], "--yes", env=env).code == 0
    assert not work.exists()
    assert (kept.files / "notes").read_text() == "learnt\n"  # the volume stays

    second = sbx.create("--profile", "e2b", "--volume", f"memory:{work}", env=env)
    read = sbx("exec", second["id"], "--", "cat", f"{work}/notes", env=env)
    assert (read.code, read.out) == (0, "learnt\n")

    # E2B mounts cannot be read-only: refused before anything is asked of E2B
    sandboxes, events = table_rows(sbx.home, "sandboxes"), table_rows(sbx.home, "events")
    creates = standin.count("create")
    ro = sbx("create", "--label", RUN_LABEL, "--profile", "e2b", "--volume",
             f"memory:{tmp_path / 'ro'}:ro", env=env)
    refused(ro, 2, "the e2b backend cannot mount a volume read-only")
    assert table_rows(sbx.home, "sandboxes") == sandboxes
    assert table_rows(sbx.home, "events") == events
    assert standin.count("create") == creates and not (tmp_path / "ro").exists()
    assert sbx("destroy", second["id"], "--yes", env=env).code == 0


def test_files_without_a_sandbox(sbx, env, standin, tmp_path):
    ok(sbx, env, "volume", "create", "repo", "--backend", "e2b")
    kept = the_volume(standin)
    source = tmp_path / "checkout"
    (source / "src").mkdir(parents=True)
    (source / "src" / "a.txt").write_text("alpha\n")
    (source / "run.sh").write_text("#!/bin/sh\n")
    (source / "run.sh").chmod(0o755)
    put = sbx("volume", "put", "repo", str(source), "/", env=env)
    assert put.code == 0, put.err
    assert (kept.files / "checkout" / "src" / "a.txt").read_text() == "alpha\n"
    assert (kept.files / "checkout" / "run.sh").stat().st_mode & 0o777 == 0o755

    out = tmp_path / "out"
    out.mkdir()
    got = sbx("volume", "get", "repo", "/checkout", str(out), env=env)
    assert got.code == 0, got.err
    assert (out / "checkout" / "src" / "a.txt").read_text() == "alpha\n"
    assert (out / "checkout" / "run.sh").stat().st_mode & 0o777 == 0o755
    proc = subprocess.run([*SBX, "volume", "get", "repo", "/checkout/src/a.txt", "-"],
                          cwd=sbx.cwd, env=sbx.env(env), capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        assert tar.getnames() == ["a.txt"]
        assert tar.extractfile("a.txt").read() == b"alpha\n"
    assert standin.count("create") == 0  # no sandbox was made for any of it

    missing = sbx("volume", "get", "repo", "/checkout/nope", str(out), env=env)
    refused(missing, 3, "/checkout/nope does not exist in volume 'repo'")

    # a link cannot be made through E2B's volume API: the whole tree is refused, nothing written
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "data").write_text("d\n")
    (linked / "link").symlink_to("data")
    events = table_rows(sbx.home, "events")
    bad = sbx("volume", "put", "repo", str(linked), "/", env=env)
    refused(bad, 2, "cannot be put into an E2B volume")
    assert not (kept.files / "linked").exists() and table_rows(sbx.home, "events") == events
    moved = [e["payload"] for e in ok(sbx, env, "events") if e["type"] == "volume.file"]
    assert [(p["op"], p["path"]) for p in moved] == [
        ("upload", "/"), ("download", "/checkout"), ("download", "/checkout/src/a.txt")]


def test_rm_deletes_only_sbx_volumes(sbx, env, standin):
    from sandboxer.adapters.base import AdapterError
    from sandboxer.adapters.e2b import E2BAdapter

    vol = ok(sbx, env, "volume", "create", "scratch", "--backend", "e2b")
    [(e2b_id, _)] = standin.volumes.items()

    async def foreign() -> str:  # a volume of the same team that sbx did not make
        import e2b

        made = await e2b.AsyncVolume.create("mine", api_key=KEY)
        adapter = E2BAdapter()
        listed = await adapter.list_volumes({})
        assert listed == [e2b_id], listed  # sbx's only, found by the name's labels
        with pytest.raises(AdapterError, match="was not made by sbx"):
            await adapter.remove_volume(made.volume_id)
        return made.volume_id

    mine = asyncio.run(foreign())
    removed = sbx("volume", "rm", "scratch", env=env)
    assert removed.code == 0 and f"removed {vol['id']}" in removed.out, removed.err
    assert list(standin.volumes) == [mine]  # sbx's gone, the other left as it was
    refused(sbx("volume", "rm", "scratch", env=env), 3, "no volume 'scratch'")
    assert table_rows(sbx.home, "volumes") == []
