"""Profiles: schema, search path, `extends:`, secrets by reference, errors naming file and field."""

from datetime import timedelta
from pathlib import Path

import pytest

from core.errors import NotFound
from core.profiles import ProfileError, ProfileLoader, dump, search_path


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def test_builtin_default_profile(sbx_home):
    profile = ProfileLoader().load("default")
    assert profile.backend == "docker"
    assert profile.network.mode == "none"
    assert profile.resources.cpu == 1
    assert profile.resources.memory == 512 * 1024**2
    assert profile.resources.pids == 256
    assert profile.ttl.default == timedelta(minutes=30)
    assert profile.ttl.max == timedelta(hours=4)
    assert dump(profile)["ttl"] == {"default": "30m", "max": "4h", "idle": None}


def test_search_path_order_and_override(sbx_home, tmp_path, monkeypatch):
    extra = tmp_path / "extra"
    monkeypatch.setenv("SBX_PROFILE_PATH", str(extra))
    folders = search_path()
    assert folders[1] == tmp_path / "xdg-config" / "sandboxer" / "profiles"
    assert folders[2] == tmp_path / ".sbx" / "profiles"
    assert folders[-1] == extra
    write(folders[1], "web", "backend: docker\ndescription: user\n")
    write(folders[2], "web", "backend: docker\ndescription: project\n")
    assert ProfileLoader().load("web").description == "project"
    write(extra, "web", "backend: docker\ndescription: extra\n")
    assert ProfileLoader().load("web").description == "extra"


def test_extends_merges_mappings_and_replaces_lists(sbx_home, tmp_path):
    folder = tmp_path / ".sbx" / "profiles"
    write(folder, "base", "backend: docker\nresources: {cpu: 2, pids: 100}\nsetup: [a, b]\n"
                          "env: {A: '1'}\n")
    write(folder, "child", "extends: base\nresources: {cpu: 0.5}\nsetup: [c]\nenv: {B: '2'}\n")
    child = ProfileLoader().load("child")
    assert (child.resources.cpu, child.resources.pids) == (0.5, 100)
    assert child.setup == ["c"]
    assert child.env == {"A": "1", "B": "2"}
    assert child.name == "child"


def test_a_profile_may_extend_its_own_name_further_down_the_path(sbx_home, tmp_path):
    write(tmp_path / ".sbx" / "profiles", "default", "extends: default\nttl: {default: 5m}\n")
    profile = ProfileLoader().load("default")
    assert profile.ttl.default == timedelta(minutes=5)
    assert profile.backend == "docker" and profile.ttl.max == timedelta(hours=4)


def test_extends_cycle_is_refused(sbx_home, tmp_path):
    folder = tmp_path / ".sbx" / "profiles"
    write(folder, "a", "extends: b\nbackend: docker\n")
    write(folder, "b", "extends: a\n")
    with pytest.raises(ProfileError, match="cycle a -> b -> a"):
        ProfileLoader().load("a")


def test_unknown_profile_is_not_found(sbx_home):
    with pytest.raises(NotFound, match="no profile named 'nope'"):
        ProfileLoader().load("nope")


@pytest.mark.parametrize(
    ("text", "field", "why"),
    [
        ("backend: nowhere\n", "backend", "unknown backend 'nowhere'"),
        ("backend: docker\nresources: {memory: [1]}\n", "resources.memory", ""),
        ("backend: docker\nttl: {default: 0s}\n", "ttl.default", "longer than zero"),
        ("backend: docker\nttl: {default: abc}\n", "ttl.default", "bad duration"),
        ("backend: docker\nttl: {default: 5h}\n", "ttl", "longer than max"),
        ("backend: docker\nsecrets: {TOKEN: hunter2}\n", "secrets", "never the value"),
        ("backend: docker\nlabels: {sbx.x: y}\n", "labels", "reserved"),
        ("backend: docker\nnetwork: {mode: none, allow: [10.0.0.0/8]}\n", "network", "egress"),
        ("backend: docker\ncolour: blue\n", "colour", "Extra inputs"),
        ("description: no backend\n", "backend", "Field required"),
    ],
)
def test_bad_profile_names_file_field_and_reason(sbx_home, tmp_path, text, field, why):
    path = write(tmp_path, "bad", text)
    with pytest.raises(ProfileError) as caught:
        ProfileLoader().load_file(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: {field}")
    assert why in message


def test_invalid_yaml_names_the_file_and_line(sbx_home, tmp_path):
    path = write(tmp_path, "broken", "backend: docker\nresources: {cpu: 1\n")
    with pytest.raises(ProfileError, match=rf"{path}: line \d+: invalid YAML"):
        ProfileLoader().load_file(path)


def test_secrets_stay_references(sbx_home, tmp_path, monkeypatch):
    monkeypatch.setenv("MY_TOKEN", "s3cret-value")
    path = write(tmp_path, "withsecret", "backend: docker\nsecrets: {TOKEN: 'env:MY_TOKEN'}\n")
    data = dump(ProfileLoader().load_file(path))
    assert data["secrets"] == {"TOKEN": "env:MY_TOKEN"}
    assert "s3cret-value" not in repr(data)
