"""A plain (non-editable) `pip install .` gives a working `sbx`: the dashboard with its
stylesheet, the built-in profiles, the migrations, and the conformance kit behind the
`testing` extra; the fast paths import no textual, e2b or modal."""

import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.tmux

ROOT = Path(__file__).resolve().parents[2]
# Not shared with the installed venv: the project itself (the editable install's entries)
# and pytest, which only the `testing` extra brings.
NOT_SHARED = ("__editable__", "sandboxer", "pytest", "_pytest", "py.py", "__pycache__")
SOURCE_ONLY = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                     "__pycache__", ".pytest_cache", ".ruff_cache", ".sbx")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv with the project installed from its wheel (what `pip install .` builds),
    built from a clean copy of the work tree (setuptools reuses a stale build/ folder).
    Dependencies come, offline, from the test venv through a .pth line naming a folder of
    links to its packages, less the project and pytest."""
    base = tmp_path_factory.mktemp("plain-install")
    shared = base / "dependencies"
    shared.mkdir()
    for folder in {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}:
        for entry in Path(folder).iterdir():
            if not entry.name.startswith(NOT_SHARED) and not (shared / entry.name).exists():
                (shared / entry.name).symlink_to(entry)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(subprocess.run(
        [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True).stdout.strip())
    (site / "zz-test-deps.pth").write_text(f"{shared}\n")
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=SOURCE_ONLY)
    wheels = base / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(source)], check=True, capture_output=True)
    (wheel,) = wheels.glob("sandboxer-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                    "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True)
    return venv, site, wheel


def installed_env(tmp_path) -> dict[str, str]:
    """The environment of a user of the installed venv, in `tmp_path`: own SBX_HOME and
    config folder, no cloud credentials."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SBX_", "E2B_", "MODAL_"))}
    env.update(SBX_HOME=str(tmp_path / "home"), XDG_CONFIG_HOME=str(tmp_path / "cfg"),
               SBX_SERVER_AUTOSTART="0")
    return env


# What the wheel puts at the top of site-packages: the library (with its engine, backends and
# built-in profiles inside it as sandboxer.core, sandboxer.adapters, sandboxer.profiles) and
# the front ends. A generic name (core, adapters, profiles) would collide with any other
# distribution that ships one.
WHEEL_TOP_LEVEL = {"sandboxer", "sandboxer_tui"}


def test_the_wheel_installs_only_the_library_and_the_front_ends(installed):
    _, site, wheel = installed
    import zipfile

    names = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()
             if not n.split("/")[0].endswith(".dist-info")}
    assert names == WHEEL_TOP_LEVEL
    for room in ("rules", "store", "observe", "lifecycle", "follow", "pools", "reconcile"):
        assert (site / "sandboxer" / "core" / room / "__init__.py").is_file(), room
    assert not (site / "core").exists() and not (site / "adapters").exists()
    # what a type checker reads: the package is typed, and the sync twin has its stub
    assert (site / "sandboxer" / "py.typed").is_file()
    assert (site / "sandboxer" / "_sync.pyi").is_file()


def test_plain_install_ships_profiles_and_migrations(installed, tmp_path):
    venv, site, _ = installed
    env = installed_env(tmp_path)
    where = subprocess.run([venv / "bin" / "python", "-c",
                            "import sandboxer.core, sandboxer.profiles, sandboxer_tui; "
                            "print(sandboxer.core.__file__); print(sandboxer.profiles.__file__); "
                            "print(sandboxer_tui.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert all(line.startswith(str(site)) for line in where.stdout.split())
    listed = subprocess.run([venv / "bin" / "sbx", "profiles", "list", "--json"], cwd=tmp_path,
                            env=env, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    assert {"default", "e2b", "modal"} <= {p["name"] for p in json.loads(listed.stdout)}
    ls = subprocess.run([venv / "bin" / "sbx", "ls", "--json"], cwd=tmp_path, env=env,
                        capture_output=True, text=True)
    assert (ls.returncode, json.loads(ls.stdout)) == (0, [])  # the migrations ran
    assert (tmp_path / "home" / "sbx.db").exists()
    doctor = subprocess.run([venv / "bin" / "sbx", "doctor", "--json"], cwd=tmp_path, env=env,
                            capture_output=True, text=True)
    database = json.loads(doctor.stdout)["database"]
    from sandboxer.core.store.migrations import script_head

    assert database["schema"] == database["schema_head"] == script_head(), database
    assert database["ok"] is True


def test_plain_install_opens_the_dashboard(installed, tmux, tmp_path):
    """Bare `sbx` from the installed venv, on a terminal, outside the work tree: the main
    screen paints (it needs the stylesheet shipped in the wheel) and `q` quits cleanly."""
    venv, *_ = installed
    env = installed_env(tmp_path)
    script = tmp_path / "dashboard.sh"
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items()
                        if k.isidentifier())
    script.write_text(f"""{exports}
cd {shlex.quote(str(tmp_path))}
{shlex.quote(str(venv / "bin" / "sbx"))}
echo "exit=$?"
echo DONE
sleep 60
""")
    tmux("new-session", "-d", "-x", "120", "-y", "32", "-s", "main", f"sh {script}")
    tmux("set", "-g", "escape-time", "0")
    tmux.wait(lambda s: "0 sandboxes" in s and "docker" in s, 20, "the dashboard's main screen")
    tmux.keys("q")
    tmux.wait(lambda s: "DONE" in s, 10, "the app to quit")
    screen = tmux.screen()
    assert "exit=0" in screen and "Error" not in screen and "Traceback" not in screen, screen


def test_testing_extra_brings_pytest_for_the_conformance_kit(installed, tmp_path):
    """Without pytest (not a runtime dependency), importing the kit says which extra to
    install; the wheel declares that extra with pytest in it."""
    venv, *_ = installed
    env = installed_env(tmp_path)
    kit = subprocess.run([venv / "bin" / "python", "-c", "import sandboxer.adapters.testing"],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    assert kit.returncode == 1
    last = kit.stderr.strip().splitlines()[-1]
    assert last == ("ModuleNotFoundError: the sbx conformance kit (sandboxer.adapters.testing) needs "
                    "pytest: pip install 'sandboxer[testing]'"), kit.stderr
    requires = subprocess.run(
        [venv / "bin" / "python", "-c", "import importlib.metadata as m; "
         "print('\\n'.join(m.requires('sandboxer')))"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.splitlines()
    assert [r for r in requires if 'extra == "testing"' in r] == ['pytest>=8; extra == "testing"']


def _imported(args, env):
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "sandboxer_tui", *args],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {line.split("|")[-1].strip() for line in proc.stderr.splitlines()
            if line.startswith("import time:")}


@pytest.mark.parametrize("args", [["--help"], ["ls"], ["ls", "--json"], ["events"], ["reap"],
                                  ["profiles", "list"]])
def test_fast_paths_import_no_textual_e2b_or_modal(args, sbx_home):
    _imported(["ls"], dict(os.environ))  # the first start migrates (and may import Alembic)
    modules = _imported(args, dict(os.environ))
    heavy = {m for m in modules if m.split(".")[0] in {
        "textual", "e2b", "modal", "fastapi", "starlette", "uvicorn", "httpx", "httpx_sse",
        "prometheus_client",  # the service's and the remote client's load only for them
        "opentelemetry", "securesystemslib", "grpc", "google"}}  # telemetry, signing
    assert heavy == set()
    if args[0] in ("--help", "ls", "events"):
        assert "docker" not in modules  # no backend SDK to read the inventory
        assert "alembic" not in modules  # Alembic only when the schema is behind


def test_import_linter_contracts_hold():
    proc = subprocess.run([Path(sys.executable).parent / "lint-imports"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "0 broken" in proc.stdout


def _without_otel() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEPARENT"))}


@pytest.mark.parametrize("args", [["--help"], ["ls"], ["reap"]])
def test_unset_otel_variables_load_no_opentelemetry(args, sbx_home):
    """No OTEL_ variable: no opentelemetry module at all (docs/telemetry.md)."""
    _imported(["ls"], _without_otel())
    modules = _imported(args, _without_otel())
    assert {m for m in modules if m.startswith("opentelemetry")} == set()


@pytest.mark.parametrize(("args", "traced"), [(["--help"], False), (["ls"], False),
                                              (["reap"], True)])
def test_set_otel_variables_load_opentelemetry_only_for_an_operation(args, traced, sbx_home):
    """With an endpoint set, `sbx ls` and `--help` (no lifecycle operation) still load none;
    `sbx reap` does, for its span (sent to a port where nothing listens: the command still
    succeeds)."""
    env = {**_without_otel(), "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
           "OTEL_SERVICE_NAME": "sbx-import-test", "OTEL_EXPORTER_OTLP_TIMEOUT": "1"}
    _imported(["ls"], env)
    modules = _imported(args, env)
    assert any(m.startswith("opentelemetry.sdk") for m in modules) is traced
