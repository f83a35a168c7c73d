"""The library's types are what a user's type checker sees: the sync twin has its methods
(sandboxer/_sync.pyi, generated, never stale) and returns sync handles, and a typed program
(tests/api/typed_example.py) passes mypy --strict, fails it when it calls a method that does
not exist, and runs as written."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import install_id_of, remove_test_containers

import sandboxer
from tests.api.conftest import RUN

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "api" / "typed_example.py"

# mypy checks the example (strict) and what it reaches of the library's public face: the
# handles and records (sandboxer/_api.py, _records.py), the sync stub, the transport contract
# and the rules they name (errors, states, the event catalog). Their imports of the engine
# (the transports, the Manager, the store, the adapters) and of pydantic are not followed: no
# public signature names them, and following them costs about 30 s a cold run here instead
# of about 6. Errors in anything but the example are not reported (follow_imports = silent):
# the project as a whole is not mypy-clean, and this test is about what a user sees.
MYPY_CONFIG = """\
[mypy]
strict = True
follow_imports = silent

[mypy-sandboxer._local,sandboxer._remote,sandboxer.adapters.*,sandboxer.core.lifecycle.*,\
sandboxer.core.store.*,sandboxer.core.observe.*,sandboxer.core.follow.*,\
sandboxer.core.reconcile.*,sandboxer.core.pools.*,pydantic.*,rich.*,yaml.*]
follow_imports = skip
"""


def _stub_maker():
    spec = importlib.util.spec_from_file_location("sync_stub", ROOT / "scripts" / "sync_stub.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sync_stub_is_what_the_classes_say():
    """sandboxer/_sync.pyi is regenerated from the classes and must be the committed one:
    a method added to (or changed in) the async API without `python scripts/sync_stub.py
    --write` fails here."""
    stub = _stub_maker().stub()
    committed = (ROOT / "sandboxer" / "_sync.pyi").read_text()
    assert committed == stub, "sandboxer/_sync.pyi is stale: python scripts/sync_stub.py --write"


def test_the_stub_has_every_sync_method_and_returns_sync_handles():
    stub = (ROOT / "sandboxer" / "_sync.pyi").read_text()
    parts = re.split(r"^class (?:Sandboxer|Sandbox|Checkpoint)\b", stub, flags=re.M)
    classes = dict(zip(("Sandboxer", "Sandbox", "Checkpoint"), parts[1:], strict=True))
    for name, text in classes.items():
        twins = [n for n, m in vars(getattr(sandboxer, name)).items()
                 if inspect.isfunction(m) and hasattr(m, "__wrapped__")]  # by _make_twin
        assert twins
        assert [n for n in twins if f"\n    def {n}(" not in text] == []
    assert "    def create(self, profile: str | Profile = 'default', *, ttl" in classes["Sandboxer"]
    assert re.search(r"def create\(.*\) -> Sandbox:", classes["Sandboxer"])
    assert not re.search(r"-> .*\bAsync(Sandbox|Checkpoint)\b", stub)


def test_the_stub_check_fails_when_the_stub_is_stale(tmp_path, monkeypatch):
    maker = _stub_maker()
    stale = tmp_path / "_sync.pyi"
    stale.write_text(maker.stub().replace("    def extend(", "    def extnd("))
    monkeypatch.setattr(maker, "STUB", stale)
    monkeypatch.setattr(maker, "ROOT", tmp_path)
    monkeypatch.setattr(sys, "argv", ["sync_stub.py", "--check"])
    assert maker.main() == 1
    monkeypatch.setattr(sys, "argv", ["sync_stub.py", "--write"])
    assert maker.main() == 0 and stale.read_text() == maker.stub()


def _mypy(files: list[Path], tmp: Path) -> dict[str, list[str]]:
    """mypy's error lines for each file (by file name)."""
    config = tmp / "mypy.ini"
    config.write_text(MYPY_CONFIG)
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), "--cache-dir",
         str(tmp / "cache"), "--no-error-summary", "--hide-error-context",
         *map(str, files)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode in (0, 1), run.stdout + run.stderr  # 2: mypy itself failed
    found: dict[str, list[str]] = {f.name: [] for f in files}
    for line in run.stdout.splitlines():
        name = Path(line.split(":", 1)[0]).name
        if name in found and ": error:" in line:
            found[name].append(line)
    return found


BROKEN = {
    # a method that does not exist, on the sync client (its methods come from the stub)
    "missing_sync_method.py": (
        'sbx.create("default", ttl="10m", labels=labels, task="typed example")',
        'sbx.creat("default", ttl="10m", labels=labels, task="typed example")',
        '"Sandboxer" has no attribute "creat"'),
    # a method that does not exist, on an async handle
    "missing_async_method.py": ('await box.extend("5m")', 'await box.extnd("5m")',
                                '"AsyncSandbox" has no attribute "extnd"'),
    # the sync client gives sync handles, not async ones
    "sync_is_not_async.py": ("made: sandboxer.Sandbox = box",
                             "made: sandboxer.AsyncSandbox = box",
                             'Incompatible types in assignment (expression has type "Sandbox", '
                             'variable has type "AsyncSandbox")'),
}


def test_the_typed_example_passes_mypy_and_a_wrong_call_fails_it(tmp_path):
    source = EXAMPLE.read_text()
    broken = []
    for name, (right, wrong, _) in BROKEN.items():
        assert source.count(right) == 1, f"{right!r} is no longer in the example"
        (tmp_path / name).write_text(source.replace(right, wrong))
        broken.append(tmp_path / name)
    errors = _mypy([EXAMPLE, *broken], tmp_path)
    assert errors[EXAMPLE.name] == []
    for name, (_, _, expected) in BROKEN.items():
        assert len(errors[name]) == 1 and expected in errors[name][0], errors[name]


def _example():
    spec = importlib.util.spec_from_file_location("typed_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _remove_checkpoint_images(home: Path, docker_api) -> None:
    install = install_id_of(home)
    if not install:
        return
    for info in docker_api.images(all=True, filters={"label": [f"sbx.install={install}"]}):
        try:
            docker_api.remove_image(info["Id"], force=True)
        except Exception:
            pass


@pytest.mark.docker
def test_the_typed_example_runs_as_written(sbx_home, docker_api):
    example = _example()
    try:
        with sandboxer.Sandboxer(home=sbx_home, actor="api-test") as sbx:
            said = example.with_the_sync_api(sbx, RUN)

        async def run_async() -> list[str]:
            async with sandboxer.AsyncSandboxer(home=sbx_home, actor="api-test") as sbx:
                return await example.with_the_async_api(sbx, RUN)

        said_async = asyncio.run(run_async())
    finally:
        remove_test_containers(sbx_home)
        _remove_checkpoint_images(sbx_home, docker_api)
    assert said[0].endswith(" is running") and said[1:] == [
        "hello", "capped=False left=True", "streamed", "exit 0", "listed 1", "checkpoints 1",
        "hello", "destroyed True, again False", "refused: Conflict",
        "first event sandbox.creating"]
    assert said_async == ["exit 0", "capped=False", "listed 1", "hello", "hello",
                          "destroyed True", "docker running"]
