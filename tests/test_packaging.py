"""A plain (non-editable) `pip install .` gives a working `sbx` with its built-in profiles
and migrations; the fast paths import no textual, e2b or modal."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv with the project installed from its wheel (what `pip install .` builds),
    not from the work tree.
    Dependencies come from the test venv through a .pth line, to stay offline and fast."""
    base = tmp_path_factory.mktemp("plain-install")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = Path(subprocess.run(
        [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True).stdout.strip())
    (site / "zz-test-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    wheels = base / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(ROOT)], check=True, capture_output=True)
    (wheel,) = wheels.glob("sandboxer-*.whl")
    subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True)
    return venv, site


def test_plain_install_ships_profiles_and_migrations(installed, tmp_path):
    venv, site = installed
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    env.update(SBX_HOME=str(tmp_path / "home"), XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    where = subprocess.run([venv / "bin" / "python", "-c", "import core, profiles; "
                            "print(core.__file__); print(profiles.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert all(line.startswith(str(site)) for line in where.stdout.split())
    listed = subprocess.run([venv / "bin" / "sbx", "profiles", "list", "--json"], cwd=tmp_path,
                            env=env, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    assert "default" in [p["name"] for p in json.loads(listed.stdout)]
    ls = subprocess.run([venv / "bin" / "sbx", "ls", "--json"], cwd=tmp_path, env=env,
                        capture_output=True, text=True)
    assert (ls.returncode, json.loads(ls.stdout)) == (0, [])  # the migrations ran
    assert (tmp_path / "home" / "sbx.db").exists()


def _imported(args, env):
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "sandboxer_tui.cli", *args],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {line.split("|")[-1].strip() for line in proc.stderr.splitlines()
            if line.startswith("import time:")}


@pytest.mark.parametrize("args", [["--help"], ["ls"], ["ls", "--json"], ["events"], ["reap"],
                                  ["profiles", "list"]])
def test_fast_paths_import_no_textual_e2b_or_modal(args, sbx_home):
    _imported(["ls"], dict(os.environ))  # the first start migrates (and may import Alembic)
    modules = _imported(args, dict(os.environ))
    heavy = {m for m in modules if m.split(".")[0] in {"textual", "e2b", "modal"}}
    assert heavy == set()
    if args[0] in ("--help", "ls", "events"):
        assert "docker" not in modules  # no backend SDK to read the inventory
        assert "alembic" not in modules  # Alembic only when the schema is behind


def test_import_linter_contracts_hold():
    proc = subprocess.run([Path(sys.executable).parent / "lint-imports"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "0 broken" in proc.stdout
