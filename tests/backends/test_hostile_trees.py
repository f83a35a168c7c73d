"""A tree downloaded from a sandbox is untrusted (docs/security.md, "Trees out of a
sandbox"): each hostile archive here is made INSIDE a real Docker sandbox (Debian's GNU tar,
or the engine's own archive of a tree made there), fetched with the adapter (get_archive, or
`tar -c` through exec where the archive API cannot reach or a tar must be crafted), and
unpacked with extract_tree. Nothing may be written outside the destination, nothing of a
refused tree may remain, and the refusal is one line naming the entry (BadInput, exit 2).
"""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import socket
import stat
import tarfile
from pathlib import Path

import pytest
from support import RUN_ID

from sandboxer.adapters.base import LABEL_ID, CreateRequest, ExecResult
from sandboxer.adapters.docker import DockerAdapter
from sandboxer.core.rules import settings
from sandboxer.core.rules.errors import BadInput, ExitCode
from sandboxer.core.rules.trees import extract_tree, pack_tree

pytestmark = pytest.mark.docker

# GNU tar (-P and --transform craft any name); built offline by `make python-base`, which
# `make test` runs (test-setup)
DEBIAN = "sandboxer/python-base:bookworm"


class Box:
    """One real sandbox on the engine, driven through the docker adapter on a loop of its own."""

    def __init__(self, image: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.adapter = DockerAdapter()
        sandbox_id = f"sbx-hostile-{secrets.token_hex(6)}"
        request = CreateRequest(sandbox_id=sandbox_id, image=image,
                                labels={LABEL_ID: sandbox_id, "sbx-test-run": RUN_ID})
        self.ref = self.run(self.adapter.create(request)).ref

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def sh(self, script: str) -> ExecResult:
        result = self.run(self.adapter.exec(self.ref, ["sh", "-c", script], timeout_s=60))
        assert result.exit_code == 0, result
        return result

    def tar_from(self, script: str) -> list[bytes]:
        """The stdout of `script` (a tar it writes there), streamed out of the sandbox."""
        async def read() -> list[bytes]:
            chunks, end = [], None
            async for item in self.adapter.exec_stream(self.ref, ["sh", "-c", script], 60):
                if isinstance(item, ExecResult):
                    end = item
                elif item[0] == "stdout":
                    chunks.append(item[1])
            assert end is not None and end.exit_code == 0, end
            return chunks

        return self.run(read())

    def archive(self, path: str) -> list[bytes]:
        """`path` through the engine's archive API (the adapter's get_archive)."""
        async def read() -> list[bytes]:
            return [chunk async for chunk in self.adapter.get_archive(self.ref, path)]

        return self.run(read())

    def close(self) -> None:
        try:
            self.run(self.adapter.destroy(self.ref))
            self.run(self.adapter.close())
        finally:
            self.loop.close()


@pytest.fixture
def debian(docker_api):
    box = Box(DEBIAN)
    yield box
    box.close()


@pytest.fixture
def busybox(docker_api):
    box = Box("sandboxer/base:busybox")
    yield box
    box.close()


def everything_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def refused(chunks: list[bytes], tmp_path: Path, entry: str, why: str, **caps: int) -> None:
    """extract_tree refuses the tree naming `entry`; nothing appeared anywhere under
    tmp_path (the destination is three folders down: `..` twice still lands inside it)."""
    dest = tmp_path / "a" / "b" / "dest"
    dest.parent.mkdir(parents=True)
    before = everything_under(tmp_path)
    with pytest.raises(BadInput) as caught:
        extract_tree(iter(chunks), dest, **caps)
    message = str(caught.value)
    assert caught.value.exit_code == ExitCode.BAD_INPUT == 2
    assert "\n" not in message and entry in message and why in message, message
    assert everything_under(tmp_path) == before, "a refused tree left something behind"


# -- crafted with GNU tar in the sandbox, fetched through exec -------------------------------

# every archive starts with a harmless file, which must not remain after the refusal
CRAFTED = {
    "absolute name": ("mkdir -p {tmp} && echo evil > {tmp}/abs.txt && echo ok > ok.txt && "
                      "tar -cPf - ok.txt {tmp}/abs.txt", "{tmp}/abs.txt", "absolute"),
    "dot-dot": ("echo ok > ok.txt && echo evil > dd.txt && "
                "tar -cPf - --transform 's,^dd.txt,../../dd.txt,' ok.txt dd.txt",
                "../../dd.txt", "'..'"),
    "symlink out, then a file through it": (
        "mkdir -p t d && echo ok > ok.txt && ln -s ../../../escape t/l && echo evil > d/f && "
        "tar -cf /tmp/x.tar ok.txt t/l && "
        "tar -rf /tmp/x.tar --transform 's,^d/,t/l/,' d/f && cat /tmp/x.tar",
        "t/l", "pointing out"),
    "symlink inside, then a file through it": (
        "mkdir -p t d && echo ok > ok.txt && ln -s .. t/l && echo evil > d/f && "
        "tar -cf /tmp/x.tar ok.txt t/l && "
        "tar -rf /tmp/x.tar --transform 's,^d/,t/l/,' d/f && cat /tmp/x.tar",
        "t/l/f", "inside the link"),
    "absolute symlink": ("echo ok > ok.txt && ln -s /etc/passwd pw && tar -cf - ok.txt pw",
                         "pw", "absolute path"),
    "hard link out": ("mkdir h && echo ok > h/ok.txt && echo x > h/a && ln h/a h/b && "
                      "tar -cPf - -C h --transform 's,^a$,../../a,RSh' ok.txt a b",
                      "b", "hard link"),
    "device": ("echo ok > ok.txt && tar -cf - ok.txt -C /dev null", "null", "a device"),
    "setuid": ("echo ok > ok.txt && echo x > s && chmod 4755 s && tar -cf - ok.txt s",
               "s", "setuid"),
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_a_crafted_hostile_tree_is_refused_and_leaves_nothing(debian, tmp_path, case):
    tmp = f"/tmp/sbx-hostile-{secrets.token_hex(4)}"  # an absolute name: not on this host
    script, entry, why = (part.format(tmp=tmp) for part in CRAFTED[case])
    chunks = debian.tar_from(f"mkdir -p /w && cd /w && {script}")
    refused(chunks, tmp_path, entry, why)
    assert not Path(tmp).exists()


# -- made in the sandbox, fetched through the engine's archive API ---------------------------


def test_a_real_tree_with_a_link_out_and_a_setuid_file(busybox, tmp_path):
    """The engine archives what is there: links as links, modes as they are."""
    busybox.sh("mkdir -p /work/t && echo ok > /work/t/ok && ln -s /etc/passwd /work/t/pw")
    refused(busybox.archive("/work/t"), tmp_path, "t/pw", "absolute path")
    busybox.sh("rm /work/t/pw && echo x > /work/t/s && chmod 4755 /work/t/s")
    refused(busybox.archive("/work/t"), tmp_path / "again", "t/s", "setuid")


def test_too_many_entries(busybox, tmp_path, monkeypatch):
    monkeypatch.setenv("SBX_TREE_MAX_ENTRIES", "50")
    busybox.sh("mkdir -p /work/many && cd /work/many && for i in $(seq 1 60); do "
               "echo $i > f$i; done")
    refused(busybox.archive("/work/many"), tmp_path, "many/", "50 entries",
            max_entries=settings.tree_max_entries())


def test_too_many_bytes(busybox, tmp_path, monkeypatch):
    monkeypatch.setenv("SBX_TREE_MAX_BYTES", "1MiB")
    busybox.sh("mkdir -p /work/big && head -c 700000 /dev/zero > /work/big/one && "
               "head -c 700000 /dev/zero > /work/big/two")
    refused(busybox.archive("/work/big"), tmp_path, "big/", "1048576 bytes",
            max_bytes=settings.tree_max_bytes())


def test_a_bad_setting_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("SBX_TREE_MAX_ENTRIES", "many")
    with pytest.raises(BadInput, match="SBX_TREE_MAX_ENTRIES"):
        settings.tree_max_entries()


# -- a benign tree goes in and comes back as it was -------------------------------------------


def test_a_benign_tree_round_trips(busybox, tmp_path):
    local = tmp_path / "tree"
    (local / "sub" / "deeper").mkdir(parents=True)
    (local / "empty").mkdir()
    (local / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (local / "run.sh").chmod(0o755)
    (local / "secret").write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    (local / "secret").chmod(0o600)
    (local / "sub" / "deeper" / "note.txt").write_text("note\n")
    (local / "sub").chmod(0o750)
    (local / "link").symlink_to("sub/deeper/note.txt")
    (local / "sub" / "up").symlink_to("../run.sh")

    async def upload() -> None:
        async def chunks():
            for chunk in pack_tree(local):
                yield chunk
        await busybox.adapter.put_archive(busybox.ref, "/work/in", chunks())

    busybox.run(upload())
    assert busybox.sh("cat /work/in/tree/link && ls -ld /work/in/tree/empty").stdout \
        .startswith(b"note\n")
    dest = tmp_path / "back"
    report = extract_tree(iter(busybox.archive("/work/in/tree")), dest)
    assert report["entries"] == len(everything_under(local)) + 1  # and the top
    assert report["bytes"] == 3 * 1024 * 1024 + 7 + len("#!/bin/sh\necho hi\n") + len("note\n")
    back = dest / "tree"
    assert everything_under(back) == everything_under(local)
    for path in local.rglob("*"):
        twin = back / path.relative_to(local)
        mine, theirs = os.lstat(path), os.lstat(twin)
        assert stat.S_IFMT(mine.st_mode) == stat.S_IFMT(theirs.st_mode), path
        if path.is_symlink():
            assert os.readlink(twin) == os.readlink(path)
            continue
        assert stat.S_IMODE(theirs.st_mode) == stat.S_IMODE(mine.st_mode), path
        assert int(theirs.st_mtime) == int(mine.st_mtime), path
        if path.is_file():
            assert twin.read_bytes() == path.read_bytes()
    assert list((back / "empty").iterdir()) == []


def test_pack_tree_of_one_file_and_what_it_leaves_out(tmp_path):
    """A single file packs as one entry named by its base name; a socket or a pipe in a
    folder is left out, a link is kept as a link (never followed)."""
    one = tmp_path / "report.txt"
    one.write_bytes(b"x" * 5000)
    one.chmod(0o604)
    report = extract_tree(pack_tree(one), tmp_path / "out")
    assert report == {"entries": 1, "bytes": 5000}
    back = tmp_path / "out" / "report.txt"
    assert back.read_bytes() == b"x" * 5000 and stat.S_IMODE(back.stat().st_mode) == 0o604

    folder = tmp_path / "mixed"
    folder.mkdir()
    os.mkfifo(folder / "pipe")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(folder / "sock"))
    (folder / "to-outside").symlink_to("/etc/passwd")
    try:
        packed = b"".join(pack_tree(folder))
        with tarfile.open(fileobj=io.BytesIO(packed)) as tar:
            members = {m.name: m for m in tar}
    finally:
        listener.close()
    assert sorted(members) == ["mixed", "mixed/to-outside"]
    assert members["mixed/to-outside"].issym()
    assert members["mixed/to-outside"].linkname == "/etc/passwd"
    with pytest.raises(BadInput, match="does not exist"):
        next(iter(pack_tree(tmp_path / "nothing")))


# -- a download's one top entry: every link lands inside it (review of issue 31) -------------


def test_a_link_to_a_sibling_of_the_top_entry_is_refused(busybox, tmp_path):
    """`download` moves the top entry to its destination: a link that stays inside the
    staging folder but leaves `proj` (../.ssh/...) would point out of the destination."""
    busybox.sh("mkdir -p /w/proj && echo ok > /w/proj/ok && "
               "ln -s ../.ssh/authorized_keys /w/proj/notes.txt")
    chunks = busybox.archive("/w/proj")
    extract_tree(iter(chunks), tmp_path / "plain")  # without a top entry: inside the folder
    dest = tmp_path / "a" / "b" / "dest"
    dest.parent.mkdir(parents=True)
    with pytest.raises(BadInput, match="'proj/notes.txt' is a link pointing out") as caught:
        extract_tree(iter(chunks), dest, top="proj")
    assert caught.value.exit_code == 2 and "\n" not in str(caught.value)
    assert everything_under(tmp_path / "a") == {"b"}


def test_a_top_entry_that_is_a_link_or_a_stranger_is_refused(busybox, tmp_path):
    busybox.sh("mkdir -p /w && ln -s . /w/top && echo x > /w/other")
    refused_top = tmp_path / "one"
    with pytest.raises(BadInput, match="'top' is a link at the top of the tree"):
        extract_tree(iter(busybox.archive("/w/top")), refused_top, top="top")
    assert not refused_top.exists()
    with pytest.raises(BadInput, match="'other' is outside 'top'"):
        extract_tree(iter(busybox.archive("/w/other")), tmp_path / "two", top="top")
    assert not (tmp_path / "two").exists()


# -- headers that lie: crafted with Python in the sandbox ---------------------------------------

LYING = """
import sys, tarfile
def header(name, kind, size):
    info = tarfile.TarInfo(name); info.type = kind; info.size = size; info.mode = 0o755
    return info.tobuf(tarfile.USTAR_FORMAT)
out = sys.stdout.buffer
N = 8 << 20
out.write(header("top", tarfile.DIRTYPE, N))  # a folder declaring N bytes it never stores
out.write(header("././@LongLink", tarfile.GNUTYPE_LONGNAME, N - 4096))
out.write(b"a" * (N - 4096))
out.write(header("x", tarfile.REGTYPE, 0) + bytes(1024))
"""


def test_a_folder_declaring_data_cannot_widen_the_next_header(debian, tmp_path):
    """A folder's declared size used to give the next header that much room: a long-name
    header of 8 MiB was then read into memory (and failed with a raw OSError)."""
    debian.sh(f"cat > /tmp/lying.py <<'PY'\n{LYING}\nPY")
    refused(debian.tar_from("python3 /tmp/lying.py"), tmp_path, "top",
            "is not a file yet declares 8388608 bytes")


def test_a_file_name_this_machine_cannot_hold_is_refused_in_one_line(debian, tmp_path):
    """A name too long here, or a file where a folder is needed: BadInput naming the entry,
    no local path, nothing left."""
    long = "n" * 300
    chunks = debian.tar_from(f"mkdir -p /w/t && cd /w && echo ok > t/ok && echo x > t/long "
                             f"&& tar -cf - --transform 's,^t/long$,t/{long},' t/ok t/long")
    refused(chunks, tmp_path, f"t/{long}", "cannot be written here (File name too long)")
    chunks = debian.tar_from("mkdir -p /w/f && cd /w/f && echo ok > a && mkdir d && echo x > "
                             "d/b && tar -cf /tmp/x.tar a && "
                             "tar -rf /tmp/x.tar --transform 's,^d/,a/,' d/b && cat /tmp/x.tar")
    refused(chunks, tmp_path / "again", "a/b", "cannot be written here (")
    assert str(tmp_path) not in "".join(everything_under(tmp_path))


READER_BAITS = {
    "a negative pax size": """
import sys, tarfile
rec = b" size=-5\\n"; rec = str(len(rec) + 2).encode() + rec
pax = tarfile.TarInfo("././@PaxHeader"); pax.type = tarfile.XHDTYPE; pax.size = len(rec)
f = tarfile.TarInfo("f"); f.size = 3
sys.stdout.buffer.write(pax.tobuf(tarfile.USTAR_FORMAT) + rec + bytes(-len(rec) % 512)
                        + f.tobuf(tarfile.USTAR_FORMAT) + b"abc" + bytes(509 + 1024))
""",
    "a 1 MiB long name": """
import sys, tarfile
long = tarfile.TarInfo("././@LongLink"); long.type = tarfile.GNUTYPE_LONGNAME
long.size = 1 << 20
f = tarfile.TarInfo("f"); f.size = 3
sys.stdout.buffer.write(long.tobuf(tarfile.USTAR_FORMAT) + b"a" * (1 << 20)
                        + f.tobuf(tarfile.USTAR_FORMAT) + b"abc" + bytes(509 + 1024))
""",
}


@pytest.mark.parametrize("bait", list(READER_BAITS))
def test_the_file_readers_tar_parser_refuses_lying_headers(debian, bait):
    """files.read parses the tar a backend's `tar` sends (ssh, modal, the docker fallback):
    a negative size used to loop forever without awaiting (the core's loop frozen), a long
    name was held whole whatever its size."""
    from sandboxer.core.lifecycle.files import _Reader
    from sandboxer.core.rules.errors import OperationFailed

    debian.sh(f"cat > /tmp/bait.py <<'PY'\n{READER_BAITS[bait]}\nPY")
    chunks = debian.tar_from("python3 /tmp/bait.py")

    async def read() -> None:
        async def source():
            for chunk in chunks:
                yield chunk

        reader = _Reader(source())
        member = await reader.member()
        pieces = 0
        async for _ in reader.data(member.size):
            pieces += 1
            assert pieces < 1000, "the reader yields empty pieces forever"

    with pytest.raises(OperationFailed, match="pax size|long-name") as caught:
        debian.run(asyncio.wait_for(read(), 30))
    assert "\n" not in str(caught.value)
