"""The conformance kit for adapters (needs pytest): `from adapters.testing import
AdapterConformance`, subclass it in a test module, give it an `adapter` fixture. See
`adapters.testing.conformance` and docs/adapters.md."""

from adapters.testing.conformance import AdapterConformance, Kit, new_sandbox_id

__all__ = ["AdapterConformance", "Kit", "new_sandbox_id"]
