"""The conformance kit for adapters (needs pytest: `pip install 'sandboxer[testing]'`):
`from sandboxer.adapters.testing import AdapterConformance`, subclass it in a test module, give it an
`adapter` fixture. See `sandboxer.adapters.testing.conformance` and docs/adapters.md."""

try:
    import pytest  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != "pytest":
        raise
    # pytest is no runtime dependency of sbx: say which extra brings it, not just its name
    raise ModuleNotFoundError(
        "the sbx conformance kit (sandboxer.adapters.testing) needs pytest: "
        "pip install 'sandboxer[testing]'", name="pytest") from None

from sandboxer.adapters.testing.conformance import AdapterConformance, Kit, new_sandbox_id  # noqa: E402

__all__ = ["AdapterConformance", "Kit", "new_sandbox_id"]
