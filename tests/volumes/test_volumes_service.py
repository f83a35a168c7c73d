"""Volumes through the service (docs/volumes.md, docs/security.md "Tenants"): a tenant's key
sees, mounts and reads only its own volumes; another tenant's is 404, worded as a missing
one, and the refusal changes nothing."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator

import pytest
from support import install_id_of, table_rows

from tests.service.conftest import Api
from tests.service.live import LiveService
from tests.volumes.conftest import remove_test_volumes


@pytest.fixture
def live_docker(sbx_home, monkeypatch) -> Iterator[LiveService]:
    service = LiveService(sbx_home).start()
    yield service
    service.stop()
    from support import remove_test_containers

    remove_test_containers(sbx_home)
    remove_test_volumes(sbx_home)


def tar_of(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def missing(answer, ref: str) -> None:
    assert answer.status_code == 404, (answer.request.url, answer.text)
    assert answer.json()["error"] == {"code": 3, "kind": "not_found",
                                      "message": f"no volume {ref!r}"}


def test_a_tenant_cannot_see_mount_or_read_another_tenants_volume(live_docker, sbx_home):
    alice = Api(live_docker.url, live_docker.key("write", owner="alice"))
    bob = Api(live_docker.url, live_docker.key("write", owner="bob"))
    admin = Api(live_docker.url, live_docker.key("admin", owner="ops"))
    try:
        made = alice.post("/v1/volumes", json={"name": "notes", "labels": {"k": "v"}})
        assert made.status_code == 201, made.text
        hers = made.json()
        assert (hers["owner"], hers["name"], hers["labels"]) == ("alice", "notes", {"k": "v"})
        put = alice.put("/v1/volumes/notes/files/tree", params={"path": "/"},
                        content=tar_of("secret.txt", b"alice only\n"),
                        headers={"Content-Type": "application/x-tar"})
        assert put.status_code == 200, put.text

        before = (table_rows(sbx_home, "volumes"), table_rows(sbx_home, "sandboxes"),
                  table_rows(sbx_home, "mounts"), table_rows(sbx_home, "events"))
        assert bob.get("/v1/volumes").json() == []
        for ref in ("notes", hers["id"]):
            missing(bob.get(f"/v1/volumes/{ref}"), ref)
            missing(bob.delete(f"/v1/volumes/{ref}"), ref)
            missing(bob.get(f"/v1/volumes/{ref}/files/tree", params={"path": "/secret.txt"}),
                    ref)
            missing(bob.put(f"/v1/volumes/{ref}/files/tree", params={"path": "/"},
                            content=tar_of("x", b"x"),
                            headers={"Content-Type": "application/x-tar"}), ref)
        mount = bob.post("/v1/sandboxes", json={"volumes": [{"name": "notes",
                                                             "path": "/notes"}]})
        missing(mount, "notes")
        assert (table_rows(sbx_home, "volumes"), table_rows(sbx_home, "sandboxes"),
                table_rows(sbx_home, "mounts"), table_rows(sbx_home, "events")) == before

        # a name is per tenant: bob's own "notes" is another, empty volume
        his = bob.post("/v1/volumes", json={"name": "notes"})
        assert his.status_code == 201 and his.json()["id"] != hers["id"]
        absent = bob.get("/v1/volumes/notes/files/tree", params={"path": "/secret.txt"})
        assert absent.status_code == 404 and "/secret.txt does not exist" in absent.text
        assert [v["id"] for v in alice.get("/v1/volumes").json()] == [hers["id"]]

        # alice mounts and reads her own through the service
        box = alice.post("/v1/sandboxes", json={"volumes": [{"name": "notes", "path": "/n",
                                                             "read_only": True}]})
        assert box.status_code == 201, box.text
        read = alice.post(f"/v1/sandboxes/{box.json()['id']}/exec",
                          json={"argv": ["cat", "/n/secret.txt"]})
        assert read.status_code == 200 and read.json()["stdout"] == "alice only\n"
        got = alice.get("/v1/volumes/notes/files/tree", params={"path": "/secret.txt"})
        with tarfile.open(fileobj=io.BytesIO(got.content)) as tar:
            assert tar.extractfile("secret.txt").read() == b"alice only\n"

        # an admin sees both; a name two owners hold is asked for by id
        assert {v["id"] for v in admin.get("/v1/volumes").json()} == {
            hers["id"], his.json()["id"]}
        ambiguous = admin.get("/v1/volumes/notes")
        assert ambiguous.status_code == 400 and "give its id" in ambiguous.text
        assert install_id_of(sbx_home) is not None
    finally:
        for api in (alice, bob, admin):
            api.http.close()
