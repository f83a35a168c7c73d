"""Profiles: schema, search path, `extends:`, secrets by reference, errors naming file and field."""

import json
import stat
from datetime import timedelta
from pathlib import Path

import pytest

from sandboxer.core.rules.errors import BadInput, NotFound
from sandboxer.core.rules.profiles import (
    ProfileError,
    ProfileLoader,
    dump,
    search_path,
    trust,
    untrust,
)


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
    assert folders[-1] == extra
    write(folders[1], "web", "backend: docker\ndescription: user\n")
    project = tmp_path / ".sbx" / "profiles"
    write(project, "web", "backend: docker\ndescription: project\n")
    assert ProfileLoader().load("web").description == "user"  # not trusted: left out
    trust()
    assert search_path()[2] == project
    assert ProfileLoader().load("web").description == "project"
    write(extra, "web", "backend: docker\ndescription: extra\n")
    assert ProfileLoader().load("web").description == "extra"


def test_extends_merges_mappings_and_replaces_lists(sbx_home, tmp_path):
    folder = tmp_path / ".sbx" / "profiles"
    write(folder, "base", "backend: docker\nresources: {cpu: 2, pids: 100}\nsetup: [a, b]\n"
                          "env: {A: '1'}\n")
    write(folder, "child", "extends: base\nresources: {cpu: 0.5}\nsetup: [c]\nenv: {B: '2'}\n")
    trust(folder)
    child = ProfileLoader().load("child")
    assert (child.resources.cpu, child.resources.pids) == (0.5, 100)
    assert child.setup == ["c"]
    assert child.env == {"A": "1", "B": "2"}
    assert child.name == "child"


def test_a_profile_may_extend_its_own_name_further_down_the_path(sbx_home, tmp_path):
    write(tmp_path / ".sbx" / "profiles", "default", "extends: default\nttl: {default: 5m}\n")
    trust()
    profile = ProfileLoader().load("default")
    assert profile.ttl.default == timedelta(minutes=5)
    assert profile.backend == "docker" and profile.ttl.max == timedelta(hours=4)


def test_extends_cycle_is_refused(sbx_home, tmp_path):
    folder = tmp_path / ".sbx" / "profiles"
    write(folder, "a", "extends: b\nbackend: docker\n")
    write(folder, "b", "extends: a\n")
    trust(folder)
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
        ("backend: docker\ncolour: blue\n", "colour", "unknown field"),
        ("backend: docker\nimagee: x\n", "imagee", "unknown field (did you mean 'image'?)"),
        ("backend: docker\nttl: 5\n", "ttl", "should be a mapping, not 5"),
        ("backend: docker\nenv: {A: [1, 2]}\n", "env.A", "should be text, not [1, 2]"),
        ("backend: docker\nresources: {memory: lots}\n", "resources.memory",
         'should be a size such as 512m or 2g, not "lots"'),
        ("description: no backend\n", "backend", "required, not given"),
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


# -- a working folder's profiles are used only once trusted ---------------------------------

BUILTIN_DESCRIPTION = "Docker, an offline busybox image, no network; works on any Docker engine"
GREEDY = "backend: docker\ndescription: from the repository\nsecrets: {LOOT: 'env:HOME'}\n"


def test_an_untrusted_working_folder_is_ignored_with_one_line(sbx_home, tmp_path, capsys):
    folder = write(tmp_path / ".sbx" / "profiles", "default", GREEDY).parent.resolve()
    loader = ProfileLoader()
    default = loader.load("default")
    assert (default.description, default.secrets) == (BUILTIN_DESCRIPTION, {})  # the built-in
    assert loader.source("default").parent != folder
    [line] = capsys.readouterr().err.splitlines()
    assert line == (f"sbx: ignoring the profiles in {folder}: the folder is not trusted; review "
                    f"them, then run `sbx profiles trust {folder}` to use them")
    ProfileLoader().load("default")
    assert capsys.readouterr().err == ""  # said once per process
    assert not (tmp_path / "xdg-config" / "sandboxer" / "trusted-profile-folders.json").exists()


def test_a_trusted_folder_is_used_until_a_file_changes(sbx_home, tmp_path, capsys):
    path = write(tmp_path / ".sbx" / "profiles", "default", GREEDY)
    folder, names, digest = trust()
    assert (folder, names) == (path.parent.resolve(), ["default"])
    record = tmp_path / "xdg-config" / "sandboxer" / "trusted-profile-folders.json"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert json.loads(record.read_text()) == {"folders": {str(folder): digest}}
    loader = ProfileLoader()
    assert loader.load("default").description == "from the repository"
    assert loader.source("default") == folder / "default.yaml"
    assert capsys.readouterr().err == ""

    path.write_text(GREEDY.replace("HOME", "AWS_SECRET_ACCESS_KEY"))  # changed after trust
    assert ProfileLoader().load("default").description == BUILTIN_DESCRIPTION
    assert "its profiles or a file they name changed since you trusted them" in \
        capsys.readouterr().err
    write(folder, "extra", "backend: docker\n")  # a file added counts as a change too
    trust()
    write(folder, "more", "backend: docker\n")
    assert "more" not in ProfileLoader().names()

    assert untrust() == (folder, True)
    assert ProfileLoader().load("default").description == BUILTIN_DESCRIPTION
    assert untrust() == (folder, False)


def test_trusting_a_folder_that_is_missing_or_empty_is_refused_writing_nothing(sbx_home,
                                                                              tmp_path):
    with pytest.raises(BadInput, match="no such folder"):
        trust(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInput, match="holds no profiles"):
        trust(tmp_path / "empty")
    assert not (tmp_path / "xdg-config" / "sandboxer").exists()


def test_a_trust_file_others_can_write_counts_for_nothing(sbx_home, tmp_path):
    write(tmp_path / ".sbx" / "profiles", "default", GREEDY)
    trust()
    record = tmp_path / "xdg-config" / "sandboxer" / "trusted-profile-folders.json"
    record.chmod(0o666)
    assert ProfileLoader().load("default").description == BUILTIN_DESCRIPTION


def test_profiles_list_and_show_name_each_profiles_file(sbx, tmp_path):
    folder = write(tmp_path / ".sbx" / "profiles", "default", GREEDY).parent.resolve()
    builtin = sbx("profiles", "show", "default", "--json")
    assert builtin.code == 0, builtin.err
    assert builtin.json()["description"] == BUILTIN_DESCRIPTION
    assert builtin.json()["source"].endswith("/profiles/default.yaml")
    assert Path(builtin.json()["source"]).parent != folder
    [line] = builtin.err.splitlines()
    assert str(folder) in line and f"sbx profiles trust {folder}" in line

    trusted = sbx("profiles", "trust")
    assert trusted.code == 0, trusted.err
    assert trusted.out.startswith(f"trusted {folder}: default (sha256:")
    shown = sbx("profiles", "show", "default")
    assert shown.out.splitlines()[0] == f"# source: {folder / 'default.yaml'}"
    listed = sbx("profiles", "list")
    assert listed.out.splitlines()[0].split() == ["NAME", "BACKEND", "DESCRIPTION", "SOURCE"]
    row = next(r for r in listed.out.splitlines() if r.startswith("default "))
    assert row.endswith(str(folder / "default.yaml")) and "from the repository" in row
    rows = {r["name"]: r for r in sbx("profiles", "list", "--json").json()}
    assert rows["default"]["source"] == str(folder / "default.yaml")
    assert rows["e2b"]["source"].endswith("/profiles/e2b.yaml")

    assert sbx("profiles", "untrust").out.strip() == f"untrusted {folder}"
    assert sbx("profiles", "show", "default", "--json").json()["description"] == \
        BUILTIN_DESCRIPTION
    missing = sbx("profiles", "trust", str(tmp_path / "nowhere"))
    assert missing.code == 2 and len(missing.err.strip().splitlines()) == 1, missing.err


def test_the_committed_json_schema_is_the_one_sbx_prints():
    """docs/profile.schema.json is `sbx profiles schema`; a change to the profile model
    that is not committed there fails here (regenerate: sbx profiles schema > docs/...)."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    printed = subprocess.run([sys.executable, "-m", "sandboxer_tui.cli", "profiles", "schema"],
                             capture_output=True, text=True, check=True).stdout
    committed = (root / "docs" / "profile.schema.json").read_text()
    assert json.loads(printed) == json.loads(committed), (
        "docs/profile.schema.json is stale: run `sbx profiles schema > docs/profile.schema.json`")


def test_the_json_schema_accepts_the_built_in_profiles_and_refuses_a_bad_one():
    import jsonschema
    import yaml

    from sandboxer.core.rules.profiles import json_schema

    schema = json_schema()
    root = Path(__file__).resolve().parents[2]
    for path in (root / "profiles").glob("*.yaml"):
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"backend": "docker", "ttl": {"default": "soon"}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"backend": "docker", "unknown_field": 1}, schema)
