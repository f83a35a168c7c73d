"""Files in a sandbox (issue 31): single files and whole trees in and out, streamed, and
list/stat/remove/mkdir/rename, on any backend that declares Capability.FILES.

Everything goes through the adapter's tar primitives (`put_archive`, `get_archive`): a
single file is a one-member tar made or parsed on the fly, so no backend writes file code
of its own twice. Each transfer and change is a `sandbox.file` event (path, size, SHA-256,
direction, actor; never the bytes, docs/events.md) and counts as activity. Paths are
absolute POSIX paths in the sandbox: anything else is refused (exit 2) before the backend
is asked.
"""

from __future__ import annotations

import asyncio
import hashlib
import posixpath
import tarfile
import tempfile
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from sandboxer.adapters.base import Capability, FileInfo
from sandboxer.core.rules.clock import to_iso
from sandboxer.core.rules.errors import BadInput, NotFound, OperationFailed

if TYPE_CHECKING:
    from sandboxer.adapters.base import Adapter
    from sandboxer.core.lifecycle.manager import Manager

BLOCK = 512
CHUNK = 1 << 20  # what a spooled file is read back in
SPOOL_IN_MEMORY = 8 << 20  # a file written is kept in memory up to this, then on disk
MAX_LINKS = 8  # symbolic links followed by read_file before it gives up
MAX_DEPTH = 64  # the most levels files.list goes down
META_MAX = 64 * 1024  # the longest long-name or pax header held (as adapters/archives.py)


# -- the operations -----------------------------------------------------------------------------

async def write_file(mgr: Manager, ref: str, path: str, data: AsyncIterator[bytes], *,
                     mode: int | None = None) -> dict[str, Any]:
    """Write `data` to the file `path` (its folder made if missing; an existing file is
    replaced). The data is taken whole first (spooled: in memory up to 8 MiB, then on
    disk), so a stream that fails halfway writes nothing, and its size and SHA-256 are
    known before the sandbox is touched."""
    path = _file_path(path)
    if mode is not None and (isinstance(mode, bool) or not isinstance(mode, int)
                             or not 0 <= mode <= 0o7777):
        raise BadInput(f"mode {mode!r}: give permission bits such as 0o644")
    row, adapter = await _using(mgr, ref)
    # a file extracted over a folder replaces the folder and all it holds (Docker's archive
    # API does so): refused, as `cp` refuses it
    there = await adapter.stat_file(row["backend_ref"], path)
    if there is not None and there.type == "dir":
        raise BadInput(f"{path} is a folder: give the path of a file in it to write")
    digest, size = hashlib.sha256(), 0
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY) as spool:
        async for chunk in data:
            _check_chunk(chunk, "data")
            digest.update(chunk)
            size += len(chunk)
            spool.write(chunk)
        spool.seek(0)
        parent, name = posixpath.split(path)
        member = _one_member(name, size, 0o644 if mode is None else mode,
                             mgr.clock.now().timestamp(), spool)
        await adapter.put_archive(row["backend_ref"], parent, member)
    done = {"path": path, "bytes": size, "sha256": digest.hexdigest()}
    _record(mgr, row["id"], op="write", direction="in", path=path, kind="file", bytes=size,
            sha256=done["sha256"])
    return done


async def read_file(mgr: Manager, ref: str, path: str) -> AsyncIterator[bytes]:
    """The bytes of the file `path` as they come (a symbolic link is followed). NotFound
    when it is missing; BadInput when it is a folder or not a regular file."""
    path = _file_path(path)
    row, adapter = await _using(mgr, ref)
    asked = path
    for _ in range(MAX_LINKS + 1):
        archive = adapter.get_archive(row["backend_ref"], path)
        try:
            reader = _Reader(archive)
            member = await reader.member()
            if member is None:
                raise OperationFailed(f"{asked}: the backend sent an empty archive")
            if member.issym():
                path = "/" + posixpath.normpath(posixpath.join(posixpath.dirname(path),
                                                               member.linkname)).lstrip("/")
                continue
            if member.isdir():
                raise BadInput(f"{asked} is a folder: download a folder as a tree "
                               "(files.download, sbx cp)")
            if not member.isfile():
                raise BadInput(f"{asked} is not a regular file")
            _active(mgr, row["id"])  # a long read is activity from its start
            digest, size = hashlib.sha256(), 0
            try:
                async for piece in reader.data(member.size):
                    digest.update(piece)
                    size += len(piece)
                    yield piece
            finally:  # what was sent, also when the reader stopped early
                _record(mgr, row["id"], op="read", direction="out", path=asked, kind="file",
                        bytes=size, sha256=digest.hexdigest())
        finally:
            await _close(archive)
        return
    raise BadInput(f"{asked}: more than {MAX_LINKS} symbolic links in a row")


async def put_tree(mgr: Manager, ref: str, path: str,
                   tar: AsyncIterator[bytes]) -> dict[str, Any]:
    """Unpack a tar stream into the folder `path` (made with its parents if missing), as it
    comes: `{"path", "bytes", "sha256", "entries"}` of the stream."""
    path = sandbox_path(path)
    row, adapter = await _using(mgr, ref)
    counted = _Counted()
    await adapter.put_archive(row["backend_ref"], path, counted.through(tar, "tar"))
    done = {"path": path, "bytes": counted.bytes, "sha256": counted.sha256(),
            "entries": counted.entries.count}
    _record(mgr, row["id"], op="upload", direction="in", path=path, kind="tree",
            bytes=done["bytes"], sha256=done["sha256"], entries=done["entries"])
    return done


async def get_tree(mgr: Manager, ref: str, path: str) -> AsyncIterator[bytes]:
    """The file or folder `path` as a tar stream whose one top entry is its base name."""
    path = sandbox_path(path)
    row, adapter = await _using(mgr, ref)
    counted = _Counted()
    archive = adapter.get_archive(row["backend_ref"], path)
    failed = False
    try:
        async for chunk in counted.through(archive, "archive"):
            yield chunk
    except (GeneratorExit, asyncio.CancelledError):  # the reader has what it wanted (a
        raise  # tar's end blocks may be left), or stopped reading: what was sent is recorded
    except BaseException:
        failed = True
        raise
    finally:
        await _close(archive)
        if not failed:  # what was sent, recorded whether or not the reader read to the end
            _record(mgr, row["id"], op="download", direction="out", path=path, kind="tree",
                    bytes=counted.bytes, sha256=counted.sha256(),
                    entries=counted.entries.count)


async def list_files(mgr: Manager, ref: str, path: str, depth: int = 1) -> list[dict[str, Any]]:
    path = sandbox_path(path)
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
        raise BadInput(f"depth {depth!r}: give a whole number of levels, 1 to {MAX_DEPTH}")
    from sandboxer.core.rules import settings

    most = settings.list_max_entries()
    row, adapter = await _using(mgr, ref)
    found = await adapter.list_files(row["backend_ref"], path, depth)
    if len(found) > most:
        raise BadInput(f"{path} holds more than {most} entries within {depth} level(s): list "
                       "fewer levels or a folder further down (SBX_LIST_MAX_ENTRIES)")
    _active(mgr, row["id"])
    return [file_view(info) for info in found]


async def stat_file(mgr: Manager, ref: str, path: str) -> dict[str, Any]:
    path = sandbox_path(path)
    row, adapter = await _using(mgr, ref)
    info = await adapter.stat_file(row["backend_ref"], path)
    if info is None:
        raise NotFound(f"{path} does not exist in sandbox {row['id']}")
    _active(mgr, row["id"])
    return file_view(info)


async def remove_file(mgr: Manager, ref: str, path: str, *, recursive: bool = False) -> None:
    path = _file_path(path)
    row, adapter = await _using(mgr, ref)
    await adapter.remove_file(row["backend_ref"], path, recursive=bool(recursive))
    _record(mgr, row["id"], op="remove", path=path, recursive=bool(recursive))


async def make_dir(mgr: Manager, ref: str, path: str, *, parents: bool = True) -> None:
    path = sandbox_path(path)
    row, adapter = await _using(mgr, ref)
    await adapter.make_dir(row["backend_ref"], path, parents=bool(parents))
    _record(mgr, row["id"], op="mkdir", path=path, kind="dir")


async def rename_file(mgr: Manager, ref: str, src: str, dst: str) -> None:
    src, dst = _file_path(src, "src"), _file_path(dst, "dst")
    row, adapter = await _using(mgr, ref)
    await adapter.rename_file(row["backend_ref"], src, dst)
    _record(mgr, row["id"], op="rename", path=src, to=dst)


def file_view(info: FileInfo) -> dict[str, Any]:
    """A FileInfo as the transports carry it (mtime ISO-8601)."""
    return {"path": info.path, "name": info.name, "type": info.type, "size": info.size,
            "mode": info.mode, "mtime": to_iso(info.mtime), "target": info.target}


# -- helpers ------------------------------------------------------------------------------------

def sandbox_path(path: Any, what: str = "path") -> str:
    from sandboxer.core.lifecycle.manager import sandbox_path as checked

    return checked(path, what)


def _file_path(path: Any, what: str = "path") -> str:
    path = sandbox_path(path, what)
    if path == "/":
        raise BadInput(f"{what} /: name a file or folder inside the sandbox, not its root")
    return path


async def _using(mgr: Manager, ref: str) -> tuple[dict[str, Any], Adapter]:
    """The sandbox, checked running on a backend with FILES (Conflict, exit 4, naming it);
    its adapter. Not marked active here: a refused operation (a missing path, a folder
    read as a file) changes nothing; activity is marked once the backend has done it
    (`_record`, `_active`)."""
    from sandboxer.core.store import tenancy

    row = dict(tenancy.check(mgr.resolve(ref), "sandbox", ref))
    mgr._usable(row, Capability.FILES, "read or write files")  # noqa: SLF001
    return row, await mgr.adapter_for(row)


def _active(mgr: Manager, sandbox_id: str) -> None:
    """Activity now, for an operation that succeeded without an event (stat, list), or a
    transfer whose data has started to flow."""
    from sandboxer.core.lifecycle.manager import _MARK_EXECUTED

    with mgr.db.write() as conn:
        conn.execute(_MARK_EXECUTED, {"sandbox_id": sandbox_id, "at": mgr._now()})  # noqa: SLF001


def _record(mgr: Manager, sandbox_id: str, *, op: str, path: str,
            direction: str | None = None, to: str | None = None, kind: str | None = None,
            bytes: int | None = None, sha256: str | None = None,  # noqa: A002
            entries: int | None = None, recursive: bool | None = None) -> None:
    """The `sandbox.file` event, and activity now."""
    from sandboxer.core.lifecycle.manager import _MARK_EXECUTED

    payload: dict[str, Any] = {"op": op, "direction": direction, "path": path, "to": to,
                               "kind": kind, "bytes": bytes, "sha256": sha256,
                               "entries": entries}
    if recursive is not None:
        payload["recursive"] = recursive
    with mgr.db.write() as conn:
        conn.execute(_MARK_EXECUTED, {"sandbox_id": sandbox_id, "at": mgr._now()})  # noqa: SLF001
        mgr.event(conn, sandbox_id, "sandbox.file", payload=payload)


def _check_chunk(chunk: Any, what: str) -> None:
    if not isinstance(chunk, bytes | bytearray | memoryview):
        raise BadInput(f"{what}: each chunk must be bytes, not {type(chunk).__name__}")


async def _close(stream: Any) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


async def _one_member(name: str, size: int, mode: int, mtime: float,
                      spool: Any) -> AsyncIterator[bytes]:
    """A tar stream of one regular file `name` whose bytes are read from `spool`."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, mode, int(mtime)
    yield info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
    left = size
    while left:
        chunk = spool.read(min(CHUNK, left))
        if not chunk:
            raise OperationFailed("the spooled file ended early")
        left -= len(chunk)
        yield chunk
    yield b"\0" * (-size % BLOCK) + b"\0" * (2 * BLOCK)


class _Reader:
    """A tar stream read from an async iterator of chunks, a member at a time, never
    gathered whole: pax and GNU long-name headers are applied to the member they precede."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks.__aiter__()
        self._buf = bytearray()
        self._eof = False

    async def _fill(self, n: int) -> None:
        while len(self._buf) < n and not self._eof:
            try:
                self._buf += await self._chunks.__anext__()
            except StopAsyncIteration:
                self._eof = True

    async def _read(self, n: int) -> bytes:
        await self._fill(n)
        if len(self._buf) < n:
            raise OperationFailed("the archive from the sandbox ended early")
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    async def data(self, size: int) -> AsyncIterator[bytes]:
        """The next `size` bytes as they come, then the block padding skipped."""
        left = size
        while left:
            if not self._buf:
                await self._fill(1)
                if not self._buf:
                    raise OperationFailed("the archive from the sandbox ended early")
            piece = bytes(self._buf[:left])
            del self._buf[:len(piece)]
            left -= len(piece)
            yield piece
        await self._read(-size % BLOCK)

    async def member(self) -> tarfile.TarInfo | None:
        """The next member's header (its data is next), or None at the end."""
        extra: dict[str, str] = {}
        while True:
            await self._fill(BLOCK)
            if len(self._buf) < BLOCK or self._buf[:BLOCK] == bytes(BLOCK):
                return None
            info = _header(await self._read(BLOCK))
            if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, b"x", b"g",
                             tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
                if not 0 <= info.size <= META_MAX:  # held whole: bounded
                    raise OperationFailed(f"the archive from the sandbox holds a "
                                          f"{info.size}-byte long-name or pax header (at "
                                          f"most {META_MAX // 1024} KiB)")
                body = await self._read(info.size + (-info.size % BLOCK))
                body = body[:info.size]
                if info.type == tarfile.GNUTYPE_LONGNAME:
                    extra["path"] = body.rstrip(b"\0").decode("utf-8", "surrogateescape")
                elif info.type == tarfile.GNUTYPE_LONGLINK:
                    extra["linkpath"] = body.rstrip(b"\0").decode("utf-8", "surrogateescape")
                elif info.type in (tarfile.XHDTYPE, b"x"):
                    extra.update(_pax(body))
                continue
            if "path" in extra:
                info.name = extra["path"]
            if "linkpath" in extra:
                info.linkname = extra["linkpath"]
            if "size" in extra:
                size = extra["size"]
                if not size.isdigit():  # isdigit: no sign, so never below 0
                    raise OperationFailed(f"the archive from the sandbox holds a bad pax "
                                          f"size {size[:40]!r}")
                info.size = int(size)
            if info.size < 0:
                raise OperationFailed("the archive from the sandbox holds a negative size")
            return info


def _header(block: bytes) -> tarfile.TarInfo:
    try:
        return tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError as exc:
        raise OperationFailed(f"the archive holds a bad header: {exc}") from None


def _pax(body: bytes) -> dict[str, str]:
    """pax records, `LEN key=value\\n` each."""
    out, i = {}, 0
    while i < len(body):
        space = body.find(b" ", i)
        if space < 0:
            break
        try:
            length = int(body[i:space])
        except ValueError:
            break
        if length <= 0:
            break
        key, _, value = body[space + 1:i + length - 1].partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        i += length
    return out


class _Entries:
    """Counts the members of a tar stream as its chunks pass (never holding more than a
    header): for the `entries` of a tree's transfer. A stream it cannot read stops the
    count, not the transfer (the backend's tar says what is wrong with it)."""

    def __init__(self) -> None:
        self.count = 0
        self._skip = 0
        self._head = bytearray()
        self._meta: bytearray | None = None  # a pax header's body being read
        self._meta_left = 0
        self._size: int | None = None  # from a pax header, for the next member
        self._broken = False

    def feed(self, chunk: bytes) -> None:
        view, i = memoryview(chunk), 0
        while i < len(view) and not self._broken:
            if self._skip:
                n = min(self._skip, len(view) - i)
                if self._meta is not None and self._meta_left:
                    take = min(n, self._meta_left)
                    self._meta += view[i:i + take]
                    self._meta_left -= take
                self._skip -= n
                i += n
                if not self._skip and self._meta is not None:
                    size = _pax(bytes(self._meta)).get("size")
                    self._size = int(size) if size and size.isdigit() else None
                    self._meta = None
                continue
            take = view[i:i + BLOCK - len(self._head)]
            self._head += take
            i += len(take)
            if len(self._head) == BLOCK:
                self._header(bytes(self._head))
                self._head.clear()

    def _header(self, block: bytes) -> None:
        if block == bytes(BLOCK):
            return
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError:
            self._broken = True
            return
        size = info.size
        if info.type in (tarfile.XHDTYPE, b"x") and size > META_MAX:
            self._broken = True  # not held: the count stops, not the transfer
            return
        if info.type in (tarfile.XHDTYPE, b"x"):
            self._meta, self._meta_left = bytearray(), size
        elif info.type not in (tarfile.XGLTYPE, b"g", tarfile.GNUTYPE_LONGNAME,
                               tarfile.GNUTYPE_LONGLINK):
            self.count += 1
            if self._size is not None:
                size, self._size = self._size, None
            if not (info.isreg() or info.type in (tarfile.CONTTYPE,)):
                size = 0  # links, folders, devices carry no data
        self._skip = size + (-size % BLOCK)


class _Counted:
    """A stream's size, SHA-256 and tar entries, taken as it passes."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self.bytes = 0
        self.entries = _Entries()

    async def through(self, chunks: AsyncIterator[bytes], what: str) -> AsyncIterator[bytes]:
        async for chunk in chunks:
            _check_chunk(chunk, what)
            chunk = bytes(chunk)
            self._digest.update(chunk)
            self.bytes += len(chunk)
            self.entries.feed(chunk)
            yield chunk

    def sha256(self) -> str:
        return self._digest.hexdigest()
