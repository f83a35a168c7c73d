"""`box.files`: files and trees in and out of a sandbox, streamed (docs/api.md, "Files").

Every transfer is recorded as a `sandbox.file` event (path, size, SHA-256, direction,
actor; never the bytes). Paths in the sandbox are absolute; a relative one is refused
(BadInput) before anything is sent. A tree downloaded from a sandbox is untrusted: it is
unpacked by `sandboxer.core.rules.trees.extract_tree`, which writes nothing outside the
destination and holds the size and entry caps while it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import posixpath
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from sandboxer._records import FileInfo, FileTransfer

if TYPE_CHECKING:
    from sandboxer._api import AsyncSandbox
    from sandboxer._transport import Transport

CHUNK = 1 << 20  # what is read from a local file or object at a time
AHEAD = 8  # chunks of a transfer read ahead of the thread that packs or unpacks them


class AsyncFiles:
    """The files of one sandbox (`box.files`). Needs a backend with the `files` capability
    (Conflict, exit 4, naming the backend, otherwise)."""

    __slots__ = ("_box",)

    def __init__(self, box: AsyncSandbox) -> None:
        self._box = box

    @property
    def _t(self) -> Transport:
        return self._box._client._transport

    @property
    def _id(self) -> str:
        return self._box.id

    async def write(self, path: str,
                    data: bytes | str | BinaryIO | Path | AsyncIterator[bytes], *,
                    mode: int | None = None) -> FileTransfer:
        """Write a file in the sandbox (its folder made if missing; an existing file is
        replaced): `data` as bytes, text (UTF-8), a binary file object, a local `Path` or
        an async iterator of chunks (a request body, say), read and sent in pieces.
        `mode`: its permission bits (default 0o644)."""
        if isinstance(data, Path):
            if data.is_dir():
                from sandboxer.core.rules.errors import BadInput

                raise BadInput(f"{data} is a folder: upload a folder with files.upload")
            doc = await self._t.write_file(self._id, path, _file_chunks(data), mode=mode)
        else:
            doc = await self._t.write_file(self._id, path, _chunks(data), mode=mode)
        return FileTransfer.from_dict(doc)

    async def read(self, path: str) -> bytes:
        """A file's bytes (a symbolic link is followed). NotFound when it is missing."""
        async with contextlib.aclosing(self._t.read_file(self._id, path)) as chunks:
            return b"".join([chunk async for chunk in chunks])

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read(path)).decode(encoding)

    async def stream(self, path: str) -> AsyncIterator[bytes]:
        """A file's bytes as they come, never held whole."""
        async with contextlib.aclosing(self._t.read_file(self._id, path)) as chunks:
            async for chunk in chunks:  # closed on leaving: the core records the event now
                yield chunk

    async def list(self, path: str, depth: int = 1) -> list[FileInfo]:
        """What is in a folder, `depth` levels down, by path (a file: itself)."""
        return [FileInfo.from_dict(d) for d in await self._t.list_files(self._id, path, depth)]

    async def stat(self, path: str) -> FileInfo:
        """One path (a symbolic link itself, not its target). NotFound when missing."""
        return FileInfo.from_dict(await self._t.stat_file(self._id, path))

    async def exists(self, path: str) -> bool:
        from sandboxer.core.rules.errors import NotFound

        try:
            await self._t.stat_file(self._id, path)
        except NotFound:
            return False
        return True

    async def remove(self, path: str, recursive: bool = False) -> None:
        """Remove a file, a link or an empty folder (`recursive`: a folder and all in it).
        NotFound when missing."""
        await self._t.remove_file(self._id, path, recursive=recursive)

    async def mkdir(self, path: str, parents: bool = True) -> None:
        """Make a folder (`parents`: and its missing parents; an existing folder is fine)."""
        await self._t.make_dir(self._id, path, parents=parents)

    async def rename(self, src: str, dst: str) -> None:
        """Move `src` to `dst` (into it, when `dst` is an existing folder)."""
        await self._t.rename_file(self._id, src, dst)

    async def put_tree(self, path: str,
                       tar: bytes | BinaryIO | AsyncIterator[bytes]) -> FileTransfer:
        """Unpack a tar stream (bytes, a binary file object or an async iterator of chunks,
        sent on as it is read) into the folder `path`, made if missing: bytes and SHA-256
        of the stream, `entries` its members. `upload` packs a local folder itself."""
        doc = await self._t.put_tree(self._id, path, _chunks(tar))
        return FileTransfer.from_dict(doc)

    async def get_tree(self, path: str) -> AsyncIterator[bytes]:
        """`path` (a file or a folder) as a tar stream whose one top entry is its base
        name, as it comes; untrusted (`download` unpacks it safely)."""
        async with contextlib.aclosing(self._t.get_tree(self._id, path)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def upload(self, local: Path | str, remote: str) -> FileTransfer:
        """Copy a local file or folder into the sandbox, as `cp -r` does: it becomes
        `remote`, or goes inside `remote` when that is an existing folder. A folder goes as
        one tar stream (bytes and SHA-256 of that stream; `entries` its members)."""
        from sandboxer.core.rules.errors import BadInput, NotFound

        source = Path(os.path.abspath(local))  # '.' or '..' has a name then
        if not source.exists() and not source.is_symlink():
            raise BadInput(f"{source} does not exist")
        if not isinstance(remote, str) or not remote.startswith("/"):
            raise BadInput(f"remote {remote!r} is relative: give an absolute path inside the "
                           "sandbox (starting with /)")
        target = "/" + posixpath.normpath(remote).lstrip("/")
        try:
            if (await self.stat(target)).is_dir:
                target = posixpath.join(target, source.name)
        except NotFound:
            pass
        if not source.is_dir():
            return await self.write(target, source)
        parent, name = posixpath.split(target)
        if name == source.name:
            doc = await self._t.put_tree(self._id, parent or "/", _tree_chunks(source))
            return FileTransfer(target, doc["bytes"], doc["sha256"], doc.get("entries"))
        # another name: unpacked beside it under a name of its own, then moved there
        import secrets

        staging = posixpath.join(parent or "/", f".sbx-upload-{secrets.token_hex(6)}")
        doc = await self._t.put_tree(self._id, staging, _tree_chunks(source))
        try:
            await self._t.rename_file(self._id, posixpath.join(staging, source.name), target)
        finally:
            await self._t.remove_file(self._id, staging, recursive=True)
        return FileTransfer(target, doc["bytes"], doc["sha256"], doc.get("entries"))

    async def download(self, remote: str, local: Path | str) -> FileTransfer:
        """Copy a file or folder out of the sandbox, as `cp -r` does: it becomes `local`,
        or goes inside `local` when that is an existing folder. The tree is untrusted:
        nothing is written outside its destination (no absolute names, `..`, links
        pointing out, devices or setuid bits), and the size and entry caps hold while it is
        read; a refused tree leaves nothing behind. Bytes and SHA-256 are of the tar
        stream."""
        import shutil
        import tempfile

        dest = Path(local)
        name = posixpath.basename(posixpath.normpath(remote)) if isinstance(remote, str) \
            else ""
        final = dest / name if dest.is_dir() and name else dest
        from sandboxer.core.rules.errors import BadInput

        if not name:  # before anything is asked of the sandbox
            raise BadInput(f"remote {remote!r}: name a file or folder inside the sandbox, not "
                           "its root")
        if not final.parent.is_dir():
            raise BadInput(f"{final.parent} is not a folder on this machine")
        if final.is_dir() and not final.is_symlink():
            raise BadInput(f"{final} is a folder that exists: download into another path")
        staging = Path(tempfile.mkdtemp(prefix=".sbx-download-", dir=final.parent))
        try:
            digest = hashlib.sha256()
            size = 0

            async def counted() -> AsyncIterator[bytes]:
                nonlocal size
                # closed when the unpacking stops (a tar's end blocks may be left unread):
                # the core records the download then, not when the stream is collected
                async with contextlib.aclosing(self._t.get_tree(self._id, remote)) as tree:
                    async for chunk in tree:
                        digest.update(chunk)
                        size += len(chunk)
                        yield chunk

            report = await _extract(counted(), staging, top=name)
            unpacked = staging / name
            if not name or not (unpacked.exists() or unpacked.is_symlink()):
                from sandboxer.core.rules.errors import OperationFailed

                raise OperationFailed(f"{remote}: the sandbox sent a tree without it")
            os.replace(unpacked, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        entries = report.get("entries") if isinstance(report, dict) else None
        return FileTransfer(str(final), size, digest.hexdigest(), entries)


# -- local data as chunks, read off the caller's loop ---------------------------------------------

async def _chunks(data: bytes | str | BinaryIO | AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if hasattr(data, "__aiter__"):  # already chunks, from the caller's loop
        async for chunk in data:  # type: ignore[union-attr]
            if not isinstance(chunk, bytes | bytearray | memoryview):  # bytes(5): 5 NULs
                from sandboxer.core.rules.errors import BadInput

                raise BadInput(f"data: each chunk must be bytes, not {type(chunk).__name__}")
            yield bytes(chunk)
        return
    if isinstance(data, str):
        data = data.encode()
    if isinstance(data, bytes | bytearray | memoryview):
        view = memoryview(data)
        for start in range(0, len(view), CHUNK):
            yield bytes(view[start:start + CHUNK])
        return
    read = getattr(data, "read", None)
    if read is None:
        from sandboxer.core.rules.errors import BadInput

        raise BadInput(f"data must be bytes, text, a binary file object or a Path, not "
                       f"{type(data).__name__}")
    while True:
        chunk = await asyncio.to_thread(read, CHUNK)
        if not chunk:
            return
        yield chunk.encode() if isinstance(chunk, str) else bytes(chunk)


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    with open(path, "rb") as f:  # noqa: ASYNC230 (read in a worker below)
        async for chunk in _chunks(f):
            yield chunk


async def _tree_chunks(source: Path) -> AsyncIterator[bytes]:
    """A local file or folder as a tar stream (`pack_tree`), made by a thread of its own up
    to AHEAD chunks ahead of the reader (bounded memory): packing and sending overlap."""
    from sandboxer.core.rules.trees import pack_tree

    packed: Iterator[bytes] = iter(pack_tree(source))
    loop = asyncio.get_running_loop()
    ready: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
    room = threading.Semaphore(AHEAD)
    stopped = False

    def soon(item: bytes | BaseException | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads any more
            loop.call_soon_threadsafe(ready.put_nowait, item)

    def pack() -> None:
        try:
            for chunk in packed:
                room.acquire()
                if stopped:
                    return
                soon(chunk)
            soon(None)
        except Exception as exc:  # noqa: BLE001 (handed to the reader, raised there)
            soon(exc)
        finally:
            close = getattr(packed, "close", None)
            if close is not None:  # a file it was reading is closed now
                close()

    threading.Thread(target=pack, name="sbx-pack-tree", daemon=True).start()
    try:
        while (item := await ready.get()) is not None:
            room.release()
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stopped = True
        room.release()  # a packer waiting for room sees it is over


async def _extract(chunks: AsyncIterator[bytes], dest: Path, top: str | None = None) -> Any:
    """`extract_tree` in a worker thread, fed by a task of this loop that reads `chunks` up
    to AHEAD chunks ahead of it (bounded memory): the transfer and the unpacking overlap."""
    import queue

    from sandboxer.core.rules import trees

    loop = asyncio.get_running_loop()
    source = chunks.__aiter__()
    ready: queue.SimpleQueue[bytes | BaseException | None] = queue.SimpleQueue()
    room = asyncio.Semaphore(AHEAD)
    done = False

    async def pump() -> None:
        try:
            async for chunk in source:
                await room.acquire()
                if done:
                    return
                ready.put(chunk)
            ready.put(None)
        except BaseException as exc:  # handed to the unpacking thread, raised there
            ready.put(exc)
            if not isinstance(exc, Exception):
                raise

    def free() -> None:
        room.release()

    def pulled() -> Iterator[bytes]:
        while (item := ready.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody feeds
                loop.call_soon_threadsafe(free)
            yield item

    feeder = loop.create_task(pump())
    unpacked = False
    try:
        report = await asyncio.to_thread(trees.extract_tree, pulled(), dest, top=top,
                                         **_caps())
        unpacked = True
        return report
    finally:
        done = True
        room.release()  # a feeder waiting for room sees it is over
        if not unpacked and not feeder.done():  # unpacked: it ends after one more chunk
            feeder.cancel()
        await asyncio.gather(feeder, return_exceptions=True)  # its end, not ours
        close = getattr(source, "aclose", None)
        if close is not None:
            await close()


def _caps() -> dict[str, int]:
    """The caps a downloaded tree is held to (settings, docs/api.md)."""
    from sandboxer.core.rules import settings

    out = {}
    for key, name in (("max_bytes", "tree_max_bytes"), ("max_entries", "tree_max_entries")):
        getter = getattr(settings, name, None)
        if getter is not None:
            out[key] = getter()
    return out
