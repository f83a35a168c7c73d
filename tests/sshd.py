"""A real OpenSSH server (Debian's openssh-server) on 127.0.0.1, for the ssh backend's tests
and anything else that needs an SSH host (Docker over ssh://, say).

`start_sshd(folder, ports=N)` generates a host key and a client key in `folder`, writes an
sshd_config that listens on N free ports of 127.0.0.1 (one server, N addresses: an inventory
can list it as N different hosts), admits only the current user with that key, and starts
`sshd -D` as a child of the test process. `SSHServer.stop()` kills it and the per-connection
sshd processes it forked (they leave its process group, so they are found by parent id).

The fixture `sshd_server` (session scope) yields a running SSHServer with three ports.
Use it from a test module with `from sshd import sshd_server  # noqa: F401`.

What an SSHServer gives a test:
- `host` ("127.0.0.1"), `port` (the first), `ports` (all), `user`, `key` (the private key),
  `known_hosts` (the server's key for every port), `url(port)` = "ssh://user@127.0.0.1:port";
- `ssh_config`: an ssh client config for 127.0.0.1 (user, key, known hosts, BatchMode);
- `client_bin`: a folder holding an `ssh` that is the system client with that config: put it
  first on PATH and anything that runs plain `ssh` (the docker CLI or docker-py with
  `use_ssh_client=True`, for DOCKER_HOST=ssh://user@127.0.0.1:PORT) reaches the server. (The
  OpenSSH client reads ~/.ssh from the passwd entry, not $HOME, so HOME cannot redirect it.)
- `client_home`: a folder with `.ssh/config`, `.ssh/id_ed25519` and `.ssh/known_hosts`, for
  libraries that do honour $HOME (paramiko);
- `ssh_argv(port)`: the full `ssh ... user@127.0.0.1` prefix with explicit options;
- `inventory_entry(name, port, labels)`: one host of an ssh backend inventory (its host key
  pinned by `known_hosts:`), `host_public_key` (for `host_key:`);
- `restart_with_new_host_key()`: the same ports, another host key (a "changed" host).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SSHD = os.environ.get("SBX_TEST_SSHD", "/usr/sbin/sshd")
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True)


def _answers(port: int) -> bool:
    """The port speaks SSH (sends its banner)."""
    try:
        with socket.create_connection((HOST, port), timeout=1) as sock:
            return sock.recv(4).startswith(b"SSH-")
    except OSError:
        return False


@dataclass
class SSHServer:
    folder: Path
    ports: list[int]
    user: str
    key: Path
    known_hosts: Path
    client_home: Path
    process: subprocess.Popen
    host: str = HOST
    log: Path = field(default=Path())

    @property
    def ssh_config(self) -> Path:
        return self.client_home / ".ssh" / "config"

    @property
    def client_bin(self) -> Path:
        return self.folder / "client-bin"

    @property
    def port(self) -> int:
        return self.ports[0]

    def url(self, port: int | None = None) -> str:
        return f"ssh://{self.user}@{self.host}:{port or self.port}"

    def ssh_argv(self, port: int | None = None) -> list[str]:
        return ["ssh", "-F", "none", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                "-i", str(self.key), "-p", str(port or self.port), f"{self.user}@{self.host}"]

    def inventory_entry(self, name: str, port: int | None = None,
                        labels: dict[str, str] | None = None) -> dict:
        """One host of an ssh backend inventory, pointing at this server."""
        return {"name": name, "host": self.host, "port": port or self.port, "user": self.user,
                "key": str(self.key), "known_hosts": str(self.known_hosts),
                "labels": dict(labels or {})}

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes this server forked (their parent is the server)."""
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                if ppid == self.process.pid:
                    pids.append(int(entry.name))
        return pids

    def restart_with_new_host_key(self) -> None:
        """The same server on the same ports with a host key of its own: to a client, the
        host's key changed (a reinstalled machine, or someone in between)."""
        self.stop()
        host_key = self.folder / "ssh_host_ed25519_key"
        for path in (host_key, host_key.with_suffix(".pub")):
            path.unlink()
        _keygen(host_key, "sbx-test-host-new")
        with self.log.open("ab") as log_file:
            self.process = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.folder / "sshd_config")],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file)
        _wait_until_up(self)

    @property
    def host_public_key(self) -> str:
        """The server's host key as an inventory's `host_key:` pins it ("ssh-ed25519 AAAA...")."""
        kind, blob = (self.folder / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        return f"{kind} {blob}"

    def stop(self) -> None:
        """Kill the server and its connections: clients see the hosts go away."""
        if self.process.poll() is not None:
            return
        sessions = self.session_pids()
        self.process.kill()
        self.process.wait(timeout=10)
        for pid in sessions:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def start_sshd(folder: Path, ports: int = 1) -> SSHServer:
    """Start an OpenSSH server on `ports` free ports of 127.0.0.1; its state lives in `folder`."""
    if not os.access(SSHD, os.X_OK):
        raise RuntimeError(f"no OpenSSH server at {SSHD}: run `make sshd` "
                           "(scripts/ensure-sshd.sh), or set SBX_TEST_SSHD")
    folder.mkdir(parents=True, exist_ok=True)
    user = getpass.getuser()
    host_key, key = folder / "ssh_host_ed25519_key", folder / "id_ed25519"
    _keygen(host_key, "sbx-test-host")
    _keygen(key, "sbx-test-client")
    authorized = folder / "authorized_keys"
    shutil.copy(key.with_suffix(".pub"), authorized)
    authorized.chmod(0o600)
    if os.geteuid() == 0:  # sshd run by root needs its privilege separation folder
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    numbers = []
    while len(numbers) < ports:
        port = free_port()
        if port not in numbers:
            numbers.append(port)
    config = folder / "sshd_config"
    config.write_text("".join(f"ListenAddress {HOST}:{p}\n" for p in numbers) + (
        f"HostKey {host_key}\n"
        f"PidFile {folder / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {authorized}\n"
        f"AllowUsers {user}\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "MaxStartups 200\n"
        "MaxSessions 200\n"
        "LogLevel VERBOSE\n"
    ))
    host_public = host_key.with_suffix(".pub").read_text().split()
    known_hosts = folder / "known_hosts"
    known_hosts.write_text("".join(f"[{HOST}]:{p} {host_public[0]} {host_public[1]}\n"
                                   for p in numbers))
    client_home = folder / "client-home"
    dot_ssh = client_home / ".ssh"
    dot_ssh.mkdir(parents=True, mode=0o700)
    shutil.copy(key, dot_ssh / "id_ed25519")
    (dot_ssh / "id_ed25519").chmod(0o600)
    shutil.copy(known_hosts, dot_ssh / "known_hosts")
    (dot_ssh / "config").write_text(
        f"Host {HOST}\n  User {user}\n  IdentityFile {dot_ssh / 'id_ed25519'}\n"
        f"  IdentitiesOnly yes\n  UserKnownHostsFile {dot_ssh / 'known_hosts'}\n"
        "  StrictHostKeyChecking yes\n  BatchMode yes\n")
    client_bin = folder / "client-bin"
    client_bin.mkdir()
    wrapper = client_bin / "ssh"
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {dot_ssh / "config"} "$@"\n')
    wrapper.chmod(0o755)
    log = folder / "sshd.log"
    with log.open("ab") as log_file:
        process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                                   stdout=log_file, stderr=log_file)
    server = SSHServer(folder, numbers, user, key, known_hosts, client_home, process, log=log)
    _wait_until_up(server)
    return server


def _wait_until_up(server: SSHServer) -> None:
    deadline = time.monotonic() + 60
    while not all(_answers(p) for p in server.ports):
        if server.process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"sshd did not start on {server.ports}: "
                               f"{server.log.read_text()[-2000:]}")
        time.sleep(0.02)


@pytest.fixture(scope="session")
def sshd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHServer]:
    """A running OpenSSH server on three ports of 127.0.0.1, killed at the end of the session."""
    server = start_sshd(tmp_path_factory.mktemp("sshd"), ports=3)
    yield server
    server.stop()
