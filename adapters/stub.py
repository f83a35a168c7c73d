"""A TEST DOUBLE: a deterministic in-process backend for unit tests and the conformance kit.

It keeps sandboxes in a dict of this process, so it never stands in for a real backend in an
integration test, and `sbx doctor` shows it as a test double. Tests can make it fail
(`StubAdapter.fail_next`) or lose a sandbox (`StubAdapter.lose`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import ClassVar

from sandboxer.adapters.base import (
    Adapter,
    AdapterError,
    BackendObject,
    Capability,
    CreateRequest,
    ExecResult,
    Health,
)


class StubAdapter(Adapter):
    name = "stub"
    description = "test double: in-process, deterministic, keeps nothing"
    capabilities = frozenset({Capability.EXEC, Capability.LOGS})
    test_double = True

    objects: ClassVar[dict[str, BackendObject]] = {}
    requests: ClassVar[dict[str, CreateRequest]] = {}
    fail_next: ClassVar[dict[str, BaseException]] = {}
    calls: ClassVar[list[tuple[str, str]]] = []
    instance: ClassVar[str | None] = None  # a test may pretend to reach another engine

    @classmethod
    def reset(cls) -> None:
        cls.objects.clear()
        cls.requests.clear()
        cls.fail_next.clear()
        cls.calls.clear()
        cls.instance = None

    @classmethod
    def lose(cls, ref: str) -> None:
        cls.objects.pop(ref, None)

    def _maybe_fail(self, op: str) -> None:
        exc = self.fail_next.pop(op, None)
        if exc is not None:
            raise exc

    async def create(self, request: CreateRequest) -> BackendObject:
        self.calls.append(("create", request.sandbox_id))
        self._maybe_fail("create")
        ref = f"stub-{request.sandbox_id}"
        obj = BackendObject(ref=ref, labels=dict(request.labels), status="running",
                            running=True, created_at=datetime.now(UTC))
        self.objects[ref] = obj
        self.requests[ref] = request
        return obj

    async def destroy(self, ref: str, *, services: bool = True) -> None:
        self.calls.append(("destroy", ref))
        self._maybe_fail("destroy")
        self.objects.pop(ref, None)

    async def get(self, ref: str) -> BackendObject | None:
        return self.objects.get(ref)

    async def list(self, labels: Mapping[str, str]) -> list[BackendObject]:
        want = dict(labels).items()
        return [o for o in self.objects.values() if want <= dict(o.labels).items()]

    async def instance_id(self) -> str | None:
        return self.instance

    async def health(self) -> Health:
        return Health(True, True, "in-process test double")

    async def exec(self, ref: str, argv: Sequence[str], timeout_s: float | None = None,
                   env: Mapping[str, str] | None = None) -> ExecResult:
        """Understands `echo ARGS`, `true`, `false`, `exit N`, `sleep S` (which honours
        `timeout_s`: 124) and `printenv NAME` (of the sandbox's env and this exec's `env`);
        anything else is exit 127."""
        self._maybe_fail("exec")
        if ref not in self.objects:
            raise AdapterError(f"stub: no sandbox {ref}")
        start = time.perf_counter()
        cmd, *args = argv
        out, err, code = b"", b"", 0
        if cmd == "echo":
            out = (" ".join(args) + "\n").encode()
        elif cmd == "false":
            code = 1
        elif cmd == "printenv":
            known = {**self.requests[ref].env, **(env or {})} if ref in self.requests else {}
            if args and args[0] in known:
                out = (known[args[0]] + "\n").encode()
            else:
                code = 1
        elif cmd == "exit":
            code = int(args[0]) if args else 0
        elif cmd == "sleep":
            seconds = float(args[0]) if args else 0.0
            if timeout_s is not None and seconds > timeout_s:
                await asyncio.sleep(timeout_s)
                return ExecResult(124, b"", b"stub: timed out\n", time.perf_counter() - start,
                                  timed_out=True)
            await asyncio.sleep(seconds)
        elif cmd != "true":
            err, code = f"stub: {cmd}: not found\n".encode(), 127
        return ExecResult(code, out, err, time.perf_counter() - start)

    async def logs(self, ref: str, follow: bool = False,
                   tail: int | None = None) -> AsyncIterator[bytes]:
        if ref not in self.objects:
            raise AdapterError(f"stub: no sandbox {ref}")
        yield f"stub sandbox {ref} started\n".encode()
