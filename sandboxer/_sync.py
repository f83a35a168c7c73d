"""The sync API, made from the async one: each method of `Sandboxer`, `Sandbox` and
`Checkpoint` runs its async twin on the client's core loop and waits for it; async
iterators become iterators. Nothing here knows what an operation does.

The twins are attached at import, which a type checker does not see: `_sync.pyi`, generated
from these classes and their async twins by scripts/sync_stub.py, says what they are
(tests/api/test_typing.py fails when it is stale)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from sandboxer._api import AsyncCheckpoint, AsyncSandbox, AsyncSandboxer
from sandboxer._files import AsyncFiles
from sandboxer._processes import AsyncProcess, AsyncProcesses, ProcessRecord
from sandboxer._records import CheckpointRecord, InventoryChange, SandboxRecord, building_many
from sandboxer._terminals import AsyncTerminal

if TYPE_CHECKING:
    from sandboxer._transport import Transport

T = TypeVar("T")


def _wrap(value: Any) -> Any:
    """Async handles in `value` as their sync twins."""
    if isinstance(value, AsyncSandbox):
        return Sandbox._of(value)
    if isinstance(value, AsyncCheckpoint):
        return Checkpoint._of(value)
    if isinstance(value, AsyncProcess):
        return Process._of(value)
    if isinstance(value, AsyncTerminal):
        return Terminal._of(value)
    if isinstance(value, AsyncSandboxer):
        return Sandboxer._of(value)
    if isinstance(value, list):
        with building_many():  # a listing's twins, as many as its records
            return [_wrap(v) for v in value]
    if isinstance(value, InventoryChange):
        return InventoryChange(MappingProxyType({k: _wrap(v) for k, v in value.sandboxes.items()}),
                               tuple(_wrap(list(value.added))), tuple(_wrap(list(value.changed))),
                               value.removed)

    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    return value


class SyncIterator(Iterator[T], Generic[T]):
    """An async iterator of the core loop, one item at a time. Close it (or use `with`)
    to stop a stream that never ends, such as followed events or logs."""

    def __init__(self, transport: Transport, agen: AsyncIterator[Any]) -> None:
        self._transport = transport
        self._agen = agen

    def __iter__(self) -> SyncIterator[T]:
        return self

    def __next__(self) -> T:
        try:
            return _wrap(self._transport.call_blocking(self._agen.__anext__()))
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        """Stop the stream (what it holds open on the core loop is closed)."""
        self._transport.call_blocking(self._agen.aclose())

    def __enter__(self) -> SyncIterator[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _twin_of(name: str, member: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(member)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self._async, name)(*args, **kwargs)
        transport = self._async_client._transport
        if inspect.isawaitable(result):
            return _wrap(transport.call_blocking(result))
        if hasattr(result, "__anext__"):
            return SyncIterator(transport, result)
        return _wrap(result)

    return method


def _make_twin(sync_cls: type, async_cls: type) -> type:
    """Give `sync_cls` a blocking twin of every public method of `async_cls`."""
    for klass in reversed(async_cls.__mro__):
        for name, member in vars(klass).items():
            if name.startswith("_") or not callable(member) or isinstance(member, type):
                continue
            if name in vars(sync_cls):
                continue
            if (inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member)
                    or klass is async_cls):
                setattr(sync_cls, name, _twin_of(name, member))
    return sync_cls


class Sandboxer:
    """The sync twin of `AsyncSandboxer`: the same methods, each returning when done.

        with Sandboxer() as sbx, sbx.create("default", ttl="10m") as box:
            print(box.exec(["sh", "-c", "echo hello"]).stdout)
    """

    _async: AsyncSandboxer

    def __init__(self, home: str | Path | None = None, database_url: str | None = None,
                 actor: str | None = None, *, url: str | None = None,
                 token: str | None = None, _transport: Transport | None = None) -> None:
        self._async = AsyncSandboxer(home, database_url, actor, url=url, token=token,
                                     _transport=_transport)

    @classmethod
    def _of(cls, client: AsyncSandboxer) -> Sandboxer:
        sbx = cls.__new__(cls)
        sbx._async = client
        return sbx

    @property
    def _async_client(self) -> AsyncSandboxer:
        return self._async

    def __enter__(self) -> Sandboxer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the database and the backends' connections. Sandboxes keep running."""
        self._async._transport.close_blocking()


class Sandbox(SandboxRecord):
    """The sync twin of `AsyncSandbox`. `with sbx.create(...) as box:` destroys it on
    leaving, on an exception too."""

    __slots__ = ("_async",)
    _async: AsyncSandbox
    _view = property(lambda self: self._async._view)  # one record, shared with the twin

    @classmethod
    def _of(cls, handle: AsyncSandbox) -> Sandbox:
        box = cls.__new__(cls)
        object.__setattr__(box, "_async", handle)
        return box

    @property
    def _async_client(self) -> AsyncSandboxer:
        return self._async._client

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    @property
    def files(self) -> Files:
        """Its files: write, read, list, upload and download trees (docs/api.md, "Files")."""
        return Files._of(self._async.files)

    @property
    def processes(self) -> Processes:
        """Its background processes: start, list, get (docs/api.md, "Background processes")."""
        return Processes._of(self._async.processes)


class Files:
    """The sync twin of `AsyncFiles` (`box.files`)."""

    __slots__ = ("_async",)
    _async: AsyncFiles

    @classmethod
    def _of(cls, handle: AsyncFiles) -> Files:
        files = cls.__new__(cls)
        files._async = handle
        return files

    @property
    def _async_client(self) -> AsyncSandboxer:
        return self._async._box._client


class Processes:
    """The sync twin of `AsyncProcesses` (`box.processes`)."""

    __slots__ = ("_async",)
    _async: AsyncProcesses

    @classmethod
    def _of(cls, handle: AsyncProcesses) -> Processes:
        processes = cls.__new__(cls)
        processes._async = handle
        return processes

    @property
    def _async_client(self) -> AsyncSandboxer:
        return self._async._box._client


class Process(ProcessRecord):
    """The sync twin of `AsyncProcess`; `output()` is an iterator (close it, or use `with`,
    to stop following)."""

    __slots__ = ("_async",)
    _async: AsyncProcess
    _view = property(lambda self: self._async._view)  # one record, shared with the twin

    @classmethod
    def _of(cls, handle: AsyncProcess) -> Process:
        proc = cls.__new__(cls)
        object.__setattr__(proc, "_async", handle)
        return proc

    @property
    def _async_client(self) -> AsyncSandboxer:
        return self._async._box._client


class Terminal:
    """The sync twin of `AsyncTerminal` (`box.pty()`): iterate it for its output until the
    program ends; `with` closes it."""

    __slots__ = ("_async",)
    _async: AsyncTerminal

    @classmethod
    def _of(cls, handle: AsyncTerminal) -> Terminal:
        term = cls.__new__(cls)
        term._async = handle
        return term

    @property
    def _async_client(self) -> AsyncSandboxer:
        return self._async._box._client

    @property
    def id(self) -> str:
        """The session's id (another client attaches with it)."""
        return self._async.id

    @property
    def sandbox_id(self) -> str:
        return self._async.sandbox_id

    @property
    def argv(self) -> list[str]:
        return self._async.argv

    @property
    def offset(self) -> int:
        """The offset of the next byte `read` gives."""
        return self._async.offset

    @property
    def exit_code(self) -> int | None:
        return self._async.exit_code

    @property
    def running(self) -> bool:
        return self._async.running

    def __iter__(self) -> Iterator[bytes]:
        while data := self.read():
            yield data

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._async).replace("AsyncTerminal", "Terminal", 1)


class Checkpoint(CheckpointRecord):
    """The sync twin of `AsyncCheckpoint`."""

    __slots__ = ("_async",)
    _async: AsyncCheckpoint
    _view = property(lambda self: self._async._view)

    @classmethod
    def _of(cls, handle: AsyncCheckpoint) -> Checkpoint:
        ckpt = cls.__new__(cls)
        object.__setattr__(ckpt, "_async", handle)
        return ckpt

    @property
    def _async_client(self) -> AsyncSandboxer:
        return self._async._client


_make_twin(Sandboxer, AsyncSandboxer)
_make_twin(Sandbox, AsyncSandbox)
_make_twin(Checkpoint, AsyncCheckpoint)
_make_twin(Files, AsyncFiles)
_make_twin(Processes, AsyncProcesses)
_make_twin(Process, AsyncProcess)
_make_twin(Terminal, AsyncTerminal)
