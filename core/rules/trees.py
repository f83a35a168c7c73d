"""Trees in and out of a sandbox as tar streams: `pack_tree` makes one of a local file or
folder, `extract_tree` unpacks one that came out of a sandbox (docs/security.md, "Trees out of
a sandbox").

A tree from a sandbox is untrusted: whatever ran there chose its names, links and modes.
`extract_tree` reads it once, in order (tarfile's stream mode, each header bounded by
`BoundedTar`, so a long-name or pax bomb is refused before it is held in memory), and
refuses, naming the entry, anything that would write outside the destination or that a
person did not ask for: absolute names, `..`, an entry inside a link, symbolic links
that point out (or are absolute), hard links to anything but a file of the same tree,
devices, pipes and sockets, setuid and setgid bits; and it holds the entry and byte caps
while it reads. A refused tree leaves nothing behind: what it wrote before the refusal is
removed. Standard library only.
"""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
import shutil
import stat
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from sandboxer.adapters.archives import BoundedTar, TooLarge
from sandboxer.adapters.base import one_line
from sandboxer.core.rules.errors import BadInput

CHUNK = 1024 * 1024  # the pieces pack_tree yields, and what is copied at a time
BLOCK = tarfile.BLOCKSIZE
# the defaults of the caps (settings.tree_max_bytes and tree_max_entries read them)
DEFAULT_MAX_BYTES = 10 * 1024**3
DEFAULT_MAX_ENTRIES = 1_000_000
_KINDS = {tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE}


class _Chunks(io.RawIOBase):
    """An iterable of byte chunks as a readable stream."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._left = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._left:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._left = memoryview(bytes(chunk))
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


def _refuse(name: str, why: str) -> BadInput:
    return BadInput(f"refused the tree from the sandbox: entry {name!r} {why}; nothing of it "
                    "was kept")


def _relative(path: str, entry: str, what: str = "name") -> str:
    """`path` (the entry's name, or its hard link's target) as a path inside the
    destination ('a/b'), or BadInput naming the entry."""
    if path.startswith("/"):
        raise _refuse(entry, f"has an absolute {what} ({path!r})")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _refuse(entry, f"has '..' in its {what} ({path!r})")
    return "/".join(parts)


def extract_tree(chunks: Iterable[bytes], dest: Path, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_entries: int = DEFAULT_MAX_ENTRIES, top: str | None = None,
                 ) -> dict[str, int]:
    """Unpack the tar stream `chunks` into the folder `dest` (made if missing), by the rules
    of the module's docstring. Returns {"entries": members unpacked, "bytes": their files'
    bytes}. BadInput (exit 2) naming the entry when refused; nothing of the tree remains.
    `top`: the one top entry the tree must have (a download moves `dest/top` elsewhere, so
    every link must land inside `top`, and `top` may not be a link itself)."""
    dest = Path(dest)
    made_dest = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    before = {entry.name for entry in os.scandir(dest)}
    try:
        return _extract(chunks, dest, max_bytes, max_entries, top)
    except BaseException:
        if made_dest:
            shutil.rmtree(dest, ignore_errors=True)
        else:
            for entry in os.scandir(dest):
                if entry.name not in before:
                    _remove(Path(entry.path))
        raise


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        for folder, _, _ in os.walk(path):  # a tree may hold folders without write bits
            with contextlib.suppress(OSError):
                os.chmod(folder, 0o700)
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _extract(chunks: Iterable[bytes], dest: Path, max_bytes: int,
             max_entries: int, top: str | None = None) -> dict[str, int]:
    root = os.path.realpath(dest)
    inside = os.path.join(root, top) if top else root  # where every link must land
    links: set[str] = set()  # symbolic links made: nothing may be written through one
    files: set[str] = set()  # regular files made: what a hard link may name
    # folders known to be real folders (not links), their parents too: none of them can turn
    # into anything else while the tree is unpacked (a folder is never replaced), so what is
    # under them needs no further look at its parents
    dirs: set[str] = {""}
    folders: list[tuple[str, tarfile.TarInfo]] = []  # their modes and times, set last
    made_links: list[tuple[str, str]] = []
    entries = total = 0
    try:
        tar = BoundedTar(_Chunks(chunks), max_members=max_entries + 1)
        for member in tar:
            name = member.name
            entries += 1
            if entries > max_entries:
                raise _refuse(name, f"is past the cap of {max_entries} entries "
                              "(SBX_TREE_MAX_ENTRIES)")
            rel = _check(member, root, links, files, top, dirs=dirs)
            if member.isreg():
                total += member.size
                if total > max_bytes:
                    raise _refuse(name, f"passes the cap of {max_bytes} bytes in all "
                                  "(SBX_TREE_MAX_BYTES)")
            if not rel:  # the destination itself ('.', './')
                tar.accept(member)
                continue
            target = os.path.join(root, rel)
            parent = rel.rpartition("/")[0]
            if parent not in dirs:  # _check found none of its parents a link
                os.makedirs(os.path.dirname(target), exist_ok=True)
                _known(parent, dirs)
            links.discard(rel)  # an entry of the same name replaces what was there
            files.discard(rel)
            if member.isdir():
                if os.path.islink(target) or (os.path.lexists(target)
                                              and not os.path.isdir(target)):
                    os.unlink(target)
                os.makedirs(target, exist_ok=True)
                dirs.add(rel)
                os.chmod(target, 0o700)  # its own mode once everything inside is written
                folders.append((target, member))
                tar.accept(member)
                continue
            _clear(target, name)
            if member.issym():
                os.symlink(member.linkname, target)
                links.add(rel)
                made_links.append((rel, name))
                tar.accept(member)
            elif member.islnk():
                os.link(os.path.join(root, _relative(member.linkname, name)), target,
                        follow_symlinks=False)
                files.add(rel)
                tar.accept(member)
            else:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600)
                with os.fdopen(fd, "wb") as out:
                    tar.copy(member, out)
                os.chmod(target, member.mode & 0o777)
                os.utime(target, (member.mtime, member.mtime))
                files.add(rel)
        tar.close()
    except TooLarge as exc:
        raise BadInput(f"refused the tree from the sandbox: {exc}; nothing of it was "
                       "kept") from None
    except (tarfile.TarError, EOFError) as exc:
        raise BadInput(f"the sandbox sent no valid tar stream ({one_line(exc)}); nothing "
                       "of it was kept") from None
    except OSError as exc:
        if exc.filename is None or entries == 0:  # not this machine's files: not the entry's
            raise
        # a name too long here, a file where a folder is needed: one line, no local path
        raise _refuse(name, f"cannot be written here ({exc.strerror or 'error'})") from None
    # each link was checked as it came; a link through links made after it is seen only now
    for rel, name in made_links:
        if rel in links:
            lands = os.path.realpath(os.path.join(root, rel))
            if lands != inside and not lands.startswith(inside + os.sep):
                raise _refuse(name, "is a link pointing out of the tree (through other "
                              "links)")
    for target, member in reversed(folders):  # deepest first: a read-only one last
        os.chmod(target, member.mode & 0o1777)
        os.utime(target, (member.mtime, member.mtime))
    return {"entries": entries, "bytes": total}


def _known(rel: str, dirs: set[str]) -> None:
    """`rel` and its parents are real folders now (made, or checked not links)."""
    while rel and rel not in dirs:
        dirs.add(rel)
        rel = rel.rpartition("/")[0]


def _check(member: tarfile.TarInfo, root: str, links: set[str], files: set[str],
           top: str | None = None, *,
           dirs: frozenset[str] | set[str] = frozenset()) -> str:
    """Where `member` goes (relative to the destination), or BadInput naming it."""
    name = member.name
    rel = _relative(name, name)
    if top and rel != top and not rel.startswith(top + "/"):
        raise _refuse(name, f"is outside {top!r}, the one top entry asked for")
    if top and rel == top and member.issym():
        raise _refuse(name, "is a link at the top of the tree: it would point out of its "
                      "destination (download its target instead)")
    if member.type not in _KINDS:
        what = ("a device" if member.ischr() or member.isblk() else
                "a pipe" if member.isfifo() else f"of tar type {member.type!r}")
        raise _refuse(name, f"is {what}, which sbx does not unpack")
    if member.mode & (stat.S_ISUID | stat.S_ISGID):
        raise _refuse(name, "has the setuid or setgid bit")
    parent = rel.rpartition("/")[0]
    if parent not in dirs:  # (each folder in `dirs` was checked so, its parents too)
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            above = "/".join(parts[:depth])
            if above in links or os.path.islink(os.path.join(root, above)):
                raise _refuse(name, f"is inside the link {above!r}")
    if member.issym():
        if member.linkname.startswith("/"):
            raise _refuse(name, f"is a link to the absolute path {member.linkname!r}")
        lands = posixpath.normpath(posixpath.join(posixpath.dirname(rel), member.linkname))
        if lands == ".." or lands.startswith("../") or (
                top and lands != top and not lands.startswith(top + "/")):
            raise _refuse(name, f"is a link pointing out of the tree ({member.linkname!r})")
    elif member.islnk():
        source = _relative(member.linkname, name, "hard link's target")
        if source not in files:
            raise _refuse(name, f"is a hard link to {member.linkname!r}, not to a file "
                          "of this tree")
    if (member.isreg() or member.isdir()) and rel and parent in dirs \
            and not os.path.islink(os.path.join(root, rel)):
        # tarfile's "data" rules refuse a file or folder only when it is absolute (refused
        # above) or lands outside the destination; in a real folder of the tree, and no link
        # itself, it cannot: its realpath (what tarfile would look up) is root/rel
        return rel
    # the standard library's own rules for untrusted archives, on top (tarfile's "data")
    try:
        tarfile.data_filter(member, root)
    except tarfile.FilterError as exc:
        raise _refuse(name, f"is refused ({one_line(exc)})") from None
    return rel


def _clear(target: str, name: str) -> None:
    """A later entry of the same name replaces an earlier file or link (as tar does), never
    a folder."""
    try:
        found = os.lstat(target)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(found.st_mode):  # a real folder (a link to one is a link)
        raise _refuse(name, "would replace a folder")
    os.unlink(target)


# -- packing a local file or folder -------------------------------------------------------


def pack_tree(path: Path) -> Iterator[bytes]:
    """The local file or folder `path` as a tar stream (pieces of about CHUNK bytes) whose
    one top entry is its base name: folders, files (modes and times kept, owners not) and
    symbolic links (kept as links); sockets, pipes and devices are left out. A file is
    read as it is sent, never held whole. BadInput when `path` does not exist."""
    top = Path(path)
    if not top.exists() and not top.is_symlink():
        raise BadInput(f"{top} does not exist on this machine")
    name = top.name or Path(os.path.abspath(top)).name or "root"
    out = bytearray()
    for source, arcname, st in _walk(top, name):
        info = tarfile.TarInfo(arcname)
        info.mtime = int(st.st_mtime)
        info.mode = stat.S_IMODE(st.st_mode) & 0o1777
        if stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
        elif stat.S_ISLNK(st.st_mode):
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(source)
        else:
            info.size = st.st_size
        out += info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        if info.isreg():
            yield from _file_blocks(source, info.size, out)
        if len(out) >= CHUNK:
            yield bytes(out)
            out.clear()
    out += b"\0" * (2 * BLOCK)  # the end of the archive
    yield bytes(out)


def _walk(top: Path, name: str) -> Iterator[tuple[str, str, os.stat_result]]:
    """(local path, name in the archive, lstat) of `top` and all under it, folders first,
    names sorted; links are not followed; sockets, pipes and devices left out."""
    stack = [(str(top), name)]
    while stack:
        source, arcname = stack.pop()
        st = os.lstat(source)
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)
                or stat.S_ISLNK(st.st_mode)):
            continue
        yield source, arcname, st
        if stat.S_ISDIR(st.st_mode):
            names = sorted(os.listdir(source), reverse=True)
            stack += [(os.path.join(source, n), f"{arcname}/{n}") for n in names]


def _file_blocks(source: str, size: int, out: bytearray) -> Iterator[bytes]:
    """A file's data as its header (in `out`) said: exactly `size` bytes (a file that
    changed while it was read is cut or padded with zeros), then padding to a block. What
    is in `out` goes first; pieces of CHUNK go out as they are read."""
    left = size
    with open(source, "rb") as f:
        while left:
            data = f.read(min(CHUNK, left)) or b"\0" * min(CHUNK, left)
            left -= len(data)
            out += data
            if len(out) >= CHUNK:
                yield bytes(out)
                out.clear()
    out += b"\0" * (-size % BLOCK)
