"""Trusting a working folder's profiles covers every file they name: a compose file and what
it reads, an ssh inventory or Packer manifest and the key files in it. A change to any of them
after `sbx profiles trust` leaves the folder out again, with one line on stderr."""

import json
from pathlib import Path

import pytest

from sandboxer.core.rules.errors import NotFound
from sandboxer.core.rules.profiles import ProfileLoader, trust

CHANGED = "its profiles or a file they name changed since you trusted them"
COMPOSE = ("services:\n  app:\n    image: sandboxer/base:busybox\n"
           "    env_file: [app.env]\n")


def folder_of(tmp_path: Path) -> Path:
    folder = tmp_path / ".sbx" / "profiles"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def used(name: str) -> bool:
    """Whether the profile `name` is loaded from the working folder (there is no other)."""
    try:
        ProfileLoader().load(name)
    except NotFound:
        return False
    return True


def left_out(capsys, name: str) -> None:
    """The profile is not used, and stderr says once why."""
    assert not used(name)
    [line] = capsys.readouterr().err.splitlines()
    assert CHANGED in line and "sbx profiles trust" in line, line


def write_stack(folder: Path) -> None:
    """The profile `stack`, naming a compose file beside it, which names an env file."""
    (folder / "stack.yaml").write_text(
        "backend: compose\ncompose: {file: stack/compose.yaml, service: app}\n")
    (folder / "stack").mkdir()
    (folder / "stack" / "compose.yaml").write_text(COMPOSE)
    (folder / "stack" / "app.env").write_text("GREETING=hi\n")


@pytest.fixture
def stack(sbx_home, tmp_path) -> Path:
    """A working folder whose profile `stack` names a compose file beside it, which names an
    env file; the compose file's folder."""
    folder = folder_of(tmp_path)
    write_stack(folder)
    trust()
    assert used("stack")
    return folder / "stack"


def test_a_changed_compose_file_leaves_the_folder_out(stack, capsys):
    (stack / "compose.yaml").write_text(COMPOSE + "    environment: {LOOT: ${HOME}}\n")
    left_out(capsys, "stack")
    trust()  # reviewed again: used again
    assert used("stack")


def test_a_changed_env_file_leaves_the_folder_out(stack, capsys):
    (stack / "app.env").write_text("GREETING=hi\nLOOT=${AWS_SECRET_ACCESS_KEY}\n")
    left_out(capsys, "stack")


def test_an_env_file_or_dot_env_that_appears_later_leaves_the_folder_out(stack, capsys):
    (stack / ".env").write_text("HOME=/etc\n")  # Compose reads it for the file's variables
    left_out(capsys, "stack")
    trust()
    (stack / "app.env").unlink()
    left_out(capsys, "stack")


def test_files_reached_through_extends_and_secrets_count(sbx_home, tmp_path, capsys):
    folder = folder_of(tmp_path)
    (folder / "stack.yaml").write_text(
        "backend: compose\ncompose: {file: compose.yaml, service: app}\n")
    (folder / "compose.yaml").write_text(
        "services:\n  app: {extends: {file: base.yaml, service: base}}\n"
        "secrets:\n  token: {file: token.txt}\n")
    (folder / "base.yaml").write_text("services:\n  base: {image: x, env_file: base.env}\n")
    (folder / "base.env").write_text("A=1\n")
    (folder / "token.txt").write_text("t1\n")
    trust()
    assert used("stack")
    (folder / "token.txt").write_text("t2\n")
    left_out(capsys, "stack")
    trust()
    (folder / "base.env").write_text("A=${HOME}\n")  # named by the extended file
    left_out(capsys, "stack")


def test_an_inline_projects_absolute_env_file_counts(sbx_home, tmp_path, capsys):
    folder = folder_of(tmp_path)
    env_file = tmp_path / "inline.env"
    env_file.write_text("A=1\n")
    (folder / "inline.yaml").write_text(
        "backend: compose\ncompose:\n  service: app\n  project:\n    services:\n"
        f"      app: {{image: x, env_file: [{env_file}]}}\n")
    trust()
    assert used("inline")
    env_file.write_text("A=2\n")
    left_out(capsys, "inline")


def test_an_ssh_inventory_and_its_key_files_count(sbx_home, tmp_path, capsys):
    folder = folder_of(tmp_path)
    (folder / "lease.yaml").write_text("backend: ssh\noptions: {inventory: hosts/inventory.yaml}\n")
    (tmp_path / "hosts").mkdir()  # relative to the working folder, as the ssh backend reads it
    inventory = tmp_path / "hosts" / "inventory.yaml"
    inventory.write_text("hosts:\n  - {host: 127.0.0.1, key: id_test, known_hosts: known}\n")
    (tmp_path / "hosts" / "id_test").write_text("key one\n")
    (tmp_path / "hosts" / "known").write_text("127.0.0.1 ssh-ed25519 AAAA\n")
    trust()
    assert used("lease")
    (tmp_path / "hosts" / "id_test").write_text("key two\n")
    left_out(capsys, "lease")
    trust()
    (tmp_path / "hosts" / "known").write_text("127.0.0.1 ssh-ed25519 BBBB\n")
    left_out(capsys, "lease")
    trust()
    inventory.write_text("hosts:\n  - {host: 10.0.0.1, key: id_test, known_hosts: known}\n")
    left_out(capsys, "lease")


def test_a_packer_manifest_and_its_key_files_count(sbx_home, tmp_path, capsys):
    folder = folder_of(tmp_path)
    (folder / "built.yaml").write_text(
        "backend: ssh\noptions: {packer_manifest: packer-manifest.json}\n")
    manifest = tmp_path / "packer-manifest.json"
    manifest.write_text(json.dumps({"last_run_uuid": "r1", "builds": [
        {"name": "vm", "packer_run_uuid": "r1", "custom_data": {"host": "127.0.0.1",
                                                                "key": "keys/vm"}}]}))
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "vm").write_text("key one\n")
    trust()
    assert used("built")
    (tmp_path / "keys" / "vm").write_text("key two\n")
    left_out(capsys, "built")


def test_a_folder_whose_profiles_name_no_file_keeps_its_digest(sbx_home, tmp_path):
    """Trust recorded before the named files were digested stays valid for such a folder."""
    import hashlib

    folder = folder_of(tmp_path)
    body = b"backend: docker\n"
    (folder / "plain.yaml").write_bytes(body)
    digest = trust()[2]
    sha = hashlib.sha256(f"plain.yaml\0{len(body)}\0".encode() + body)
    assert digest == f"sha256:{sha.hexdigest()}"


def test_the_cli_ignores_a_trusted_profile_whose_compose_file_changed(sbx, tmp_path):
    folder = folder_of(tmp_path)
    write_stack(folder)
    assert sbx("profiles", "trust").code == 0
    shown = sbx("profiles", "show", "stack", "--json")
    assert shown.code == 0 and shown.err == "", shown.err
    (folder / "stack" / "app.env").write_text("GREETING=${HOME}\n")
    gone = sbx("profiles", "show", "stack", "--json")
    assert gone.code == 3, (gone.code, gone.err)
    lines = gone.err.strip().splitlines()
    assert any(CHANGED in line for line in lines), gone.err
    record = tmp_path / "xdg-config" / "sandboxer" / "trusted-profile-folders.json"
    assert list(json.loads(record.read_text())["folders"]) == [str(folder.resolve())]
