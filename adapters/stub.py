"""A TEST DOUBLE: a deterministic in-process backend for unit tests and the conformance kit.

It keeps sandboxes in a dict of this process, so it never stands in for a real backend in an
integration test, and `sbx doctor` shows it as a test double. Tests can make it fail
(`StubAdapter.fail_next`) or lose a sandbox (`StubAdapter.lose`). Each sandbox has a small
filesystem in memory (`MemoryFS`: folders, files, symbolic links), so the FILES contract and
the conformance kit run on it; its trees go in and out as tar made in memory.
"""

from __future__ import annotations

import asyncio
import io
import posixpath
import tarfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import ClassVar

from sandboxer.adapters.base import (
    Adapter,
    AdapterError,
    BackendObject,
    Capability,
    CreateRequest,
    ExecResult,
    FileInfo,
    Health,
    InvalidRequest,
    NoSuchPath,
    Stdin,
    stdin_chunks,
)

CHUNK = 64 * 1024


@dataclass
class Node:
    type: str  # "file" | "dir" | "symlink"
    mode: int
    mtime: float = field(default_factory=time.time)
    data: bytes = b""
    target: str | None = None


class MemoryFS:
    """One sandbox's filesystem: absolute normalised paths to nodes; "/", "/tmp" and
    "/home/user" exist from the start. Links are stored, never followed."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {p: Node("dir", 0o755) for p in ("/", "/tmp", "/home",
                                                                          "/home/user")}

    @staticmethod
    def norm(path: str) -> str:
        path = posixpath.normpath(path)
        return "/" + path.lstrip("/")

    def get(self, path: str) -> Node:
        node = self.nodes.get(self.norm(path))
        if node is None:
            raise NoSuchPath(f"{path} does not exist in the sandbox")
        return node

    def children(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        return sorted(p for p in self.nodes if p.startswith(prefix) and p != prefix
                      and "/" not in p[len(prefix):])

    def below(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        return sorted(p for p in self.nodes if p.startswith(prefix) and p != "/")

    def mkdir(self, path: str, parents: bool = True) -> None:
        path = self.norm(path)
        node = self.nodes.get(path)
        if node is not None:
            if node.type == "dir" and parents:
                return
            raise InvalidRequest(f"{path} already exists")
        parent = posixpath.dirname(path)
        if parent not in self.nodes:
            if not parents:
                raise NoSuchPath(f"{parent} does not exist in the sandbox")
            self.mkdir(parent, parents=True)
        elif self.nodes[parent].type != "dir":
            raise InvalidRequest(f"{parent} is not a folder")
        self.nodes[path] = Node("dir", 0o755)

    def put(self, path: str, node: Node) -> None:
        path = self.norm(path)
        self.mkdir(posixpath.dirname(path))
        old = self.nodes.get(path)
        if old is not None and old.type == "dir" and node.type == "dir":
            old.mode, old.mtime = node.mode, node.mtime
            return
        self.nodes[path] = node

    def info(self, path: str) -> FileInfo:
        node = self.get(path)
        size = len(node.data) if node.type == "file" else \
            len(node.target or "") if node.type == "symlink" else 4096
        return FileInfo(path=path, name=posixpath.basename(path) or "/", type=node.type,
                        size=size, mode=node.mode,
                        mtime=datetime.fromtimestamp(int(node.mtime), UTC), target=node.target)


class StubAdapter(Adapter):
    name = "stub"
    description = "test double: in-process, deterministic, keeps nothing"
    capabilities = frozenset({Capability.EXEC, Capability.LOGS, Capability.FILES})
    test_double = True

    objects: ClassVar[dict[str, BackendObject]] = {}
    filesystems: ClassVar[dict[str, MemoryFS]] = {}
    requests: ClassVar[dict[str, CreateRequest]] = {}
    fail_next: ClassVar[dict[str, BaseException]] = {}
    calls: ClassVar[list[tuple[str, str]]] = []
    instance: ClassVar[str | None] = None  # a test may pretend to reach another engine
    made_on: ClassVar[dict[str, str | None]] = {}  # the engine each object is on

    @classmethod
    def reset(cls) -> None:
        cls.objects.clear()
        cls.filesystems.clear()
        cls.requests.clear()
        cls.fail_next.clear()
        cls.calls.clear()
        cls.instance = None
        cls.made_on.clear()

    @classmethod
    def lose(cls, ref: str) -> None:
        cls.objects.pop(ref, None)
        cls.filesystems.pop(ref, None)

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
        self.made_on[ref] = self.instance
        self.filesystems[ref] = MemoryFS()
        self.requests[ref] = request
        return obj

    async def destroy(self, ref: str, *, services: bool = True) -> None:
        self.calls.append(("destroy", ref))
        self._maybe_fail("destroy")
        self.objects.pop(ref, None)
        self.filesystems.pop(ref, None)

    async def get(self, ref: str) -> BackendObject | None:
        return self.objects.get(ref)

    async def list(self, labels: Mapping[str, str]) -> list[BackendObject]:
        want = dict(labels).items()
        return [o for o in self.objects.values() if want <= dict(o.labels).items()]

    async def instance_id(self) -> str | None:
        return self.instance

    async def health(self) -> Health:
        return Health(True, True, "in-process test double")

    def _fs(self, ref: str) -> MemoryFS:
        if ref not in self.objects or self.made_on.get(ref, self.instance) != self.instance:
            raise AdapterError(f"stub: no sandbox {ref}")  # another engine knows none
        return self.filesystems.setdefault(ref, MemoryFS())

    async def exec(self, ref: str, argv: Sequence[str], timeout_s: float | None = None,
                   env: Mapping[str, str] | None = None, *, cwd: str | None = None,
                   user: str | None = None, stdin: Stdin = None) -> ExecResult:
        """Understands `echo ARGS`, `true`, `false`, `exit N`, `sleep S` (which honours
        `timeout_s`: 124), `printenv NAME` (of the sandbox's env and this exec's `env`), `pwd`
        (`cwd`, else /), and `cat [PATH...]` (its stdin, or files of its filesystem);
        anything else is exit 127. A `cwd` that is not a folder is exit 2; `user` is refused
        (the stub declares no RUN_AS_USER)."""
        self._maybe_fail("exec")
        if user is not None:
            raise self._unsupported(f"run a command as {user!r}")
        fs = self._fs(ref)
        start = time.perf_counter()
        given = b"".join([chunk async for chunk in stdin_chunks(stdin)])  # read, as a command would
        cmd, *args = argv
        out, err, code = b"", b"", 0
        if cwd is not None and (cwd not in fs.nodes or fs.nodes[cwd].type != "dir"):
            return ExecResult(2, b"", f"stub: cd: {cwd}: no such folder\n".encode(),
                              time.perf_counter() - start)
        if cmd == "echo":
            out = (" ".join(args) + "\n").encode()
        elif cmd == "false":
            code = 1
        elif cmd == "pwd":
            out = f"{cwd or '/'}\n".encode()
        elif cmd == "cat":
            if not args:
                out = given
            for name in args:
                path = fs.norm(posixpath.join(cwd or "/", name))
                node = fs.nodes.get(path)
                if node is None or node.type != "file":
                    err, code = err + f"cat: {name}: No such file\n".encode(), 1
                else:
                    out += node.data
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
                return ExecResult(124, b"", f"sbx: timed out after {timeout_s:g}s\n".encode(),
                                  time.perf_counter() - start, timed_out=True)
            await asyncio.sleep(seconds)
        elif cmd != "true":
            err, code = f"stub: {cmd}: not found\n".encode(), 127
        return ExecResult(code, out, err, time.perf_counter() - start)

    # -- files: the in-memory filesystem ----------------------------------------------------

    async def put_archive(self, ref: str, path: str, tar: AsyncIterator[bytes]) -> None:
        fs = self._fs(ref)
        data = b"".join([chunk async for chunk in tar])  # a test double: held in memory
        base = fs.norm(path)
        try:
            archive = tarfile.open(fileobj=io.BytesIO(data), mode="r:")
        except tarfile.TarError as exc:
            raise InvalidRequest(f"not a tar archive: {exc}") from None
        fs.mkdir(base)
        with archive:
            for member in archive:
                target = fs.norm(posixpath.join(base, member.name))
                if target != base and not target.startswith(base.rstrip("/") + "/"):
                    raise InvalidRequest(f"{member.name}: outside {path}")
                if member.isdir():
                    node = Node("dir", member.mode & 0o7777, member.mtime)
                elif member.issym():
                    node = Node("symlink", 0o777, member.mtime, target=member.linkname)
                elif member.isfile():
                    node = Node("file", member.mode & 0o7777, member.mtime,
                                archive.extractfile(member).read())
                else:
                    continue  # devices, fifos, hard links: not in this double
                fs.put(target, node)

    async def get_archive(self, ref: str, path: str) -> AsyncIterator[bytes]:
        fs = self._fs(ref)
        top = fs.norm(path)
        fs.get(top)
        buffer = io.BytesIO()
        parent = posixpath.dirname(top)
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            for name in [top, *fs.below(top)]:
                node = fs.nodes[name]
                info = tarfile.TarInfo(posixpath.relpath(name, parent))
                info.mode, info.mtime = node.mode, int(node.mtime)
                if node.type == "dir":
                    info.type = tarfile.DIRTYPE
                elif node.type == "symlink":
                    info.type, info.linkname = tarfile.SYMTYPE, node.target or ""
                else:
                    info.size = len(node.data)
                archive.addfile(info, io.BytesIO(node.data) if node.type == "file" else None)
        data = buffer.getvalue()
        for at in range(0, len(data), CHUNK):
            yield data[at:at + CHUNK]

    async def list_files(self, ref: str, path: str, depth: int = 1) -> list[FileInfo]:
        fs = self._fs(ref)
        top = fs.norm(path)
        if fs.get(top).type != "dir":
            return [fs.info(top)]
        levels = top.rstrip("/").count("/")
        return [fs.info(p) for p in fs.below(top) if p.count("/") - levels <= max(1, depth)]

    async def stat_file(self, ref: str, path: str) -> FileInfo | None:
        fs = self._fs(ref)
        return fs.info(fs.norm(path)) if fs.norm(path) in fs.nodes else None

    async def remove_file(self, ref: str, path: str, *, recursive: bool = False) -> None:
        fs = self._fs(ref)
        top = fs.norm(path)
        inside = fs.below(top) if fs.get(top).type == "dir" else []
        if inside and not recursive:
            raise InvalidRequest(f"{path} is a folder that is not empty (remove it recursively)")
        for name in [*inside, top]:
            fs.nodes.pop(name, None)

    async def make_dir(self, ref: str, path: str, *, parents: bool = True) -> None:
        self._fs(ref).mkdir(path, parents)

    async def rename_file(self, ref: str, src: str, dst: str) -> None:
        fs = self._fs(ref)
        source, dest = fs.norm(src), fs.norm(dst)
        fs.get(source)
        if dest in fs.nodes and fs.nodes[dest].type == "dir":
            dest = posixpath.join(dest, posixpath.basename(source))
        if dest == source or dest.startswith(source + "/"):
            raise InvalidRequest(f"cannot move {src} into itself")
        if posixpath.dirname(dest) not in fs.nodes:
            raise NoSuchPath(f"{posixpath.dirname(dest)} does not exist in the sandbox")
        for name in [source, *fs.below(source)]:
            fs.nodes[dest + name[len(source):]] = fs.nodes.pop(name)

    async def logs(self, ref: str, follow: bool = False,
                   tail: int | None = None) -> AsyncIterator[bytes]:
        if ref not in self.objects:
            raise AdapterError(f"stub: no sandbox {ref}")
        yield f"stub sandbox {ref} started\n".encode()
