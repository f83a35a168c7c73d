"""A Sandboxer backend in one module: each sandbox is a folder, and exec runs the command as
a local process inside it. It isolates nothing; it shows what a third-party adapter needs.

- It imports only `sandboxer.adapters.base` from Sandboxer (the contract), never the core.
- Its state is on the backend itself (here, the folder and its `sandbox.json`), labels
  included, so `sbx reconcile` and `sbx reap` can find its sandboxes by label.
- Destroy is idempotent; what it cannot do it refuses with CapabilityNotSupported.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from sandboxer.adapters.base import (
    Adapter,
    BackendObject,
    BackendObjectGone,
    BackendUnavailable,
    Capability,
    CapabilityNotSupported,
    CreateRequest,
    ExecResult,
    Health,
    NoSuchPath,
    Stdin,
    stdin_chunks,
)

ROOT_ENV = "SBX_TMPDIR_ROOT"
META = "sandbox.json"


def root() -> Path:
    """Where the sandboxes live; read at each use, like a credential would be."""
    raw = os.environ.get(ROOT_ENV)
    return Path(raw) if raw else Path(tempfile.gettempdir()) / f"sbx-tmpdir-{os.getuid()}"


class TmpdirAdapter(Adapter):
    name = "tmpdir"
    description = "example: a folder per sandbox, commands run as local processes (no isolation)"
    # files in and out come from the contract's defaults (tar, find and stat through exec)
    capabilities = frozenset({Capability.EXEC, Capability.FILES})

    def _folder(self, ref: str) -> Path:
        if not ref.startswith("sbx-") or "/" in ref or ref in (".", ".."):
            raise BackendObjectGone(f"tmpdir: {ref!r} is not a sandbox of this backend")
        return root() / ref

    def _object(self, folder: Path) -> BackendObject | None:
        try:
            meta = json.loads((folder / META).read_text())
        except (OSError, ValueError):
            return None  # gone, or being removed
        return BackendObject(ref=folder.name, labels=meta["labels"], status="running",
                             running=True, created_at=datetime.fromisoformat(meta["created_at"]))

    def validate(self, request: CreateRequest) -> None:
        if request.image or request.command is not None:
            raise CapabilityNotSupported("the tmpdir backend has no images and no main process")
        if request.network != "full":
            raise CapabilityNotSupported("the tmpdir backend cannot restrict the network: "
                                         "set network.mode: full")
        limits = request.resources
        if any(v is not None for v in (limits.memory_bytes, limits.pids, limits.disk_bytes,
                                       limits.gpu)):
            raise CapabilityNotSupported("the tmpdir backend cannot limit resources: set "
                                         "resources.memory, pids, disk and gpu to null")
        if request.env or request.options:
            raise CapabilityNotSupported("the tmpdir backend takes no env and no options")

    async def health(self) -> Health:
        try:
            root().mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            return Health(False, True, f"cannot use {root()}: {exc}")
        return Health(True, True, f"folders under {root()}")

    async def ensure_available(self) -> None:
        health = await self.health()
        if not health.reachable:
            raise BackendUnavailable(f"{health.detail}; set {ROOT_ENV} to a writable folder")

    async def create(self, request: CreateRequest) -> BackendObject:
        folder = self._folder(request.sandbox_id)
        (folder / "work").mkdir(parents=True, mode=0o700)
        meta = {"labels": dict(request.labels), "created_at": datetime.now(UTC).isoformat()}
        partial = folder / f".{META}.{secrets.token_hex(4)}"
        partial.write_text(json.dumps(meta))
        partial.rename(folder / META)  # the sandbox exists once its labels do
        return self._object(folder)

    async def destroy(self, ref: str, *, services: bool = True) -> None:
        folder = self._folder(ref)
        trash = root() / f".gone-{ref}-{secrets.token_hex(4)}"
        try:
            folder.rename(trash)  # atomic: one of several destroyers wins, the rest see it gone
        except FileNotFoundError:
            return  # already gone: success
        shutil.rmtree(trash, ignore_errors=True)

    async def get(self, ref: str) -> BackendObject | None:
        try:
            return self._object(self._folder(ref))
        except BackendObjectGone:
            return None

    async def list(self, labels: Mapping[str, str]) -> list[BackendObject]:
        want = dict(labels).items()
        found = []
        for folder in sorted(root().glob("sbx-*")) if root().is_dir() else []:
            obj = self._object(folder)
            if obj is not None and want <= dict(obj.labels).items():
                found.append(obj)
        return found

    async def exec(self, ref: str, argv: Sequence[str], timeout_s: float | None = None,
                   env: Mapping[str, str] | None = None, *, cwd: str | None = None,
                   user: str | None = None, stdin: Stdin = None) -> ExecResult:
        work = self._folder(ref) / "work"
        if not work.is_dir():
            raise BackendObjectGone(f"tmpdir sandbox {ref} is gone")
        if user is not None:
            raise CapabilityNotSupported("the tmpdir backend cannot run commands as a user")
        if cwd is not None and not Path(cwd).is_dir():
            raise NoSuchPath(f"{cwd} does not exist")
        started = time.perf_counter()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=cwd or work, env={**os.environ, **env} if env else None,
                stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True)
        except FileNotFoundError:
            return ExecResult(127, b"", f"{argv[0]}: not found\n".encode(),
                              time.perf_counter() - started)
        out, err = bytearray(), bytearray()

        async def read(stream: asyncio.StreamReader, into: bytearray) -> None:
            while chunk := await stream.read(65536):  # kept as it comes: a timeout keeps it
                into += chunk

        async def write() -> None:  # bytes or chunks as they come, then the end of input
            try:
                async for chunk in stdin_chunks(stdin):
                    proc.stdin.write(chunk)
                    await proc.stdin.drain()
            except ConnectionError:
                pass  # the command stopped reading its input
            finally:
                proc.stdin.close()

        steps = [read(proc.stdout, out), read(proc.stderr, err), proc.wait()]
        try:
            await asyncio.wait_for(asyncio.gather(*steps, *([write()] if stdin else [])),
                                   timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)  # the command and everything it started
            await proc.wait()
            note = f"sbx: timed out after {timeout_s:g}s\n".encode()
            return ExecResult(124, bytes(out), bytes(err) + note,
                              time.perf_counter() - started, timed_out=True)
        return ExecResult(proc.returncode, bytes(out), bytes(err), time.perf_counter() - started)
