"""The ssh backend taking its hosts from a Packer manifest: the JSON the manifest
post-processor writes (`builds[]` with name, builder_type, artifact_id, packer_run_uuid and
custom_data; `last_run_uuid`), here pointing at the real OpenSSH server of tests/sshd.py on
127.0.0.1 (one server on three ports: three hosts)."""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path

import pytest
import yaml
from sshd import sshd_server  # noqa: F401 (a fixture)
from support import table_rows, write_profile


def build(server, name: str, port: int, run: str, **custom: str) -> dict:
    """One entry of `builds`, as Packer writes it; custom_data is text, as in a template."""
    return {
        "name": name,
        "builder_type": "qemu",
        "build_time": 1735689600,
        "files": [{"name": f"output-{name}/{name}.qcow2", "size": 1073741824}],
        "artifact_id": f"{name}.qcow2",
        "packer_run_uuid": run,
        "custom_data": {"host": server.host, "port": str(port), "user": server.user,
                        "key": str(server.key), "known_hosts": str(server.known_hosts),
                        **custom},
    }


def write_manifest(path: Path, builds: list[dict], last_run: str) -> Path:
    path.write_text(json.dumps({"builds": builds, "last_run_uuid": last_run}, indent=2))
    return path


def packer_profile(folder: Path, manifest: Path, name: str = "vm", **options) -> Path:
    body = ("backend: ssh\nnetwork: {mode: full}\nresources: {memory: null, pids: null}\n"
            + yaml.safe_dump({"options": {"packer_manifest": str(manifest),
                                          "connect_timeout": 5, **options}}))
    return write_profile(folder, name, body)


def leased_ports(home: Path) -> list[int]:
    path = home / "ssh-leases.db"
    if not path.exists():
        return []
    with sqlite3.connect(path) as conn:
        return sorted(int(r[0].rsplit(":", 1)[1]) for r in conn.execute(
            "SELECT address FROM ssh_leases"))


def test_the_last_runs_build_is_leased_and_reached(sbx, sshd_server, tmp_path):  # noqa: F811
    old, last = str(uuid.uuid4()), str(uuid.uuid4())
    first, second, third = sshd_server.ports
    manifest = write_manifest(tmp_path / "packer-manifest.json", [
        build(sshd_server, "ci-runner", first, old),
        build(sshd_server, "ci-runner", second, last, pool="ci"),
        build(sshd_server, "database", third, last),
    ], last)
    profile = packer_profile(tmp_path, manifest, build="ci-runner")
    box = sbx.create("--profile-file", str(profile))
    assert (box["backend"], box["state"]) == ("ssh", "running")
    assert box["backend_ref"] == f"ci-runner/{box['id']}"
    assert leased_ports(sbx.home) == [second]  # the last run's ci-runner, not the old one's
    ran = sbx("exec", box["id"], "--", "sh", "-c", "echo over ssh; exit 3")
    assert (ran.code, ran.out) == (3, "over ssh\n"), ran.err
    assert sbx("destroy", "--yes", box["id"]).code == 0
    assert leased_ports(sbx.home) == []
    # a named run, and custom_data's other keys as labels for match:
    earlier = packer_profile(tmp_path, manifest, "earlier", build="ci-runner", packer_run=old)
    box = sbx.create("--profile-file", str(earlier))
    assert leased_ports(sbx.home) == [first]
    assert sbx("destroy", "--yes", box["id"]).code == 0
    matched = packer_profile(tmp_path, manifest, "matched", match={"pool": "ci",
                                                                  "builder_type": "qemu"})
    box = sbx.create("--profile-file", str(matched))
    assert leased_ports(sbx.home) == [second]
    assert sbx("destroy", "--yes", box["id"]).code == 0


def test_a_changed_manifest_is_read_again_and_a_host_that_left_is_not_leased(
        sbx, sshd_server, tmp_path):  # noqa: F811
    first, second, _ = sshd_server.ports
    run_1, run_2 = str(uuid.uuid4()), str(uuid.uuid4())
    manifest = tmp_path / "packer-manifest.json"
    write_manifest(manifest, [build(sshd_server, "vm", first, run_1)], run_1)
    profile = packer_profile(tmp_path, manifest, build="vm")
    one = sbx.create("--profile-file", str(profile))
    assert leased_ports(sbx.home) == [first]
    # Packer ran again (with -force: the manifest holds only the new run), on another host
    write_manifest(manifest, [build(sshd_server, "vm", second, run_2)], run_2)
    assert sbx("destroy", "--yes", one["id"]).code == 0  # the first host is free again...
    two = sbx.create("--profile-file", str(profile))
    assert leased_ports(sbx.home) == [second]  # ...but it left the manifest: not leased
    taken = sbx("create", "--profile-file", str(profile))
    assert taken.code == 1 and "no free ssh host: all 1 host(s)" in taken.err, taken.err
    assert f"packer manifest {manifest}" in taken.err and two["id"] in taken.err
    assert leased_ports(sbx.home) == [second]


@pytest.mark.parametrize(("content", "options", "said"), [
    ("{not json", {"build": "vm"}, "not JSON"),
    ('{"builds": {}}', {"build": "vm"}, "expected the manifest post-processor's JSON"),
    ("RUN", {"build": "web"}, "has no build named 'web' (its builds: vm)"),
    ("RUN", {"build": "vm", "packer_run": "0f0f0f0f"}, "no build of run 0f0f0f0f (runs: "),
    ("NOHOST", {"build": "vm"}, "build #1 ('vm'): custom_data has no host"),
    ("BADPORT", {"build": "vm"}, "build #1 ('vm'): port must be a number from 1 to 65535"),
    ("RUN", {"build": "vm", "inventory": "hosts.yaml"}, "give inventory or packer_manifest"),
    ("RUN", {"build": 3}, "options.build must be a build name"),
])
def test_a_bad_manifest_is_refused_naming_what_is_wrong_and_nothing_is_written(
        sbx, sshd_server, tmp_path, content, options, said):  # noqa: F811
    run = str(uuid.uuid4())
    entry = build(sshd_server, "vm", sshd_server.port, run)
    if content == "NOHOST":
        del entry["custom_data"]["host"]
    if content == "BADPORT":
        entry["custom_data"]["port"] = "ssh"
    manifest = tmp_path / "packer-manifest.json"
    if content in ("RUN", "NOHOST", "BADPORT"):
        write_manifest(manifest, [entry], run)
    else:
        manifest.write_text(content)
    profile = packer_profile(tmp_path, manifest, **options)
    result = sbx("create", "--profile-file", str(profile))
    assert result.code == 2, (result.code, result.err)
    assert len(result.err.strip().splitlines()) == 1 and said in result.err, result.err
    if "inventory" not in options and options.get("build") != 3:  # else the profile is at fault
        assert str(manifest) in result.err
    assert table_rows(sbx.home, "sandboxes") == [] and table_rows(sbx.home, "events") == []
    assert leased_ports(sbx.home) == []
