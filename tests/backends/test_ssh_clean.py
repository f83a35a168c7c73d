"""A host is never handed out dirty (docs/adapters.md, "Leases"): before the ssh backend
releases a lease, every process of the lease's user ends and what that user left in /tmp,
/var/tmp and /dev/shm is removed, so the next lessee of the host meets neither. Another
user's processes and files are left alone.

The host is this machine, through a real OpenSSH server (tests/sshd.py) that admits a user
of its own, made for the test (with a uid no one else uses) and removed after it: a lessee
as root would be every process of the machine."""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sshd import SSHServer, start_sshd
from support import write_profile

pytestmark = pytest.mark.sshd


def processes_of(uid: int, name: str | None = None) -> list[int]:
    """Live (not zombie) processes whose real uid is `uid` (and whose name is `name`)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = dict(line.split(":", 1) for line in
                          (entry / "status").read_text().splitlines() if ":" in line)
            if int(fields["Uid"].split()[0]) != uid or fields["State"].split()[0] in "ZX":
                continue
            if name is None or fields["Name"].strip() == name:
                found.append(int(entry.name))
    return found


def wait_until(condition, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        time.sleep(0.05)


@pytest.fixture
def lessee_host(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[SSHServer, str, int]]:
    """(an sshd on 127.0.0.1 admitting only a user made for this test, its name, its uid)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd, to make a user of its own for the lessee")
    taken = {p.pw_uid for p in pwd.getpwall()}
    uid = next(u for u in random.sample(range(420_000, 480_000), 100) if u not in taken)
    name = f"sbxl{uid}"
    # "*": no password, but not locked ("!"), which sshd refuses even a key for
    subprocess.run(["useradd", "-u", str(uid), "-M", "-d", "/", "-s", "/bin/sh",
                    "-p", "*", name],
                   check=True, capture_output=True)
    folder = Path(tempfile.mkdtemp(prefix="sbx-sshd-"))
    server = None
    try:
        folder.chmod(0o755)  # sshd reads authorized_keys as the user it admits
        with monkeypatch.context() as env:
            env.setenv("LOGNAME", name)  # the user start_sshd admits (getpass.getuser())
            server = start_sshd(folder / "sshd")
        (folder / "sshd").chmod(0o755)
        (folder / "sshd" / "authorized_keys").chmod(0o644)
        yield server, name, uid
    finally:
        if server is not None:
            server.stop()
        for pid in processes_of(uid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not processes_of(uid), 30, f"processes of uid {uid} gone")
        for top in ("/tmp", "/var/tmp", "/dev/shm"):
            for entry in Path(top).iterdir():
                with contextlib.suppress(OSError):
                    if entry.lstat().st_uid == uid:
                        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() \
                            else entry.unlink()
        subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def test_the_next_lessee_meets_no_process_and_no_file_of_the_last(sbx, tmp_path, lessee_host):
    server, name, uid = lessee_host
    entry = server.inventory_entry("only", server.port, {"pool": "clean"})
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump({"hosts": [entry]}))
    options = {"inventory": str(tmp_path / "hosts.yaml"), "connect_timeout": 5}
    profile = write_profile(tmp_path, "attach", "backend: ssh\nnetwork: {mode: full}\n"
                            "resources: {memory: null, pids: null}\n"
                            + yaml.safe_dump({"options": options}))
    tag = f"sbx-clean-{os.getpid()}-{uid}"
    left = [Path(f"/tmp/{tag}-secret"), Path(f"/tmp/{tag}-dir"), Path(f"/var/tmp/{tag}"),
            Path(f"/dev/shm/{tag}")]
    others = Path(f"/tmp/{tag}-root")  # another user's file, left alone
    others.write_text("root's\n")
    bystander = subprocess.Popen(["sleep", "1000"])  # another user's process, left alone
    try:
        first = sbx.create("--profile-file", str(profile))
        ran = sbx("exec", first["id"], "--", "sh", "-c",
                  "setsid sleep 1000 </dev/null >/dev/null 2>&1 & "
                  "(trap '' HUP; exec sleep 1001) </dev/null >/dev/null 2>&1 & "
                  f"echo secret > {left[0]} && mkdir -p {left[1]}/deep && "
                  f"echo x > {left[1]}/deep/f && echo x > {left[2]} && echo x > {left[3]}")
        assert ran.code == 0, ran.err
        wait_until(lambda: len(processes_of(uid, "sleep")) == 2, 30, "the lessee's sleeps")
        assert all(p.exists() for p in left)

        gone = sbx("destroy", first["id"])
        assert gone.code == 0, gone.err

        assert processes_of(uid, "sleep") == []
        assert [p for p in left if os.path.lexists(p)] == []
        assert others.read_text() == "root's\n" and bystander.poll() is None

        second = sbx.create("--profile-file", str(profile))
        assert second["id"] != first["id"]
        seen = sbx("exec", second["id"], "--", "sh", "-c",
                   f"ls -d /tmp/{tag}-* /var/tmp/{tag} /dev/shm/{tag} 2>/dev/null; "
                   # an ended process its parent (pid 1 here) has not yet waited for is a
                   # zombie: it runs nothing, and init may reap it late; a live one counts
                   f"ps -u {name} -o stat=,comm= | grep -v '^Z' | grep -wo sleep; true")
        assert seen.code == 0, seen.err
        assert seen.out.split() == [str(others)]  # root's file only: nothing of the last lessee
        assert sbx("destroy", second["id"]).code == 0
    finally:
        bystander.kill()
        bystander.wait(10)
        others.unlink(missing_ok=True)
