"""Reading tar archives that come from outside, within bounds.

`tarfile` believes headers: it reads a pax or GNU long-name header of any declared size into
memory, and a gzip stream inflates far past its file's size. `BoundedTar` reads a tar stream
once, in order, and hands its reader no more bytes than the caller has accepted so far
(the data of each member it accepted, and room for one header after it), so an archive is
refused as soon as it passes a cap: before its content is held in memory or written anywhere.
Shared by the core (checkpoint archives) and the Docker adapter (the image inside them).
"""

from __future__ import annotations

import io
import posixpath
import shutil
import tarfile
from collections.abc import Iterator
from typing import BinaryIO

# Room for the header (with its pax records) before each member, counted from the end of the
# member before: plain names need 1.5 KiB, and tarfile reads 10 KiB ahead; a long-name or
# pax bomb meets the bound instead.
HEADER_ROOM = 64 * 1024
BLOCK = tarfile.BLOCKSIZE


class TooLarge(Exception):
    """The archive passed a bound. Nothing past the bound was read."""


class _BoundedStream(io.RawIOBase):
    """A stream that gives at most `allowed` bytes of `raw`; wanting more while `raw` has
    more raises TooLarge. `raw.read(n)` is only ever asked for what may be given."""

    def __init__(self, raw: BinaryIO, allowed: int) -> None:
        self._raw = raw
        self.allowed = allowed
        self.given = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        room = self.allowed - self.given
        if room <= 0:
            if self._raw.read(1):
                raise TooLarge(f"a tar header (with its pax records) is longer than "
                               f"{HEADER_ROOM // 1024} KiB")
            return 0
        data = self._raw.read(min(len(buffer), room))
        buffer[:len(data)] = data
        self.given += len(data)
        return len(data)


def _blocks(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def member_path(member: tarfile.TarInfo) -> str:
    """Where an extractor would put the member, relative to its folder (`./a//b` is `a/b`)."""
    return posixpath.normpath("/" + member.name).lstrip("/")


class BoundedTar:
    """The members of an uncompressed tar stream, one at a time, each only after its header
    is read. Call `accept(member)` before reading its data (`read`, `copy`) or moving on:
    without it the next step refuses, so no member's data is read unless it was accepted."""

    def __init__(self, raw: BinaryIO, *, max_members: int) -> None:
        self._stream = _BoundedStream(raw, HEADER_ROOM)
        self._max_members = max_members
        self._current: tarfile.TarInfo | None = None
        self._next = 0
        self._tar = tarfile.open(fileobj=self._stream, mode="r|")  # noqa: SIM115 (closed by close)

    def __iter__(self) -> Iterator[tarfile.TarInfo]:
        for count, member in enumerate(self._tar, 1):
            if count > self._max_members:
                raise TooLarge(f"more than {self._max_members} members")
            # where tarfile reads the next header: past the data it stores (a file's, or
            # an unknown type's), never past a size a folder or link merely declares
            self._current, self._next = member, self._tar.offset
            if member.size and not member.isreg() and self._next == member.offset_data:
                raise TooLarge(f"entry {member.name!r} is not a file yet declares "
                               f"{member.size} bytes of data")
            yield member
            self._tar.members.clear()  # a long archive's headers are not kept

    def accept(self, member: tarfile.TarInfo) -> None:
        """Its data may be read, and the next header given HEADER_ROOM after it (room not
        used by one header is not carried over to the next). Room is what tarfile itself
        skips to the next header, so a size declared where no data is stored (a folder's)
        widens nothing."""
        stored = self._next if member is self._current else \
            member.offset_data + (_blocks(member.size) if member.isreg() else 0)
        self._stream.allowed = max(self._stream.allowed, stored + HEADER_ROOM)

    def read(self, member: tarfile.TarInfo) -> bytes:
        self.accept(member)
        source = self._tar.extractfile(member)
        return source.read() if source else b""

    def copy(self, member: tarfile.TarInfo, out: BinaryIO) -> None:
        self.accept(member)
        source = self._tar.extractfile(member)
        if source:
            shutil.copyfileobj(source, out, 1024 * 1024)

    def close(self) -> None:
        self._tar.close()


def format_size(size: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= scale:
            return f"{size / scale:.4g} {unit}"
    return f"{size} bytes"
