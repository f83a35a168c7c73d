"""The transport contract (sandboxer/_transport.py) holds: both transports, and the acting
one the service uses, have every operation of `Transport` with its exact signature and no
public method beside them; the library asks its transport for nothing else; the check
itself catches a transport that lacks an operation or renames a parameter; and what a
transport returns reaches the caller alike in process and over a service."""

from __future__ import annotations

import ast
import inspect
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import pytest

import sandboxer
from sandboxer._local import ActingTransport, LocalTransport, LocalWatch
from sandboxer._remote import RemoteTransport, RemoteWatch
from sandboxer._transport import Transport, Watch, operations

LIBRARY = Path(__file__).resolve().parents[2] / "sandboxer"


def _shape(function: Any) -> list[tuple[str, str, str, str]]:
    """Each parameter's name, kind, default and annotation, as written (never evaluated)."""
    signature = inspect.signature(function, eval_str=False)
    params = [(p.name, p.kind.name, repr(p.default), str(p.annotation))
              for p in signature.parameters.values()]
    return params + [("return", "", "", str(signature.return_annotation))]


def contract_problems(cls: type, protocol: type = Transport, *,
                      no_extras: bool = True) -> list[str]:
    """How `cls` differs from `protocol`: a missing operation, a signature that differs in a
    parameter's name, kind, default or annotation, async where the contract is not (or the
    reverse), and (with `no_extras`) a public method the contract does not have."""
    problems = []
    wanted = operations(protocol)
    for name in wanted:
        own = next((vars(k)[name] for k in cls.__mro__
                    if name in vars(k) and not getattr(k, "_is_protocol", False)), None)
        if own is None:
            problems.append(f"{cls.__name__} lacks {name}")
            continue
        promised = getattr(protocol, name)
        if _shape(own) != _shape(promised):
            problems.append(f"{cls.__name__}.{name}{inspect.signature(own, eval_str=False)} "
                            f"is not {name}{inspect.signature(promised, eval_str=False)}")
        if inspect.iscoroutinefunction(own) != inspect.iscoroutinefunction(promised):
            problems.append(f"{cls.__name__}.{name}: async where the contract is not, or "
                            "the reverse")
    if no_extras:
        extras = sorted(name for name, member in vars(cls).items()
                        if not name.startswith("_") and inspect.isfunction(member)
                        and name not in wanted)
        problems += [f"{cls.__name__}.{name} is not in the contract" for name in extras]
    return problems


# (ActingTransport's methods are made from the Protocol itself, so its signatures agree by
# construction; what this can catch for it is an operation it lacks or one it adds)
@pytest.mark.parametrize("transport", [LocalTransport, RemoteTransport, ActingTransport])
def test_each_transport_has_every_operation_of_the_contract_as_written(transport):
    assert contract_problems(transport) == []


@pytest.mark.parametrize("watch", [LocalWatch, RemoteWatch])
def test_each_watch_has_the_watch_contract(watch):
    assert contract_problems(watch, Watch) == []
    assert watch(None, include_destroyed=True).include_destroyed is True


def test_the_library_asks_its_transport_only_for_operations_of_the_contract():
    """Every `<x>._transport.NAME` and `self._t.NAME` in the handles and the sync twin."""
    asked = set()
    for module in ("_api.py", "_sync.py"):
        for node in ast.walk(ast.parse((LIBRARY / module).read_text())):
            if not isinstance(node, ast.Attribute) or not isinstance(node.value, ast.Attribute):
                continue
            if node.value.attr in ("_transport", "_t"):
                asked.add(node.attr)
    assert asked, "the library's calls on its transport were not found"
    assert sorted(asked - set(operations())) == []


# -- the check catches a transport that breaks the contract --------------------------------


class _Small(Protocol):
    async def get(self, ref: str, *, with_profile: bool = False) -> dict[str, Any]: ...

    def logs(self, ref: str, *, follow: bool, tail: int | None) -> AsyncIterator[bytes]: ...


class _Keeps:
    async def get(self, ref: str, *, with_profile: bool = False) -> dict[str, Any]:
        return {}

    async def logs(self, ref: str, *, follow: bool, tail: int | None) -> AsyncIterator[bytes]:
        yield b""


class _Lacks:
    async def get(self, ref: str, *, with_profile: bool = False) -> dict[str, Any]:
        return {}


class _Renames(_Keeps):
    async def get(self, reference: str, *, with_profile: bool = False) -> dict[str, Any]:
        return {}


class _Defaults(_Keeps):
    async def get(self, ref: str, *, with_profile: bool = True) -> dict[str, Any]:
        return {}


class _Positional(_Keeps):
    async def get(self, ref: str, with_profile: bool = False) -> dict[str, Any]:
        return {}


class _Retypes(_Keeps):
    async def get(self, ref: str, *, with_profile: bool = False) -> Mapping[str, Any]:
        return {}


class _Blocks(_Keeps):
    def get(self, ref: str, *, with_profile: bool = False) -> dict[str, Any]:
        return {}


class _Adds(_Keeps):
    async def shell(self, ref: str) -> list[str]:
        return []


@pytest.mark.parametrize("broken, problem", [
    (_Lacks, "_Lacks lacks logs"),
    (_Renames, "_Renames.get(self, reference: 'str'"),
    (_Defaults, "_Defaults.get(self, ref: 'str', *, with_profile: 'bool' = True)"),
    (_Positional, "_Positional.get(self, ref: 'str', with_profile"),
    (_Retypes, "-> 'Mapping[str, Any]'"),
    (_Blocks, "_Blocks.get: async where the contract is not"),
    (_Adds, "_Adds.shell is not in the contract"),
])
def test_the_check_catches_a_transport_that_breaks_the_contract(broken, problem):
    assert contract_problems(_Keeps, _Small) == []
    problems = contract_problems(broken, _Small)
    assert len(problems) == 1 and problem in problems[0], problems


def test_the_check_finds_an_operation_a_real_transport_lacks():
    stripped = type("Stripped", (), {k: v for k, v in vars(RemoteTransport).items()
                                     if k != "extend"})
    assert contract_problems(stripped) == ["Stripped lacks extend"]


def test_an_acting_transport_records_its_actor_and_keeps_the_signatures():
    """The operations made from the contract act as the actor and take what the inner
    transport takes (the signature is the contract's)."""
    seen = []

    class Inner:  # the one operation this test calls
        async def extend(self, ref: str, by: timedelta) -> tuple[dict[str, Any], bool]:
            from sandboxer.core.rules.settings import ACTING_AS, TENANT

            seen.append((ref, by, ACTING_AS.get(), TENANT.get()))
            return {"id": ref}, True

    import asyncio

    acting = ActingTransport(Inner(), "alice", "alice")  # type: ignore[arg-type]
    answer = asyncio.run(acting.extend("box", timedelta(minutes=5)))
    assert answer == ({"id": "box"}, True)
    assert seen == [("box", timedelta(minutes=5), "alice", "alice")]
    assert str(inspect.signature(ActingTransport.extend)) == \
        str(inspect.signature(Transport.extend))


# -- what both transports answer alike ------------------------------------------------------


async def test_destroy_says_whether_this_call_destroyed_it(client, stub_profile):
    """The engine knows whether a destroy did the work or found it done (the transport's
    `destroy` returns it); the handle keeps it instead of dropping it, in process and over a
    service alike."""
    box = await client.create(stub_profile, ttl="5m")
    again = await client.get(box.id)
    assert await box.destroy() is True
    assert box.state is sandboxer.State.DESTROYED
    assert await again.destroy() is False
    assert again.state is sandboxer.State.DESTROYED
