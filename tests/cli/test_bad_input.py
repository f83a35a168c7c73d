"""Bad input gets a clear one-line error and changes nothing (docs/reliability.md, guarantee 14).

Each case runs the real `sbx` against an installation that already has a real sandbox (and a
destroyed one), snapshots the database rows and this installation's containers on the engine,
runs the bad command, and checks: the exit code from docs/cli.md, one line on stderr naming the
offending thing, and an identical snapshot afterwards.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import RUN_LABEL, containers_of, install_id_of, table_rows

pytestmark = pytest.mark.docker


# -- the snapshot of "everything that could change" ----------------------------------------


def snapshot(home: Path, docker_api) -> dict:
    install = install_id_of(home)
    containers = sorted(c["Id"] for c in containers_of(docker_api, install)) if install else []
    return {
        "sandboxes": table_rows(home, "sandboxes"),
        "events": table_rows(home, "events"),
        "containers": containers,
    }


# -- the cases ------------------------------------------------------------------------------


@dataclass
class Case:
    argv: list[str]
    code: int
    mentions: list[str]  # what the message must name (file, field, value)
    files: dict[str, str] = field(default_factory=dict)
    lines: int = 1  # lines expected on stderr
    never: list[str] = field(default_factory=list)  # what must never be printed


def profile_case(name: str, body: str, *mentions: str, **kw) -> Case:
    file = f"{name}.yaml"
    return Case(["create", "--profile-file", file], 2, [file, *mentions], {file: body}, **kw)


GOOD = "backend: docker\nimage: sandboxer/base:busybox\n"

CASES: dict[str, Case] = {
    "unknown-profile": Case(["create", "--profile", "nope"], 3, ["nope"]),
    "unknown-backend": profile_case("bad-backend", "backend: nope\n", "backend", "nope"),
    "invalid-yaml": profile_case("broken", "backend: docker\nimage: [unclosed\n"),
    "wrong-type-memory": profile_case(
        "mem-list", "backend: docker\nresources:\n  memory: [1]\n", "resources.memory"),
    "wrong-type-ttl": profile_case(
        "ttl-int", "backend: docker\nttl:\n  default: 5\n", "ttl.default"),
    "unknown-field": profile_case("extra", "backend: docker\nbogus_field: 1\n", "bogus_field"),
    "default-over-max": profile_case(
        "over", "backend: docker\nttl:\n  default: 5h\n  max: 1h\n", "ttl", "5h", "1h"),
    "secret-as-value": profile_case(
        "leaky", "backend: docker\nsecrets:\n  API_TOKEN: hunter2-s3cr3t\n",
        "secrets", "API_TOKEN", never=["hunter2-s3cr3t"]),
    "ttl-zero": Case(["create", "--ttl", "0s"], 2, ["--ttl", "'0s'"]),
    "ttl-negative": Case(["create", "--ttl", "-5m"], 2, ["--ttl", "'-5m'"]),
    "ttl-word": Case(["create", "--ttl", "abc"], 2, ["--ttl", "'abc'"]),
    "ttl-unit": Case(["create", "--ttl", "1x"], 2, ["--ttl", "'1x'"]),
    "ttl-empty": Case(["create", "--ttl", ""], 2, ["--ttl"]),
    "ttl-over-profile-max": Case(["create", "--ttl", "5h"], 2, ["5h", "default", "4h"]),
    "label-no-equals": Case(["create", "--label", "noequals"], 2, ["noequals"]),
    # the bytes b"caf\xe9" (Latin-1), as Python receives them: refused, not a crash (exit 1)
    "id-not-utf8": Case(["show", "caf\udce9"], 2, ["'caf\\udce9'", "not UTF-8"]),
    "label-upper": Case(["create", "--label", "Bad=1"], 2, ["Bad"]),
    "label-reserved": Case(["create", "--label", "sbx.id=x"], 2, ["sbx.id"]),
    "label-dash": Case(["create", "--label", "-x=1"], 2, ["-x"]),
    "name-bad": Case(["create", "--name", "no spaces"], 2, ["no spaces"]),
    "both-profile-options": Case(
        ["create", "--profile", "default", "--profile-file", "good.yaml"], 2,
        ["--profile", "--profile-file"], {"good.yaml": GOOD}),
    "show-unknown": Case(["show", "sbx-zzzzzzzz"], 3, ["sbx-zzzzzzzz"]),
    "exec-unknown": Case(["exec", "sbx-zzzzzzzz", "--", "sh", "-c", "echo"], 3,
                         ["sbx-zzzzzzzz"]),
    "destroy-unknown": Case(["destroy", "sbx-zzzzzzzz"], 3, ["sbx-zzzzzzzz"]),
    "destroy-one-unknown-of-two": Case(["destroy", "{live}", "sbx-zzzzzzzz"], 3,
                                       ["sbx-zzzzzzzz"]),
    "logs-unknown": Case(["logs", "sbx-zzzzzzzz"], 3, ["sbx-zzzzzzzz"]),
    "exec-bad-timeout": Case(["exec", "{live}", "--timeout", "soon", "--", "sh", "-c", "echo"],
                             2, ["--timeout", "soon"]),
    "exec-in-destroyed": Case(["exec", "{destroyed}", "--", "sh", "-c", "echo"], 4,
                              ["{destroyed}", "destroyed"]),
    "logs-of-destroyed": Case(["logs", "{destroyed}"], 4, ["{destroyed}", "destroyed"]),
    "validate-two-bad": Case(
        ["profiles", "validate", "first-bad.yaml", "second-bad.yaml"], 2,
        ["first-bad.yaml", "second-bad.yaml", "backend", "bogus_field"],
        {"first-bad.yaml": "backend: nope\n", "second-bad.yaml": "backend: docker\nbogus_field: 1\n"},
        lines=2),
    "unknown-flag": Case(["create", "--bogus"], 2, ["--bogus"]),
    "ls-unknown-state": Case(["ls", "--state", "sleeping"], 2, ["sleeping"]),
}


def make_world(sbx, case: Case) -> dict[str, str]:
    """A live sandbox, so that "unchanged" means something; a destroyed one when needed."""
    world = {"live": sbx.create()["id"]}
    if any("{destroyed}" in a for a in case.argv):
        world["destroyed"] = sbx.create()["id"]
        assert sbx("destroy", world["destroyed"]).code == 0
    return world


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_refused_with_one_line_and_changes_nothing(name, sbx, docker_api, tmp_path):
    case = CASES[name]
    world = make_world(sbx, case)
    for file, body in case.files.items():
        (tmp_path / file).write_text(body)
    argv = [a.format(**world) for a in case.argv]
    before = snapshot(sbx.home, docker_api)
    assert before["sandboxes"] and before["events"] and before["containers"], before

    result = sbx(*argv)

    assert result.code == case.code, (result.code, result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == case.lines, f"expected {case.lines} line(s) on stderr:\n{result.err}"
    for mention in case.mentions:
        mention = mention.format(**world)
        assert mention in result.err, f"{mention!r} not named in: {result.err}"
    for secret in case.never:
        assert secret not in result.err + result.out
    assert snapshot(sbx.home, docker_api) == before


# `read_only:` and `user:` (Docker hardening): a bad value is exit 2 naming the field; a
# backend that cannot enforce them refuses them (exit 4), whoever wrote its adapter
HARDENING_REFUSED = [
    (GOOD + "read_only: 'yes'\n", 2, ["read_only: ", "should be true or false"]),
    (GOOD + "read_only: maybe\n", 2, ["read_only: ", "should be true or false"]),
    (GOOD + "user: 'root; rm -rf /'\n", 2, ["user: 'root; rm -rf /' is not a user"]),
    (GOOD + "user: -1\n", 2, ["user: '-1' is not a user"]),
    (GOOD + "user: ''\n", 2, ["user: '' is not a user"]),
    (GOOD + "user: a:b:c\n", 2, ["user: 'a:b:c' is not a user"]),
    (GOOD + "user: 4294967295\n", 2, ["user: '4294967295' is not a user"]),  # past the top uid
    (GOOD + "user: true\n", 2, ["user: True is not a user"]),
    (GOOD + "user: [1000]\n", 2, ["user: [1000] is not a user"]),
    *[(f"backend: {backend}\n{field}: {value}\n", 4,
       [f"the {backend} backend cannot enforce {field}"])
      for backend in ("e2b", "modal", "ssh")
      for field, value in (("read_only", "true"), ("user", "'1000'"))],
]


def test_bad_or_unenforceable_hardening_is_refused_and_changes_nothing(sbx, docker_api,
                                                                       tmp_path):
    sbx.create()
    before = snapshot(sbx.home, docker_api)
    for index, (body, code, mentions) in enumerate(HARDENING_REFUSED):
        file = tmp_path / f"hardening-{index}.yaml"
        file.write_text(body)
        result = sbx("create", "--profile-file", str(file))
        assert result.code == code, (body, result.code, result.err)
        assert len(result.err.strip().splitlines()) == 1, (body, result.err)
        for mention in mentions:
            assert mention in result.err, (body, mention, result.err)
        assert snapshot(sbx.home, docker_api) == before, body


def test_validate_names_each_problem_on_its_own_line(sbx, tmp_path):
    (tmp_path / "a.yaml").write_text("backend: nope\n")
    (tmp_path / "b.yaml").write_text("backend: docker\nresources:\n  memory: [1]\n")
    result = sbx("profiles", "validate", "a.yaml", "b.yaml")
    assert result.code == 2
    lines = result.err.strip().splitlines()
    assert len(lines) == 2, result.err
    assert "a.yaml" in lines[0] and "backend" in lines[0]
    assert "b.yaml" in lines[1] and "resources.memory" in lines[1]


def test_validate_good_file_exits_0(sbx, tmp_path):
    (tmp_path / "fine.yaml").write_text(GOOD)
    result = sbx("profiles", "validate", "fine.yaml")
    assert result.code == 0, result.err
    assert result.err == ""
    assert "fine.yaml" in result.out


def test_validate_mixed_files_exits_2_naming_only_the_bad_one(sbx, tmp_path):
    (tmp_path / "fine.yaml").write_text(GOOD)
    (tmp_path / "bad.yaml").write_text("backend: docker\nttl:\n  default: 5\n")
    result = sbx("profiles", "validate", "fine.yaml", "bad.yaml")
    assert result.code == 2
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert "bad.yaml" in lines[0] and "ttl.default" in lines[0]
    assert "fine.yaml" not in result.err


def test_bad_input_on_a_fresh_installation_writes_nothing(sbx, docker_api):
    """Before any sandbox exists, a refused create leaves no sandbox, event or container."""
    for argv in (["create", "--ttl", "abc"], ["create", "--label", "Bad=1"],
                 ["create", "--profile", "nope"], ["create", "--ttl", "5h"]):
        result = sbx(*argv)
        assert result.code in (2, 3), (argv, result.err)
        assert snapshot(sbx.home, docker_api) == {"sandboxes": [], "events": [], "containers": []}


# -- the state folder ------------------------------------------------------------------------

NOBODY = 65534


def spoil_state_folder(home: Path, how: str) -> str:
    """Make `home` a state folder sbx must refuse; what the refusal must say."""
    if how == "file":
        home.write_text("not a folder\n")
        return f"state folder {home} is not a folder"
    home.mkdir(mode=0o700)
    if how == "group-writable":
        home.chmod(0o770)
        return (f"state folder {home} is writable by group or others (mode 0770); "
                f"run chmod go-w {home}")
    if how == "others-writable":
        home.chmod(0o702)
        return (f"state folder {home} is writable by group or others (mode 0702); "
                f"run chmod go-w {home}")
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root (the suite runs as root)")
    os.chown(home, NOBODY, -1)
    return f"state folder {home} is owned by uid {NOBODY}, not by you (uid 0)"


def contents(home: Path) -> object:
    return home.read_bytes() if home.is_file() else sorted(p.name for p in home.iterdir())


@pytest.mark.parametrize("how", ["group-writable", "others-writable", "another-owner", "file"])
def test_a_state_folder_others_can_write_to_is_refused_before_anything_is_written(
        how, sbx, docker_api):
    """Anyone who can write to SBX_HOME can plant the socket every command hands its
    environment and terminal to, or the files sbx trusts: such a folder is refused with one
    line naming it and what is wrong (exit 2), and nothing is written in it."""
    says = spoil_state_folder(sbx.home, how)
    before = contents(sbx.home), run_containers(docker_api)
    for argv in (["ls"], ["create", "--label", RUN_LABEL], ["server", "start"], ["reap"],
                 ["ls", "--json"]):
        result = sbx(*argv)
        assert result.code == 2, (argv, result.code, result.err)
        if argv[-1] == "--json":
            assert result.json()["error"]["message"] == says and result.err == ""
        else:
            assert result.err.splitlines() == [f"sbx: {says}"], (argv, result.err)
        assert (contents(sbx.home), run_containers(docker_api)) == before, argv


def run_containers(docker_api) -> list[str]:
    return sorted(c["Id"] for c in docker_api.containers(all=True,
                                                         filters={"label": [RUN_LABEL]}))


def test_a_link_planted_at_the_install_id_is_refused_not_followed(sbx, tmp_path):
    """install-id names every backend object of the installation; a link there would let
    whoever planted it choose which objects `sbx reap --orphans` takes for ours."""
    sbx.home.mkdir(mode=0o700)
    planted = tmp_path / "planted-id"
    planted.write_text("inst-01plantedplantedplantedpl\n")
    (sbx.home / "install-id").symlink_to(planted)
    result = sbx("ls")
    assert result.code == 2, result.err
    assert result.err.splitlines() == [
        f"sbx: {sbx.home / 'install-id'} is a symbolic link; sbx does not follow links in its "
        "state folder (remove it)"]
    assert (sbx.home / "install-id").is_symlink()
    assert planted.read_text() == "inst-01plantedplantedplantedpl\n"


def test_validate_applies_the_rules_create_applies_backend_included(sbx, tmp_path, docker_api):
    """A profile its backend cannot honour (egress filtering on Docker) fails validation with
    the line create gives, instead of passing validation and failing at create."""
    (tmp_path / "egress.yaml").write_text("name: egress\nbackend: docker\nnetwork:\n  mode: egress\n")
    checked = sbx("profiles", "validate", "egress.yaml")
    assert checked.code == 2, checked.out
    assert checked.err.strip().splitlines() == [
        "egress.yaml: profile 'egress': the docker backend cannot restrict egress (network "
        "mode 'egress'); use 'none' or 'full'"]
    before = snapshot(sbx.home, docker_api)
    made = sbx("create", "--profile-file", "egress.yaml", "--label", RUN_LABEL)
    assert made.code == 4 and "cannot restrict egress" in made.err
    assert snapshot(sbx.home, docker_api) == before
