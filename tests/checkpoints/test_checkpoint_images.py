"""Checkpoint images on an engine that several installations share (the real engine, the
real `sbx`): each installation holds an image by a tag of its own and lets go of that tag
only; a restore never pulls a checkpoint's image from a registry; an untagged checkpoint
image nobody holds is reaped, and nothing else is. Every installation is the test's own; the
`made` fixture (tests/checkpoints/test_checkpoints.py) removes what they made, by id."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import docker
import httpx
import pytest
from support import RUN_ID, RUN_LABEL, containers_of, install_id_of, query, table_rows

from tests.checkpoints.test_checkpoints import (
    REPOSITORY,
    Made,
    checkpoint_rows,
    events,
    ok,
    one_line,
    restore,
    sh,
    snapshot,
    tag_exists,
    tag_of,
)

pytestmark = pytest.mark.docker


@pytest.fixture
def made(sbx, docker_api):
    """What the test made beyond its containers, removed after it (tests/checkpoints/test_checkpoints.py)."""
    tracker = Made(docker_api, sbx.home)
    yield tracker
    tracker.cleanup()


def image_exists(api, image_id: str) -> bool:
    return tag_exists(api, image_id)


def images_labelled(api, ckpt_id: str) -> list[dict]:
    """Every image (intermediate ones too) labelled as the checkpoint `ckpt_id`."""
    return api.images(all=True, filters={"label": [f"sbx.checkpoint={ckpt_id}"]})


def live_containers(api, *homes: Path) -> list[str]:
    return [c["Id"] for home in homes if install_id_of(home)
            for c in containers_of(api, install_id_of(home))]


def export(runner, ckpt_id: str, path: Path) -> Path:
    ok(runner("checkpoint", "export", ckpt_id, "-o", str(path)))
    return path


def restore_import(runner, ckpt_id: str) -> dict:
    """Restore an imported checkpoint (it runs under a profile of this host, named)."""
    return ok(runner("restore", ckpt_id, "--profile", "default", "--label", RUN_LABEL,
                     "--json")).json()


# -- two installations, one image -----------------------------------------------------------


@pytest.mark.alone  # its last reap must be the one that finds the image unheld
def test_two_installations_each_let_go_of_their_own_tag_only(sbx, docker_api, made, tmp_path):
    """The issue's case: an archive imported on the engine it came from. Removing it in one
    installation left the other's `ready` checkpoint without its image."""
    box = sbx.create()
    digest = sh(sbx, box["id"], "echo shared > /work/file && sha256sum /work/file").split()[0]
    ckpt = snapshot(sbx, box["id"])
    archive = export(sbx, ckpt["id"], tmp_path / "shared.tgz")
    image_id = docker_api.inspect_image(ckpt["backend_ref"])["Id"]
    other = made.runner(sbx, "home-b")

    imported = ok(other("checkpoint", "import", str(archive), "--json")).json()
    assert imported["id"] == ckpt["id"]

    # the importer lets go: the maker's checkpoint is untouched, and restores
    ok(other("checkpoint", "rm", ckpt["id"]))
    assert docker_api.inspect_image(ckpt["backend_ref"])["Id"] == image_id
    assert [c["state"] for c in ok(sbx("checkpoints", "--json")).json()] == ["ready"]
    fork = restore(sbx, ckpt["id"])
    assert sh(sbx, fork["id"], "sha256sum /work/file").split()[0] == digest
    # (one image, held by a tag of each installation; the archive's name for it is not kept)
    assert imported["backend_ref"] == tag_of(other.home, ckpt["id"]) != ckpt["backend_ref"]
    assert not tag_exists(docker_api, imported["backend_ref"])
    assert not tag_exists(docker_api, f"{REPOSITORY}:{ckpt['id']}")

    # the other way round: imported again, the maker lets go first, the importer restores
    ok(other("checkpoint", "import", str(archive)))
    assert docker_api.inspect_image(tag_of(other.home, ckpt["id"]))["Id"] == image_id
    ok(sbx("checkpoint", "rm", ckpt["id"]))
    assert not tag_exists(docker_api, ckpt["backend_ref"])
    assert docker_api.inspect_image(tag_of(other.home, ckpt["id"]))["Id"] == image_id
    forked = restore_import(other, ckpt["id"])
    assert sh(other, forked["id"], "sha256sum /work/file").split()[0] == digest

    # the last holder lets go while sandboxes still run from the image: it stays for them,
    # untagged, and goes at the first reap after they are gone
    ok(other("checkpoint", "rm", ckpt["id"]))
    assert image_exists(docker_api, image_id)
    assert not [t for t in docker_api.inspect_image(image_id)["RepoTags"] or []
                if t.startswith(REPOSITORY)]
    ok(sbx("destroy", "--yes", box["id"], fork["id"]))
    ok(other("destroy", "--yes", forked["id"]))
    report = ok(sbx("reap", "--json")).json()
    assert report["failed"] == [], report
    assert "unheld artifact removed" in [r["action"] for r in report["reconciled"]
                                         if r.get("checkpoint") == ckpt["id"]], report
    assert not image_exists(docker_api, image_id)
    assert images_labelled(docker_api, ckpt["id"]) == []
    assert live_containers(docker_api, sbx.home, other.home) == []
    for home in (sbx.home, other.home):
        assert checkpoint_rows(home) == []
        assert {r["state"] for r in query(home, "SELECT state FROM sandboxes")} == {"destroyed"}


def test_a_reimport_on_the_host_it_came_from_is_a_checkpoint_of_its_own(
        sbx, docker_api, made, tmp_path):
    """`import --name` of an archive whose checkpoint is here: a new checkpoint, of a new id,
    whose image is a child of the original's relabelled as it; either goes without the
    other, and the copy travels on like any checkpoint."""
    box = sbx.create()
    digest = sh(sbx, box["id"], "echo once > /work/file && sha256sum /work/file").split()[0]
    ckpt = snapshot(sbx, box["id"], "--name", "orig")
    archive = export(sbx, ckpt["id"], tmp_path / "orig.tgz")
    original = docker_api.inspect_image(ckpt["backend_ref"])["Id"]

    before = (table_rows(sbx.home, "checkpoints"), table_rows(sbx.home, "events"))
    again = sbx("checkpoint", "import", str(archive))
    assert again.code == 4, again
    assert ckpt["id"] in one_line(again) and "--name" in one_line(again)
    assert (table_rows(sbx.home, "checkpoints"), table_rows(sbx.home, "events")) == before

    copy = ok(sbx("checkpoint", "import", str(archive), "--name", "copy", "--json")).json()
    assert copy["id"] != ckpt["id"] and copy["name"] == "copy" and copy["state"] == "ready"
    assert copy["origin_sandbox_id"] == box["id"]
    assert copy["backend_ref"] == tag_of(sbx.home, copy["id"])
    labels = docker_api.inspect_image(copy["backend_ref"])["Config"]["Labels"]
    assert labels["sbx.checkpoint"] == copy["id"]
    assert docker_api.inspect_image(ckpt["backend_ref"])["Id"] == original
    assert not tag_exists(docker_api, f"{REPOSITORY}:{ckpt['id']}")
    imported = [e for e in query(sbx.home, "SELECT payload_json FROM events WHERE type = "
                                           "'checkpoint.imported'")]
    assert len(imported) == 1 and ckpt["id"] in imported[0]["payload_json"]
    fork = restore_import(sbx, "copy")
    assert sh(sbx, fork["id"], "sha256sum /work/file").split()[0] == digest

    # the copy travels on: exported and imported elsewhere, it is the copy
    other = made.runner(sbx, "home-r")
    travelled = ok(other("checkpoint", "import", str(export(sbx, "copy", tmp_path / "c.tgz")),
                         "--json")).json()
    assert travelled["id"] == copy["id"]

    ok(sbx("checkpoint", "rm", "copy"))
    assert docker_api.inspect_image(ckpt["backend_ref"])["Id"] == original
    assert sh(sbx, restore(sbx, "orig")["id"], "cat /work/file") == "once\n"
    assert sh(other, restore_import(other, copy["id"])["id"], "cat /work/file") == "once\n"

    ok(sbx("checkpoint", "rm", "orig"))
    ok(other("checkpoint", "rm", copy["id"]))
    for runner in (sbx, other):
        ids = [r["id"] for r in ok(runner("ls", "--json")).json()]
        ok(runner("destroy", "--yes", *ids))
    ok(sbx("reap", "--json"))
    assert images_labelled(docker_api, ckpt["id"]) == []
    assert images_labelled(docker_api, copy["id"]) == []
    assert not image_exists(docker_api, original)
    assert live_containers(docker_api, sbx.home, other.home) == []


# -- a missing image ------------------------------------------------------------------------


def test_a_restore_never_pulls_a_missing_checkpoint_image(sbx, docker_api, made, tmp_path):
    """An image removed behind sbx's back: the restore is a conflict naming the checkpoint
    (exit 4, HTTP 409), makes no sandbox row and no container, asks no registry, and the
    checkpoint is `lost`; reconcile finds such a checkpoint by itself."""
    box = sbx.create()
    first, second, third = (snapshot(sbx, box["id"]) for _ in range(3))
    for ckpt in (first, second, third):
        docker_api.remove_image(ckpt["backend_ref"], force=True)
    sandboxes, containers = table_rows(sbx.home, "sandboxes"), live_containers(docker_api, sbx.home)

    result = sbx("restore", first["id"], "--label", RUN_LABEL)
    assert result.code == 4, result
    line = one_line(result)
    assert first["id"] in line and "lost" in line and "rm" in line, line
    assert table_rows(sbx.home, "sandboxes") == sandboxes
    assert live_containers(docker_api, sbx.home) == containers
    assert {c["id"]: c["state"] for c in checkpoint_rows(sbx.home)}[first["id"]] == "lost"
    lost = [e for e in events(sbx.home, box["id"]) if e["type"] == "checkpoint.lost"]
    assert [(e["reason"], e["payload"]["checkpoint"]) for e in lost] == [("gone", first["id"])]
    again = sbx("restore", first["id"], "--label", RUN_LABEL)
    assert again.code == 4 and "lost" in one_line(again), again

    from tests.service.live import LiveService

    live = LiveService(sbx.home).start()
    try:
        answer = httpx.post(f"{live.url}/v1/checkpoints/{second['id']}/restore",
                            headers={"Authorization": f"Bearer {live.key()}"},
                            json={"labels": dict([RUN_LABEL.split("=")])}, timeout=60)
    finally:
        live.stop()
    assert answer.status_code == 409, answer.text
    assert second["id"] in answer.json()["error"]["message"]
    assert table_rows(sbx.home, "sandboxes") == sandboxes
    assert live_containers(docker_api, sbx.home) == containers

    report = ok(sbx("reconcile", "--json")).json()
    assert report["failed"] == [], report
    assert [r["action"] for r in report["reconciled"] if r.get("checkpoint") == third["id"]] == [
        "lost"], report
    states = {c["id"]: c["state"] for c in ok(sbx("checkpoints", "--json")).json()}
    assert states == {first["id"]: "lost", second["id"]: "lost", third["id"]: "lost"}
    assert ok(sbx("reconcile", "--json")).json()["reconciled"] == []  # once

    for ckpt in (first, second, third):
        ok(sbx("checkpoint", "rm", ckpt["id"]))
    assert checkpoint_rows(sbx.home) == []
    assert table_rows(sbx.home, "sandboxes") == sandboxes


def test_a_compose_checkpoint_whose_images_are_gone_is_lost(sbx, docker_api, made, tmp_path):
    """The same rule on the compose backend, whose checkpoint is one image per service."""
    from tests.backends.test_compose import nothing_left, objects, stack

    env = stack(tmp_path / "profiles")
    box = sbx.create("--profile", "stack", env=env)
    try:
        ckpt = snapshot(sbx, box["id"], env=env)
        for info in docker_api.images(filters={"label": [f"sbx.checkpoint={ckpt['id']}"]}):
            docker_api.remove_image(info["Id"], force=True)
        sandboxes = table_rows(sbx.home, "sandboxes")
        result = sbx("restore", ckpt["id"], "--label", RUN_LABEL, env=env)
        assert result.code == 4, result
        assert ckpt["id"] in one_line(result) and "lost" in one_line(result)
        assert table_rows(sbx.home, "sandboxes") == sandboxes
        assert [c["state"] for c in checkpoint_rows(sbx.home)] == ["lost"]
        ok(sbx("destroy", "--yes", box["id"], env=env))
        assert nothing_left(docker_api, sbx.home), objects(docker_api, sbx.home)
    finally:
        by_install = {"label": [f"sbx.install={install_id_of(sbx.home)}"]}
        for info in docker_api.volumes(filters=by_install).get("Volumes") or []:
            docker_api.remove_volume(info["Name"], force=True)


# -- images nobody holds --------------------------------------------------------------------


@pytest.mark.alone  # another run's reap would remove the image this one plants
def test_reap_removes_untagged_checkpoint_images_and_nothing_else(sbx, docker_api, made):
    box = sbx.create()
    name = f"sbx-test-loose-{RUN_ID}-{uuid.uuid4().hex[:6]}"
    loose_ckpt = "ckpt-" + uuid.uuid4().hex[:26]

    def commit(*changes: str) -> str:
        image = docker_api.commit(box["backend_ref"], repository=name, tag="t",
                                  changes=list(changes))["Id"]
        made.image_ids.append(image)
        return image

    # each commit takes the tag from the one before, which is left untagged
    loose = commit(f'LABEL "sbx.checkpoint"="{loose_ckpt}"',
                   'LABEL "sbx.install"="inst-of-another-installation"')
    unlabelled = commit()
    commit()
    made.tags.append(f"{name}:t")
    for image in (loose, unlabelled):
        assert image_exists(docker_api, image)
        assert [t for t in docker_api.inspect_image(image)["RepoTags"] or []] == []
    # and an untagged checkpoint image a sandbox still runs from
    ckpt = snapshot(sbx, box["id"])
    in_use = docker_api.inspect_image(ckpt["backend_ref"])["Id"]
    fork = restore(sbx, ckpt["id"])
    ok(sbx("checkpoint", "rm", ckpt["id"]))
    assert image_exists(docker_api, in_use)

    report = ok(sbx("reap", "--json")).json()
    assert report["failed"] == [], report
    assert [r["action"] for r in report["reconciled"] if r.get("checkpoint") == loose_ckpt] == [
        "unheld artifact removed"], report
    assert not image_exists(docker_api, loose)
    assert image_exists(docker_api, unlabelled), "not a checkpoint image: not sbx's to remove"
    assert image_exists(docker_api, in_use), "a sandbox runs from it"
    removed = query(sbx.home, "SELECT reason, payload_json FROM events WHERE type = "
                              "'checkpoint.orphan-removed'")
    # (a loose image another run left on this engine may be removed too: count ours only)
    assert len([r for r in removed if loose_ckpt in r["payload_json"]]) == 1, removed
    assert container_running(docker_api, fork["backend_ref"])

    ok(sbx("destroy", "--yes", fork["id"]))
    ok(sbx("reap", "--json"))
    assert not image_exists(docker_api, in_use)
    assert image_exists(docker_api, unlabelled)


def container_running(api, ref: str) -> bool:
    try:
        return bool(api.inspect_container(ref)["State"]["Running"])
    except docker.errors.NotFound:
        return False


# -- an engine that does not answer ---------------------------------------------------------


def test_an_unreachable_engine_is_told_in_plain_words(sbx, tmp_path):
    """No exception's repr, no traceback, no `make run` (a pip install has no Makefile): where,
    why, and what to do whatever way sbx was installed (exit 5, docs/cli.md)."""
    closed = tmp_path / "closed.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(closed))
    listener.close()  # the socket file stays; nothing listens on it
    for host, why in ((f"unix://{closed}", "nothing accepts connections there"),
                      (f"unix://{tmp_path}/none.sock", "no engine listens there")):
        result = sbx("create", "--label", RUN_LABEL, env={"DOCKER_HOST": host})
        assert result.code == 5, result
        line = one_line(result)
        assert "Traceback" not in result.err
        assert "Error(" not in line and "(<" not in line and "make run" not in line, line
        assert f"Docker engine unreachable at {host}: {why}" in line, line
        assert "DOCKER_HOST" in line and "sbx doctor" in line, line
        assert table_rows(sbx.home, "sandboxes") == []
        assert table_rows(sbx.home, "checkpoints") == []
