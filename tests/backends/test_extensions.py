"""Third-party adapters: the example package in examples/sbx-tmpdir is installed with pip
(into a folder of its own, put on PYTHONPATH for the sbx subprocesses, so the shared venv is
not changed), found by its entry point, passes the conformance kit and works through the CLI.
A package whose adapter cannot be imported is reported by `sbx doctor` and skipped; every
other command still works. SBX_ADAPTERS limits which adapters load at all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, RUN_LABEL, write_profile

EXAMPLE = ROOT / "examples" / "sbx-tmpdir"


def fake_distribution(folder: Path, dist: str, entry_points: dict[str, str],
                      modules: dict[str, str]) -> Path:
    """An installed distribution as pip leaves one (a .dist-info with entry_points.txt, and
    its modules) in `folder`, which goes on PYTHONPATH."""
    folder.mkdir(parents=True, exist_ok=True)
    info = folder / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[sandboxer.adapters]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    for name, source in modules.items():
        (folder / f"{name}.py").write_text(source)
    return folder


@pytest.fixture(scope="module")
def plugins(tmp_path_factory) -> dict[str, Path]:
    """The example package installed with pip into a folder of its own (from a copy, so the
    build leaves nothing in the repository), and two hand-made distributions: one whose
    adapter cannot be imported, one that tries to take the name `docker`."""
    base = tmp_path_factory.mktemp("plugins")
    source = base / "source"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                                   "__pycache__"))
    installed = base / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(installed), str(source)],
                   check=True, capture_output=True, timeout=120)
    broken = fake_distribution(base / "broken", "sbx-broken", {"broken": "sbx_broken:Adapter"}, {
        "sbx_broken": "raise ImportError('sbx_broken needs libfrobnicate, which is not installed')\n",
    })
    usurper = fake_distribution(base / "usurper", "sbx-usurper", {"docker": "sbx_usurper:Docker"}, {
        "sbx_usurper": "raise RuntimeError('a plugin must never replace a built-in adapter')\n",
    })
    return {"source": source, "installed": installed, "broken": broken, "usurper": usurper}


def with_path(*folders: Path, **extra: str) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(str(f) for f in folders), **extra}


def doctor(sbx, env: dict[str, str]) -> dict:
    result = sbx("doctor", "--json", env=env)
    assert result.code == 0, result.err or result.out
    return result.json()


def by_name(report: dict) -> dict[str, dict]:
    return {b["name"]: b for b in report["backends"]}


TMPDIR_PROFILE = (
    "backend: tmpdir\n"
    "network: {mode: full}\n"
    "resources: {memory: null, pids: null}\n"
)


# -- the example package --------------------------------------------------------------------


def test_the_example_package_is_found_by_its_entry_point_and_listed_by_doctor(sbx, plugins):
    env = with_path(plugins["installed"])
    backends = by_name(doctor(sbx, env))
    tmpdir = backends["tmpdir"]
    assert tmpdir["loaded"] and tmpdir["reachable"] and tmpdir["credentials"]
    assert tmpdir["target"] == "sbx_tmpdir:TmpdirAdapter"
    assert tmpdir["package"] == "sbx-tmpdir"
    assert tmpdir["capabilities"] == ["exec", "files"]
    human = sbx("doctor", env=env)
    assert human.code == 0
    assert any(line.split()[0] == "tmpdir" and "ok" in line.split() for line in
               human.out.splitlines() if line.startswith("  ")), human.out
    # and without the package on the path, sbx has no such backend
    assert "tmpdir" not in by_name(doctor(sbx, {}))


def test_the_example_package_passes_the_conformance_kit(plugins, tmp_path):
    """The package's own test module (the kit in a dozen lines), run as its authors would,
    against the installed copy."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(plugins["source"] / "tests")],
        cwd=plugins["source"], env={**os.environ, **with_path(plugins["installed"])},
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "failed" not in summary and "error" not in summary, summary
    assert "test_is_registered_by_entry_point" not in result.stdout  # passed, not skipped


def test_a_third_party_backend_works_through_the_cli(sbx, plugins, tmp_path):
    env = with_path(plugins["installed"], SBX_TMPDIR_ROOT=str(tmp_path / "boxes"))
    profile = write_profile(tmp_path, "local", TMPDIR_PROFILE)
    box = sbx.create("--profile-file", str(profile), "--label", "team=ext", env=env)
    assert (box["backend"], box["state"]) == ("tmpdir", "running")
    folder = tmp_path / "boxes" / box["backend_ref"]
    assert folder.is_dir()

    ran = sbx("exec", box["id"], "--", "sh", "-c", "echo made-here > f; pwd; exit 3", env=env)
    assert ran.code == 3
    assert ran.out.strip() == str(folder / "work")
    assert (folder / "work" / "f").read_text() == "made-here\n"

    listed = sbx("ls", "--backend", "tmpdir", "--json", env=env).json()
    assert [b["id"] for b in listed] == [box["id"]]
    assert sbx("reconcile", "--json", env=env).code == 0  # its labels let reconcile find it
    assert sbx("show", box["id"], "--json", env=env).json()["state"] == "running"

    assert sbx("destroy", box["id"], "--yes", env=env).code == 0
    assert not folder.exists()


def test_a_backend_refuses_what_it_cannot_enforce_before_anything_is_written(sbx, plugins,
                                                                             tmp_path):
    env = with_path(plugins["installed"], SBX_TMPDIR_ROOT=str(tmp_path / "boxes"))
    profile = write_profile(tmp_path, "walled", "backend: tmpdir\n"
                            "resources: {memory: null, pids: null}\n")  # network: none
    result = sbx("create", "--profile-file", str(profile), env=env)
    assert result.code == 4, result.err
    assert "cannot restrict the network" in result.err
    assert sbx("ls", "--all", "--json", env=env).json() == []


@pytest.mark.parametrize("field, value", [("read_only", "true"), ("user", "'1000'")])
def test_hardening_a_third_party_backend_knows_nothing_of_is_refused(sbx, plugins, tmp_path,
                                                                     field, value):
    """The example adapter was written before `read_only` and `user` existed: it does not
    declare them, so the core refuses them rather than let them be ignored."""
    env = with_path(plugins["installed"], SBX_TMPDIR_ROOT=str(tmp_path / "boxes"))
    profile = write_profile(tmp_path, "hardened", f"{TMPDIR_PROFILE}{field}: {value}\n")
    result = sbx("create", "--profile-file", str(profile), env=env)
    assert result.code == 4, result.err
    assert result.err.startswith(f"sbx: the tmpdir backend cannot enforce {field};"), result.err
    assert sbx("ls", "--all", "--json", env=env).json() == []
    assert not (tmp_path / "boxes").exists() or not any((tmp_path / "boxes").iterdir())


# -- a broken adapter -----------------------------------------------------------------------


def test_a_broken_adapter_is_reported_by_doctor_and_skipped(sbx, plugins):
    env = with_path(plugins["installed"], plugins["broken"])
    report = doctor(sbx, env)
    backends = by_name(report)
    broken = backends["broken"]
    assert broken["loaded"] is False
    assert "ImportError" in broken["error"] and "libfrobnicate" in broken["error"]
    assert broken["package"] == "sbx-broken"
    # every other adapter is still there and loaded
    assert {"docker", "stub", "ssh", "tmpdir"} <= {n for n, b in backends.items() if b["loaded"]}
    human = sbx("doctor", env=env)
    assert human.code == 0
    assert any("broken" in line and "NOT LOADED" in line and "libfrobnicate" in line
               for line in human.out.splitlines()), human.out


def test_every_other_command_works_beside_a_broken_adapter(sbx, plugins, tmp_path):
    env = with_path(plugins["installed"], plugins["broken"],
                    SBX_TMPDIR_ROOT=str(tmp_path / "boxes"))
    assert sbx("--help", env=env).code == 0
    assert sbx("ls", "--json", env=env).code == 0
    assert sbx("profiles", "list", "--json", env=env).code == 0
    box = sbx.create("--profile-file", str(write_profile(tmp_path, "local", TMPDIR_PROFILE)),
                     env=env)
    assert sbx("exec", box["id"], "--", "true", env=env).code == 0
    assert sbx("show", box["id"], "--json", env=env).code == 0
    assert sbx("events", box["id"], "--json", env=env).code == 0
    assert sbx("destroy", box["id"], "--yes", env=env).code == 0


def test_reap_and_reconcile_work_beside_a_broken_adapter(sbx, plugins, tmp_path):
    env = with_path(plugins["installed"], plugins["broken"],
                    SBX_TMPDIR_ROOT=str(tmp_path / "boxes"))
    box = sbx.create("--profile-file", str(write_profile(tmp_path, "local", TMPDIR_PROFILE)),
                     env=env)
    for command in ("reap", "reconcile"):
        result = sbx(command, "--json", env=env)
        assert result.code == 0, f"sbx {command}: {result.out} {result.err}"
    assert sbx("show", box["id"], "--json", env=env).json()["state"] == "running"
    expired = sbx("reap", "--json", env={**env, "SBX_CLOCK_OFFSET": "2h"})
    assert expired.code == 0 and expired.json()["destroyed"] == [box["id"]], expired.out


def test_a_profile_on_the_broken_backend_fails_with_exit_5_naming_it(sbx, plugins, tmp_path):
    env = with_path(plugins["broken"])
    profile = write_profile(tmp_path, "onbroken", "backend: broken\n")
    result = sbx("create", "--profile-file", str(profile), "--label", RUN_LABEL, env=env)
    assert result.code == 5, result.err
    assert "broken" in result.err and "libfrobnicate" in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert sbx("ls", "--all", "--json", env=env).json() == []


def test_a_plugin_cannot_take_the_name_of_a_built_in_adapter(sbx, plugins):
    report = doctor(sbx, with_path(plugins["usurper"]))
    docker = by_name(report)["docker"]
    assert docker["target"] == "sandboxer.adapters.docker:DockerAdapter"
    assert docker["package"] == "sandboxer"
    assert docker["loaded"], docker
    assert report["adapters"]["shadowed"] == {"docker": ["sbx_usurper:Docker (sbx-usurper)"]}


# -- SBX_ADAPTERS ---------------------------------------------------------------------------


def test_sbx_adapters_limits_which_adapters_load(sbx, plugins, tmp_path):
    env = with_path(plugins["installed"], plugins["broken"], SBX_ADAPTERS="stub, tmpdir")
    report = doctor(sbx, env)
    # only those two: the broken one is not even imported, so there is nothing to report
    assert [b["name"] for b in report["backends"]] == ["stub", "tmpdir"]
    assert report["adapters"]["selected"] == ["stub", "tmpdir"]
    assert report["adapters"]["unknown"] == []

    # a backend left out is unknown to this process: its profiles are refused (exit 2)
    refused = sbx("create", "--profile", "default", env=env)
    assert refused.code == 2, refused.err
    assert "docker" in refused.err
    assert sbx("ls", "--all", "--json", env=env).json() == []

    # one that is in the list works
    box = sbx.create("--profile-file", str(write_profile(tmp_path, "local", TMPDIR_PROFILE)),
                     env={**env, "SBX_TMPDIR_ROOT": str(tmp_path / "boxes")})
    assert box["backend"] == "tmpdir"
    assert sbx("destroy", box["id"], "--yes",
               env={**env, "SBX_TMPDIR_ROOT": str(tmp_path / "boxes")}).code == 0


def test_sbx_adapters_naming_an_adapter_nobody_installed_is_reported(sbx):
    report = doctor(sbx, {"SBX_ADAPTERS": "docker,nosuch"})
    assert [b["name"] for b in report["backends"]] == ["docker"]
    assert report["adapters"]["unknown"] == ["nosuch"]


# -- the documentation ----------------------------------------------------------------------


def code_blocks(markdown: str, language: str) -> list[str]:
    blocks, inside, lines = [], False, []
    for line in markdown.splitlines():
        if not inside and line.strip() == f"```{language}":
            inside, lines = True, []
        elif inside and line.strip() == "```":
            inside = False
            blocks.append("\n".join(lines) + "\n")
        elif inside:
            lines.append(line)
    return blocks


def test_the_minimal_adapter_in_the_docs_passes_the_kit(tmp_path):
    """docs/adapters.md shows a complete adapter, its entry point and its kit test: the page's
    own code, registered as its toml says, passes the kit."""
    doc = (ROOT / "docs" / "adapters.md").read_text()
    adapter_source, kit_source = code_blocks(doc, "python")[:2]
    toml = code_blocks(doc, "toml")[0]
    entry = next(line for line in toml.splitlines() if line.startswith("folder = "))
    site = fake_distribution(tmp_path / "site", "sbx-folder",
                             {"folder": entry.split("=", 1)[1].strip().strip('"')},
                             {"sbx_folder": adapter_source})
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_folder_conformance.py").write_text(kit_source)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)],
        cwd=tmp_path, env={**os.environ, **with_path(site)},
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "skipped" not in summary, summary  # all of them ran
    assert "failed" not in summary and "error" not in summary, summary
