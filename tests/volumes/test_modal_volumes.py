"""Volumes on the modal backend (docs/volumes.md), through the real `sbx` CLI and the real
`modal` SDK against the local stand-in (tests/standins/modal_server.py): a volume is a Modal
V2 volume, its files reached without a sandbox through Modal's volume API (blocks over
HTTP), mounted through `Sandbox.create(volumes=...)`. The stand-in's commands run on this
host, each in a mount namespace of its own with the volume bind-mounted at the mount path, so
a mount path here is a folder of the test's tmp folder and the volume's files are the
stand-in's folder for it. Every RPC the stand-in does not implement fails the test.
"""

from __future__ import annotations

import asyncio
import io
import secrets
import subprocess
import tarfile
from pathlib import Path

import pytest
from standins.modal_server import ModalStandin
from support import SBX, modal_sdk_env, table_rows, write_profile

from sandboxer.adapters.base import AdapterError
from sandboxer.adapters.modal import ModalAdapter

TOKEN_ID = f"ak-sbxvol{secrets.token_hex(6)}"
TOKEN_SECRET = f"as-sbxvol{secrets.token_hex(12)}"
REGISTRY = "sandboxer-volumes"
# the volume RPCs the SDK was seen to send for sbx's volume operations (docs/modal.md)
VOLUME_RPCS = {"VolumeGetOrCreate", "VolumeDelete", "VolumeListFiles2", "VolumeGetFile2",
               "VolumePutFiles2", "DictGetOrCreate", "DictUpdate", "DictGet", "DictPop",
               "DictContents"}


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> ModalStandin:
    server = ModalStandin(tmp_path_factory.mktemp("modal-standin"), TOKEN_ID, TOKEN_SECRET)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def modal(standin, monkeypatch, tmp_path) -> dict:
    """The SDK (in the `sbx` this test starts) pointed at the stand-in, and a profile whose
    sandboxes it runs; afterwards, no RPC the stand-in lacks was called, and no volume or
    Dict RPC beyond those docs/modal.md lists."""
    seen, calls = len(standin.unimplemented), len(standin.calls)
    modal_sdk_env(monkeypatch, standin.url, TOKEN_ID, TOKEN_SECRET, tmp_path / "modal.toml")
    profile = write_profile(tmp_path, "mdl", f"extends: modal\nimage: {standin.add_image()}\n")
    yield {"profile": str(profile)}
    assert standin.unimplemented[seen:] == [], "the SDK called RPCs the stand-in lacks"
    assert {c.method for c in standin.calls[calls:]
            if c.method.startswith(("Volume", "Dict"))} <= VOLUME_RPCS


def volume_ok(sbx, *args: str) -> dict:
    result = sbx("volume", *args, "--json")
    assert result.code == 0, result.err
    return result.json()


def files_of(standin: ModalStandin, volume_id: str) -> dict[str, str]:
    """The volume's files as the stand-in holds them: path -> text."""
    volume = standin.volume_by_name(f"sbx-{volume_id}")
    assert volume is not None, f"Modal has no volume for {volume_id}"
    return {p.relative_to(volume.folder).as_posix(): p.read_text()
            for p in sorted(volume.folder.rglob("*")) if p.is_file()}


def registry_size(standin: ModalStandin) -> int:
    return len(standin.dicts.get(standin.dict_ids.get(REGISTRY, ""), {}))


def test_a_volume_outlives_its_sandbox_and_a_read_only_mount_refuses_writes(sbx, standin,
                                                                           modal, tmp_path):
    vol = volume_ok(sbx, "create", "memory", "--backend", "modal", "--label", "team=a")
    assert (vol["backend"], vol["labels"]) == ("modal", {"team": "a"})
    made = standin.volume_by_name(f"sbx-{vol['id']}")
    assert made is not None and made.version == 2  # a V2 volume, sbx's by its name
    assert files_of(standin, vol["id"]) == {}

    work = tmp_path / "work"  # not there yet: made for the mount, removed after it
    first = sbx.create("--profile-file", modal["profile"], "--volume", f"memory:{work}")
    [mount] = standin.create_of(first["id"]).definition.volume_mounts
    assert (mount.volume_id, mount.mount_path, mount.read_only) == (made.id, str(work), False)
    wrote = sbx("exec", first["id"], "--", "sh", "-c", f"echo learnt > {work}/notes")
    assert wrote.code == 0, wrote.err
    assert files_of(standin, vol["id"]) == {"notes": "learnt\n"}
    assert not (work / "notes").exists()  # a mount of the sandbox's commands only
    shown = volume_ok(sbx, "show", "memory")
    assert shown["mounted_by"] == [{"sandbox": first["id"], "path": str(work),
                                    "read_only": False}]
    assert shown["size_bytes"] == len("learnt\n")  # Modal's listing, summed
    assert sbx("destroy", first["id"], "--yes").code == 0
    assert not work.exists()
    assert files_of(standin, vol["id"]) == {"notes": "learnt\n"}  # the volume stays

    second = sbx.create("--profile-file", modal["profile"], "--volume", f"memory:{work}:ro")
    assert standin.create_of(second["id"]).definition.volume_mounts[0].read_only
    read = sbx("exec", second["id"], "--", "cat", f"{work}/notes")
    assert (read.code, read.out) == (0, "learnt\n"), read.err
    refused = sbx("exec", second["id"], "--", "sh", "-c", f"echo more >> {work}/notes")
    assert refused.code != 0 and "Read-only file system" in refused.err
    assert files_of(standin, vol["id"]) == {"notes": "learnt\n"}
    assert sbx("destroy", second["id"], "--yes").code == 0
    assert sbx("volume", "rm", "memory").code == 0


def test_files_without_a_sandbox_and_rm_removes_the_modal_volume(sbx, standin, modal,
                                                                 tmp_path):
    recorded = registry_size(standin)
    vol = volume_ok(sbx, "create", "repo", "--backend", "modal")
    assert registry_size(standin) == recorded + 1  # sbx's, with its labels
    source = tmp_path / "checkout"
    (source / "src").mkdir(parents=True)
    (source / "src" / "a.txt").write_text("alpha\n")
    (source / "big.bin").write_bytes(b"\1" * (9 * 1024 * 1024))  # two of Modal's blocks
    creates = len(standin.creates)
    put = sbx("volume", "put", "repo", str(source), "/")
    assert put.code == 0, put.err
    assert "VolumePutFiles2" in standin.methods()  # Modal's own volume API, no sandbox
    assert len(standin.creates) == creates
    assert files_of(standin, vol["id"])["checkout/src/a.txt"] == "alpha\n"

    out = tmp_path / "out"
    out.mkdir()
    got = sbx("volume", "get", "repo", "/checkout", str(out))
    assert got.code == 0, got.err
    assert (out / "checkout" / "src" / "a.txt").read_text() == "alpha\n"
    assert (out / "checkout" / "big.bin").read_bytes() == b"\1" * (9 * 1024 * 1024)
    proc = subprocess.run([*SBX, "volume", "get", "repo", "/checkout/src/a.txt", "-"],
                          cwd=sbx.cwd, env=sbx.env(), capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        assert tar.getnames() == ["a.txt"]
        assert tar.extractfile("a.txt").read() == b"alpha\n"
    missing = sbx("volume", "get", "repo", "/checkout/nope", str(out))
    assert missing.code == 3 and "/checkout/nope does not exist in volume 'repo'" in missing.err
    assert len(missing.err.strip().splitlines()) == 1 and "Traceback" not in missing.err
    moved = [e["payload"] for e in sbx("events", "--json").json() if e["type"] == "volume.file"]
    assert [(p["op"], p["path"]) for p in moved] == [
        ("upload", "/"), ("download", "/checkout"), ("download", "/checkout/src/a.txt")]

    assert sbx("volume", "rm", "repo").code == 0
    assert standin.volume_by_name(f"sbx-{vol['id']}") is None
    assert registry_size(standin) == recorded
    assert sbx("volume", "rm", "repo").code == 3


def test_bad_input_is_refused_and_changes_nothing(sbx, standin, modal, tmp_path):
    vol = volume_ok(sbx, "create", "kept", "--backend", "modal")
    seed = tmp_path / "seed.txt"
    seed.write_text("seed\n")
    assert sbx("volume", "put", "kept", str(seed), "/").code == 0

    # a link in the tree: Modal's volume API keeps files and folders only; nothing uploaded
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "ok.txt").write_text("fine\n")
    (tree / "link").symlink_to("ok.txt")
    events = table_rows(sbx.home, "events")
    linked = sbx("volume", "put", "kept", str(tree), "/")
    assert linked.code == 2, linked.err
    assert "the modal backend keeps files and folders in a volume" in linked.err
    assert len(linked.err.strip().splitlines()) == 1 and str(tmp_path) not in linked.err
    assert files_of(standin, vol["id"]) == {"seed.txt": "seed\n"}
    assert table_rows(sbx.home, "events") == events

    # a profile with another token than the volume's: refused before anything is made
    other = write_profile(tmp_path, "other", Path(modal["profile"]).read_text() + (
        "options: {token_id: env:MODAL_TOKEN_ID_WORK, "
        "token_secret: env:MODAL_TOKEN_SECRET_WORK}\n"))
    creates = len(standin.creates)
    sandboxes = table_rows(sbx.home, "sandboxes")
    crossed = sbx("create", "--profile-file", str(other), "--volume", f"kept:{tmp_path / 'k'}",
                  env={"MODAL_TOKEN_ID_WORK": TOKEN_ID, "MODAL_TOKEN_SECRET_WORK": TOKEN_SECRET})
    assert crossed.code == 2, crossed.err
    assert "mounts a volume only into a sandbox made with the token" in crossed.err
    assert TOKEN_SECRET not in crossed.err and len(crossed.err.strip().splitlines()) == 1
    assert len(standin.creates) == creates and table_rows(sbx.home, "sandboxes") == sandboxes
    assert not (tmp_path / "k").exists()

    # a Modal volume sbx did not make (not in its registry) is never deleted
    async def foreign() -> None:
        import modal

        adapter = ModalAdapter()
        try:
            client = await adapter._client(adapter._volume_tokens())
            await modal.Volume.objects.create.aio("someone-elses", version=2, client=client)
            with pytest.raises(AdapterError, match="not one of sbx's"):
                await adapter.remove_volume("someone-elses")
        finally:
            await adapter.close()

    asyncio.run(foreign())
    assert standin.volume_by_name("someone-elses") is not None
    assert sbx("volume", "rm", "kept").code == 0
