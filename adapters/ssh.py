"""The ssh backend ("attach"): a sandbox is a lease on a host that already exists.

Hosts are listed in an inventory file (YAML: host, port, user, key, labels), or are the builds
of a Packer manifest (`options: {packer_manifest: PATH, build: NAME}`: the manifest
post-processor's file, read again at each create); a profile picks them by labels
(`options: {match: {pool: ci}}`). Create leases a free matching host, checks
that it answers and runs the profile's setup commands on it; exec runs commands over SSH and
returns their exit codes (with env, a working folder and stdin streamed over the session; a
timeout ends every process the command started, found by a mark in their environment, and
keeps the output produced until then; files go in and out as tar over the same session); destroy runs the cleanup commands, ends the user's processes and
removes its temporary files (SWEEP), and releases the host.

Leases are rows of a small SQLite file of this adapter's own (`$SBX_HOME/ssh-leases.db`), one
per host address (user@host:port, the primary key), taken inside BEGIN IMMEDIATE: two sbx
processes never lease the same host, and a lease outlives the process that took it. Each lease
carries the sandbox's labels, so reconcile and the reaper see leased hosts as they see
containers. The lease keeps everything destroy and exec need (address, key, cleanup
commands), so they work without the profile or the inventory.

SSH is the system OpenSSH client (BatchMode, ConnectTimeout, keep-alives), so the user's own
ssh config (jump hosts, certificates, agents) applies. Host keys are checked strictly against
the user's known hosts (~/.ssh/known_hosts of $HOME, the system's /etc/ssh/ssh_known_hosts)
and sbx's own file; a key pinned in the entry (`host_key:` or a `known_hosts:` file) is the
only one accepted; first use is trusted only where the entry says `host_key_policy: tofu`. One ControlMaster per host, persisting
a minute, is shared by every sbx process: a command after the first costs no handshake, and a
255 from the client is told apart from a command's own exit status 255 by asking the master.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import fcntl
import getpass
import hashlib
import json
import math
import os
import shlex
import shutil
import signal
import sqlite3
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandboxer.adapters.base import (
    EXEC_MARK,
    KILL_MARKED,
    Adapter,
    AdapterError,
    BackendObject,
    BackendObjectGone,
    BackendUnavailable,
    CallerStdin,
    Capability,
    CapabilityNotSupported,
    CreateRequest,
    ExecResult,
    Health,
    InvalidRequest,
    PtyChannel,
    Stdin,
    state_folder,
)

INVENTORY_ENV = "SBX_SSH_INVENTORY"
LEASES_ENV = "SBX_SSH_LEASES"  # a lease file shared by several SBX_HOMEs on one machine
OPTIONS = frozenset({"inventory", "match", "setup", "cleanup", "connect_timeout",
                     "command_timeout", "packer_manifest", "build", "packer_run"})
ENTRY_FIELDS = frozenset({"name", "host", "port", "user", "key", "known_hosts", "host_key",
                          "host_key_policy", "labels"})
STRICT, TOFU = "strict", "tofu"  # host_key_policy: known keys only / trust on first use
HOST_KEY_TYPES = frozenset({
    "ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com"})
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_COMMAND_TIMEOUT = 600.0
CONTROL_PERSIST_S = 60
LOCK_WAIT_S = 60.0
LEASED, RELEASING = "leased", "releasing"
PID_MARKER = b"sbx-pid "
# An exec's variables (values are secrets) come first on its stdin, never on a command line
# the host's process list or sshd's log would show: one NAME=<base64 of the value> line each,
# then an empty line; the rest of stdin is the command's. `read` takes a pipe a byte at a
# time, so none of the command's input is consumed here.
READ_ENV_THEN_EXEC = r"""command -v base64 >/dev/null 2>&1 || {
  echo "sbx: the host has no base64, which exec needs to pass variables" >&2; exit 126; }
while IFS= read -r line && [ -n "$line" ]; do
  v=$(printf %s "${line#*=}" | base64 -d && echo x) || exit 126
  export "${line%%=*}=${v%x}"
done
printf "sbx-pid %s\n" "$$" >&2
exec "$@"
"""
STREAM_CHUNK = 64 * 1024
# A terminal's variables go as exec's do, on its input, never on a command line; but its
# input is a terminal, which would echo them and cut them at a line's length. So the remote
# shell first makes its terminal raw and silent, says so (PTY_READY), reads the variables,
# puts the terminal back as it was, says so (PTY_GO), then becomes the program. What came
# before PTY_GO (a login shell's words, the markers) is not the program's output.
PTY_READY, PTY_GO = b"sbx-pty-ready", b"sbx-pty-go"
READ_ENV_ON_TTY = r"""saved=$(stty -g) && stty raw -echo || exit 126
printf 'sbx-pty-ready\n'
while IFS= read -r line && [ -n "$line" ]; do
  v=$(printf %s "${line#*=}" | base64 -d && echo x) || { stty "$saved"; exit 126; }
  export "${line%%=*}=${v%x}"
done
stty "$saved"
printf 'sbx-pty-go\n'
exec "$@"
"""
NO_CLIENT = "no OpenSSH client (`ssh`) on PATH: install it (on Debian: apt-get install openssh-client)"
# Run on the host (POSIX sh, Linux /proc) as a lease ends, after the profile's cleanup, so the
# next lessee meets nothing of this one: every process of the user ends but this script's own
# session (its ancestors: the ssh connection carrying it), in rounds until none is left (a
# process may fork while it is killed), and what the user owns in the shared temporary
# folders goes. Nothing forks in the rounds, so nothing of the script's own is killed. Not
# for root, whose processes are the host's own.
SWEEP = r"""
me=$(id -u)
[ "$me" = 0 ] && exit 0
keep=" " p=$$
while [ -n "$p" ] && [ "$p" -gt 1 ]; do
  keep="$keep$p " next=
  while read -r key value _; do
    if [ "$key" = PPid: ]; then next=$value; break; fi
  done < "/proc/$p/status"
  p=$next
done
round=0 left=1
while [ -n "$left" ] && [ "$round" -lt 100 ]; do
  round=$((round + 1)) left=
  for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    case "$keep" in *" $pid "*) continue ;; esac
    state= uids=
    { while read -r key a b _; do
        case "$key" in State:) state=$a ;; Uid:) uids=" $a $b "; break ;; esac
      done < "$dir/status"; } 2>/dev/null
    case "$state" in Z|X|"") continue ;; esac
    case "$uids" in *" $me "*) kill -KILL "$pid" 2>/dev/null && left=1 ;; esac
  done
  [ -n "$left" ] && { sleep 0.05 2>/dev/null || sleep 1; }
done
if [ -n "$left" ]; then echo "processes of uid $me would not end" >&2; exit 1; fi
for dir in /tmp /var/tmp /dev/shm; do
  [ -d "$dir" ] || continue
  find "$dir" -xdev -mindepth 1 -user "$me" -prune -exec rm -rf -- {} + 2>/dev/null
  if [ -n "$(find "$dir" -xdev -mindepth 1 -user "$me" -print 2>/dev/null | head -n 1)" ]; then
    echo "cannot remove what uid $me left in $dir" >&2; exit 1
  fi
done
"""


# Volumes (docs/volumes.md): a folder <home>/.sbx/volumes/<volume id> on one host of the
# backend's inventory, its data in `volume/` beside sbx's mark `sbx-volume.json` (its
# labels): only a folder carrying the mark is ever removed. Files reach it without a
# sandbox through a helper ref (HELPER_PREFIX + the volume's ref) whose /volume is that
# folder; a sandbox on that host sees it at the mount's path through a bind mount
# (read-only: remounted ro), which needs the inventory user to be root there.
VOLUMES_DIR = ".sbx/volumes"
VOLUME_MARK = "sbx-volume.json"
HELPER_PREFIX = "volume:"
HELPER_ROOT = "/volume"
MAKE_VOLUME = r"""set -e
d="$HOME/.sbx/volumes/$1"
mkdir -p "$d/volume"
chmod 700 "$HOME/.sbx/volumes" "$d"
cat > "$d/sbx-volume.json"
cd "$d" && pwd -P
"""
REMOVE_VOLUME = r"""d=$1
[ -e "$d" ] || exit 0
[ -f "$d/sbx-volume.json" ] || { echo "not one of sbx's volumes (no sbx-volume.json)" >&2; exit 3; }
rm -rf -- "$d"
"""
VOLUME_SIZE = r"""if out=$(du -sb "$1/volume" 2>/dev/null); then echo "b ${out%%[!0-9]*}"
else out=$(du -sk "$1/volume") && echo "k ${out%%[!0-9]*}"; fi
"""
MOUNT_VOLUME = r"""[ "$(id -u)" = 0 ] || { echo "a bind mount needs root" >&2; exit 3; }
[ -d "$1" ] || { echo "the volume's folder is gone" >&2; exit 4; }
made=
if [ ! -e "$2" ]; then mkdir -p "$2" || exit 1; made=1; fi
if ! mount --bind "$1" "$2"; then [ -n "$made" ] && rmdir "$2"; exit 1; fi
if [ -n "$3" ] && ! mount -o remount,bind,ro "$2"; then
  umount "$2"; [ -n "$made" ] && rmdir "$2"; exit 1
fi
echo "made=$made"
"""
UNMOUNT_VOLUME = r"""umount "$1" 2>/dev/null || umount -l "$1" 2>/dev/null
if mountpoint -q "$1" 2>/dev/null; then echo "still mounted" >&2; exit 1; fi
[ -z "$2" ] || rmdir "$1" 2>/dev/null
exit 0
"""


class BadConfiguration(InvalidRequest):
    """The inventory or the profile's ssh options are wrong: exit 2, nothing written."""


# -- the inventory --------------------------------------------------------------------------


@dataclass(frozen=True)
class Host:
    """One inventory entry: a machine (or an account on one) that can be leased whole."""

    name: str
    host: str
    port: int = 22
    user: str = ""
    key: str | None = None
    known_hosts: str | None = None
    host_key: tuple[str, ...] = ()  # pinned public keys ("ssh-ed25519 AAAA...")
    host_key_policy: str = STRICT
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def describe(self) -> str:
        return f"{self.name!r} ({self.address})"


def _text_mapping(value: Any, where: str, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str | int | float | bool) for k, v in value.items()):
        raise BadConfiguration(f"{where}: {what} must be a mapping of names to plain values")
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}


def _existing_file(value: Any, folder: Path, where: str, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise BadConfiguration(f"{where}: {what} must be a file path")
    path = Path(value).expanduser()
    path = path if path.is_absolute() else folder / path
    if not path.is_file():
        raise BadConfiguration(f"{where}: {what} file {path} does not exist")
    return str(path)


def _host_keys(value: Any, where: str) -> tuple[str, ...]:
    """Public keys as a host's /etc/ssh/ssh_host_*_key.pub or `ssh-keyscan` give them."""
    if value is None:
        return ()
    keys = [value] if isinstance(value, str) else value
    if not isinstance(keys, list) or not keys:
        raise BadConfiguration(f"{where}: host_key must be a public key (or a list of them)")
    found = []
    for key in keys:
        parts = key.split() if isinstance(key, str) else []
        try:
            blob = base64.b64decode(parts[1], validate=True) if len(parts) >= 2 else b""
        except (binascii.Error, ValueError):
            blob = b""
        kind = parts[0] if parts else ""
        if kind not in HOST_KEY_TYPES or blob[4:4 + len(kind)] != kind.encode():
            raise BadConfiguration(
                f"{where}: host_key {str(key)[:40]!r} is not a public key (expected "
                "'ssh-ed25519 AAAA...', as in the host's /etc/ssh/ssh_host_ed25519_key.pub)")
        found.append(f"{kind} {parts[1]}")
    return tuple(found)


def _entry(file: Path, index: int, raw: Any, where: str | None = None) -> Host:
    where = where or f"ssh inventory {file}: host #{index}"
    if not isinstance(raw, Mapping):
        raise BadConfiguration(f"{where} must be a mapping (host, port, user, key, labels)")
    name = raw.get("name")
    if name is not None:
        if not isinstance(name, str) or not name.strip():
            raise BadConfiguration(f"{where}: name must be a non-empty text")
        where = f"{where} ({name!r})"
    unknown = sorted(set(raw) - ENTRY_FIELDS, key=str)
    if unknown:
        raise BadConfiguration(f"{where}: unknown field {', '.join(map(str, unknown))} "
                               f"(known: {', '.join(sorted(ENTRY_FIELDS))})")
    host = raw.get("host")
    if not isinstance(host, str) or not host.strip():
        raise BadConfiguration(f"{where}: no host (give the address or name to ssh to)")
    port = raw.get("port", 22)
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise BadConfiguration(f"{where}: port must be a number from 1 to 65535, not {port!r}")
    user = raw.get("user") or getpass.getuser()
    if not isinstance(user, str):
        raise BadConfiguration(f"{where}: user must be a text, not {user!r}")
    for what, value in (("host", host), ("user", user)):
        if value.startswith("-") or any(c.isspace() for c in value):
            raise BadConfiguration(f"{where}: {what} {value!r} is not a valid ssh {what}")
    policy = raw.get("host_key_policy", STRICT)
    if policy not in (STRICT, TOFU):
        raise BadConfiguration(f"{where}: host_key_policy must be {STRICT!r} (known keys only, "
                               f"the default) or {TOFU!r} (trust the first key seen), not {policy!r}")
    host_key = _host_keys(raw.get("host_key"), where)
    known_hosts = _existing_file(raw.get("known_hosts"), file.parent, where, "known_hosts")
    if policy == TOFU and (host_key or known_hosts):
        raise BadConfiguration(f"{where}: host_key_policy: tofu trusts the first key seen, but "
                               "host_key/known_hosts already pin it: keep one of them")
    return Host(
        name=name or (host if port == 22 else f"{host}:{port}"),
        host=host, port=port, user=user,
        key=_existing_file(raw.get("key"), file.parent, where, "key"),
        known_hosts=known_hosts, host_key=host_key, host_key_policy=policy,
        labels=_text_mapping(raw.get("labels"), where, "labels"),
    )


def load_inventory(path: str) -> list[Host]:
    """The hosts of an inventory file; BadConfiguration (exit 2) naming the entry at fault."""
    import yaml

    file = Path(path).expanduser().resolve()
    try:
        data = yaml.safe_load(file.read_text())
    except OSError as exc:
        raise BadConfiguration(f"ssh inventory {file}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise BadConfiguration(f"ssh inventory {file}:{line} invalid YAML: "
                               f"{getattr(exc, 'problem', None) or exc}") from None
    if isinstance(data, Mapping):
        extra = sorted(set(data) - {"hosts"}, key=str)
        if extra:
            raise BadConfiguration(f"ssh inventory {file}: unknown top-level field "
                                   f"{', '.join(map(str, extra))} (expected hosts:)")
        data = data.get("hosts")
    if not isinstance(data, list) or not data:
        raise BadConfiguration(f"ssh inventory {file}: expected a list of hosts under 'hosts:'")
    return _distinct(f"ssh inventory {file}",
                     [_entry(file, index, raw) for index, raw in enumerate(data, 1)])


def _distinct(where: str, hosts: list[Host]) -> list[Host]:
    names: dict[str, Host] = {}
    addresses: dict[str, Host] = {}
    for h in hosts:
        if h.name in names:
            raise BadConfiguration(f"{where}: two hosts are named {h.name!r}")
        if h.address in addresses:
            raise BadConfiguration(
                f"{where}: hosts {addresses[h.address].name!r} and {h.name!r} are "
                f"the same address {h.address} (a host is leased whole; list it once)")
        names[h.name], addresses[h.address] = h, h
    return hosts


# -- a Packer manifest ------------------------------------------------------------------------

# custom_data keys that say how to reach a build's host (as an inventory entry's fields); the
# others, with the build's builder_type and artifact_id, are the host's labels (for `match:`)
MANIFEST_HOST_FIELDS = ("host", "port", "user", "key", "known_hosts", "host_key",
                        "host_key_policy")


def load_packer_manifest(path: str, builds: Sequence[str] = (), run: str | None = None,
                         ) -> list[Host]:
    """The hosts of a Packer manifest (what the manifest post-processor writes: `builds` and
    `last_run_uuid`): the builds of the last run, or of `run`, named one of `builds` (any name
    when empty); each build's `custom_data` says how to reach it. BadConfiguration (exit 2)
    naming the file and the build at fault."""
    file = Path(path).expanduser().resolve()
    what = f"packer manifest {file}"
    try:
        data = json.loads(file.read_text())
    except OSError as exc:
        raise BadConfiguration(f"{what}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise BadConfiguration(f"{what}: not JSON: {exc}") from None
    entries = data.get("builds") if isinstance(data, Mapping) else None
    if not isinstance(entries, list):
        raise BadConfiguration(f"{what}: expected the manifest post-processor's JSON (builds: "
                               "[...], last_run_uuid)")
    run = run or data.get("last_run_uuid")
    if not isinstance(run, str) or not run:
        raise BadConfiguration(f"{what}: no last_run_uuid: name the run with options.packer_run")
    runs = [b.get("packer_run_uuid") for b in entries if isinstance(b, Mapping)]
    in_run = [(i, b) for i, b in enumerate(entries, 1)
              if isinstance(b, Mapping) and b.get("packer_run_uuid") == run]
    if not in_run:
        known = ", ".join(dict.fromkeys(str(r) for r in runs)) or "none"
        raise BadConfiguration(f"{what}: no build of run {run} (runs: {known})")
    chosen = [(i, b) for i, b in in_run if not builds or b.get("name") in builds]
    if not chosen:
        names = ", ".join(dict.fromkeys(str(b.get("name")) for _, b in in_run))
        raise BadConfiguration(f"{what}: run {run} has no build named "
                               f"{' or '.join(map(repr, builds))} (its builds: {names})")
    hosts, seen = [], {}
    for index, build in chosen:
        name = build.get("name")
        if not isinstance(name, str) or not name:
            raise BadConfiguration(f"{what}: build #{index} has no name")
        seen[name] = seen.get(name, 0) + 1
        where = f"{what}: build #{index} ({name!r})"
        custom = build.get("custom_data") or {}
        if not isinstance(custom, Mapping):
            raise BadConfiguration(f"{where}: custom_data must be a mapping")
        if not custom.get("host"):
            raise BadConfiguration(f"{where}: custom_data has no host (the manifest "
                                   "post-processor's custom_data: host, port, user, key)")
        raw: dict[str, Any] = {k: custom[k] for k in MANIFEST_HOST_FIELDS if k in custom}
        port = raw.get("port")
        if isinstance(port, str):  # custom_data is text: "2222"
            raw["port"] = int(port) if port.strip().isdigit() else port
        if isinstance(raw.get("host_key"), str) and "\n" in raw["host_key"].strip():
            raw["host_key"] = raw["host_key"].split("\n")  # several keys, one a line
        labels = {k: v for k, v in custom.items() if k not in MANIFEST_HOST_FIELDS}
        for fact in ("builder_type", "artifact_id"):
            if isinstance(build.get(fact), str):
                labels[fact] = build[fact]
        raw.update(name=name if seen[name] == 1 else f"{name}#{seen[name]}", labels=labels)
        hosts.append(_entry(file, index, raw, f"{what}: build #{index}"))  # adds the name
    return _distinct(what, hosts)


# -- the profile's options ------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    inventory: str
    match: Mapping[str, str]
    setup: tuple[str, ...]
    cleanup: tuple[str, ...]
    connect_timeout: float
    command_timeout: float
    packer_manifest: str | None = None  # in place of the inventory
    build: tuple[str, ...] = ()
    packer_run: str | None = None

    @property
    def source(self) -> str:
        """Where the hosts come from, for messages."""
        if self.packer_manifest is None:
            return f"ssh inventory {self.inventory}"
        builds = f", build {' or '.join(self.build)}" if self.build else ""
        return (f"packer manifest {self.packer_manifest} (run "
                f"{self.packer_run or 'last'}{builds})")

    def hosts(self) -> list[Host]:
        """The hosts, read now: a changed inventory or manifest counts at once."""
        if self.packer_manifest is not None:
            return load_packer_manifest(self.packer_manifest, self.build, self.packer_run)
        return load_inventory(self.inventory)


def _commands(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(c, str) and c.strip() for c in value):
        raise BadConfiguration(f"options.{what} must be a list of shell commands")
    return tuple(value)


def _seconds(value: Any, what: str, default: float) -> float:
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise BadConfiguration(f"options.{what} must be a positive number of seconds, not {value!r}")
    return float(value)


def settings_from(options: Mapping[str, Any]) -> Settings:
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise BadConfiguration(f"the ssh backend has no option {', '.join(unknown)} "
                               f"(known: {', '.join(sorted(OPTIONS))})")
    manifest, build, run = (options.get("packer_manifest"), options.get("build"),
                            options.get("packer_run"))
    if manifest is not None:
        if not isinstance(manifest, str) or not manifest:
            raise BadConfiguration("options.packer_manifest must be the path of a Packer "
                                   "manifest (packer-manifest.json)")
        if options.get("inventory"):
            raise BadConfiguration("options: give inventory or packer_manifest, not both")
        if isinstance(build, str):
            build = [build]
        if build is not None and (not isinstance(build, list) or not build or not all(
                isinstance(b, str) and b for b in build)):
            raise BadConfiguration("options.build must be a build name of the manifest (or a "
                                   "list of them)")
        if run is not None and (not isinstance(run, str) or not run):
            raise BadConfiguration("options.packer_run must be a packer_run_uuid of the manifest")
    elif build is not None or run is not None:
        raise BadConfiguration("options.build and options.packer_run apply only with "
                               "options.packer_manifest")
    inventory = options.get("inventory") or os.environ.get(INVENTORY_ENV)
    if manifest is None and (not inventory or not isinstance(inventory, str)):
        raise BadConfiguration(f"the ssh backend needs an inventory file: set options.inventory "
                               f"in the profile or ${INVENTORY_ENV} (or options.packer_manifest)")
    return Settings(
        inventory="" if manifest is not None else inventory,
        packer_manifest=manifest, build=tuple(build or ()), packer_run=run,
        match=_text_mapping(options.get("match"), "options", "match"),
        setup=_commands(options.get("setup"), "setup"),
        cleanup=_commands(options.get("cleanup"), "cleanup"),
        connect_timeout=_seconds(options.get("connect_timeout"), "connect_timeout",
                                 DEFAULT_CONNECT_TIMEOUT),
        command_timeout=_seconds(options.get("command_timeout"), "command_timeout",
                                 DEFAULT_COMMAND_TIMEOUT),
    )


def matching(hosts: Sequence[Host], match: Mapping[str, str]) -> list[Host]:
    want = dict(match).items()
    return [h for h in hosts if want <= dict(h.labels).items()]


# -- leases ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lease:
    ref: str
    sandbox_id: str
    host: Host
    labels: Mapping[str, str]
    cleanup: tuple[str, ...]
    connect_timeout: float
    command_timeout: float
    state: str
    leased_at: datetime

    def object(self) -> BackendObject:
        return BackendObject(ref=self.ref, labels=dict(self.labels),
                             status="running" if self.state == LEASED else self.state,
                             running=True, created_at=self.leased_at)


@dataclass(frozen=True)
class SSHVolume:
    """A volume: the folder `folder` on `host` (the data is its `volume` subfolder)."""

    ref: str
    volume_id: str
    host: Host
    folder: str
    labels: Mapping[str, str]


class NoFreeHost(AdapterError):
    """Every matching host is leased (exit 1)."""

    @classmethod
    def of(cls, candidates: Sequence[Host], taken: Mapping[str, str],
           settings: Settings) -> NoFreeHost:
        held = ", ".join(f"{h.name} by {taken[h.address]}" for h in candidates)
        return cls(f"no free ssh host: all {len(candidates)} host(s) matching "
                   f"{dict(settings.match)} in {settings.source} are leased ({held})")


class LeaseStore:
    """The lease table. Each call opens its own connection: safe across fork and threads."""

    SCHEMA = """CREATE TABLE IF NOT EXISTS ssh_leases (
        address TEXT PRIMARY KEY,          -- user@host:port: one lease per host, ever
        ref TEXT NOT NULL UNIQUE,
        sandbox_id TEXT NOT NULL UNIQUE,
        host_json TEXT NOT NULL,
        labels_json TEXT NOT NULL,
        cleanup_json TEXT NOT NULL,
        connect_timeout REAL NOT NULL,
        command_timeout REAL NOT NULL,
        state TEXT NOT NULL,
        leased_at TEXT NOT NULL)"""
    # ssh volumes (docs/volumes.md): which host keeps each, and the folder it is there
    VOLUMES_SCHEMA = """CREATE TABLE IF NOT EXISTS ssh_volumes (
        ref TEXT PRIMARY KEY,              -- <host name>/<volume id>
        volume_id TEXT NOT NULL UNIQUE,
        host_json TEXT NOT NULL,
        folder TEXT NOT NULL,              -- absolute, on the host: <home>/.sbx/volumes/<id>
        labels_json TEXT NOT NULL)"""
    # the bind mounts a lease made (unmounted as it ends); made: the mount point was made
    MOUNTS_SCHEMA = """CREATE TABLE IF NOT EXISTS ssh_mounts (
        lease_ref TEXT NOT NULL,
        path TEXT NOT NULL,
        made INTEGER NOT NULL,
        PRIMARY KEY (lease_ref, path))"""

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextlib.contextmanager
    def _connect(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        fresh = not self.path.exists()
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            if fresh:
                with contextlib.suppress(OSError):
                    self.path.chmod(0o600)
            conn.row_factory = sqlite3.Row
            conn.execute(self.SCHEMA)
            conn.execute(self.VOLUMES_SCHEMA)
            conn.execute(self.MOUNTS_SCHEMA)
            if not write:
                yield conn
                return
            conn.execute("BEGIN IMMEDIATE")  # waits for a writer instead of failing later
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()

    @staticmethod
    def _lease(row: sqlite3.Row) -> Lease:
        host = json.loads(row["host_json"])
        host["host_key"] = tuple(host.get("host_key") or ())
        return Lease(
            ref=row["ref"], sandbox_id=row["sandbox_id"], host=Host(**host),
            labels=json.loads(row["labels_json"]), cleanup=tuple(json.loads(row["cleanup_json"])),
            connect_timeout=row["connect_timeout"], command_timeout=row["command_timeout"],
            state=row["state"], leased_at=datetime.fromisoformat(row["leased_at"]))

    def take(self, candidates: Sequence[Host], request: CreateRequest, settings: Settings) -> Lease:
        """Lease the first free candidate, atomically; the same sandbox asking again gets its
        own lease back (a retried create)."""
        with self._connect(write=True) as conn:
            mine = conn.execute("SELECT * FROM ssh_leases WHERE sandbox_id = ?",
                                (request.sandbox_id,)).fetchone()
            if mine is not None:
                return self._lease(mine)
            taken = {r["address"]: r["sandbox_id"] for r in conn.execute(
                "SELECT address, sandbox_id FROM ssh_leases")}
            free = [h for h in candidates if h.address not in taken]
            if not free:
                raise NoFreeHost.of(candidates, taken, settings)
            host = free[0]
            lease = Lease(ref=f"{host.name}/{request.sandbox_id}", sandbox_id=request.sandbox_id,
                          host=host, labels=dict(request.labels), cleanup=settings.cleanup,
                          connect_timeout=settings.connect_timeout,
                          command_timeout=settings.command_timeout, state=LEASED,
                          leased_at=datetime.now(UTC))
            conn.execute(
                "INSERT INTO ssh_leases VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (host.address, lease.ref, lease.sandbox_id,
                 json.dumps({**asdict(host), "labels": dict(host.labels)}),
                 json.dumps(lease.labels, sort_keys=True), json.dumps(list(lease.cleanup)),
                 lease.connect_timeout, lease.command_timeout, LEASED,
                 lease.leased_at.isoformat()))
            return lease

    def get(self, ref: str) -> Lease | None:
        if not self.path.exists():  # reading makes no file: a reap with no ssh use writes nothing
            return None
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM ssh_leases WHERE ref = ?", (ref,)).fetchone()
        return self._lease(row) if row else None

    def all(self) -> list[Lease]:
        if not self.path.exists():
            return []
        with self._connect() as conn:
            return [self._lease(r) for r in conn.execute("SELECT * FROM ssh_leases ORDER BY ref")]

    def holders(self) -> dict[str, str]:
        """address -> the sandbox holding it."""
        if not self.path.exists():
            return {}
        with self._connect() as conn:
            return {r["address"]: r["sandbox_id"] for r in conn.execute(
                "SELECT address, sandbox_id FROM ssh_leases")}

    def mark_releasing(self, ref: str) -> None:
        with self._connect(write=True) as conn:
            conn.execute("UPDATE ssh_leases SET state = ? WHERE ref = ?", (RELEASING, ref))

    def release(self, ref: str) -> None:
        with self._connect(write=True) as conn:
            conn.execute("DELETE FROM ssh_leases WHERE ref = ?", (ref,))
            conn.execute("DELETE FROM ssh_mounts WHERE lease_ref = ?", (ref,))

    # -- volumes ----------------------------------------------------------------------------

    def add_volume(self, volume: SSHVolume) -> None:
        with self._connect(write=True) as conn:
            conn.execute("INSERT INTO ssh_volumes VALUES (?, ?, ?, ?, ?)", (
                volume.ref, volume.volume_id,
                json.dumps({**asdict(volume.host), "labels": dict(volume.host.labels)}),
                volume.folder, json.dumps(dict(volume.labels), sort_keys=True)))

    @staticmethod
    def _volume(row: sqlite3.Row) -> SSHVolume:
        host = json.loads(row["host_json"])
        host["host_key"] = tuple(host.get("host_key") or ())
        return SSHVolume(ref=row["ref"], volume_id=row["volume_id"], host=Host(**host),
                         folder=row["folder"], labels=json.loads(row["labels_json"]))

    def volume(self, ref: str) -> SSHVolume | None:
        if not self.path.exists():
            return None
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM ssh_volumes WHERE ref = ?", (ref,)).fetchone()
        return self._volume(row) if row else None

    def volumes(self) -> list[SSHVolume]:
        if not self.path.exists():
            return []
        with self._connect() as conn:
            return [self._volume(r) for r in conn.execute(
                "SELECT * FROM ssh_volumes ORDER BY ref")]

    def drop_volume(self, ref: str) -> None:
        with self._connect(write=True) as conn:
            conn.execute("DELETE FROM ssh_volumes WHERE ref = ?", (ref,))

    def add_mount(self, lease_ref: str, path: str, made: bool) -> None:
        with self._connect(write=True) as conn:
            conn.execute("INSERT OR REPLACE INTO ssh_mounts VALUES (?, ?, ?)",
                         (lease_ref, path, int(made)))

    def mounts(self, lease_ref: str) -> list[tuple[str, bool]]:
        """The lease's mount points, deepest first (the order they are unmounted in)."""
        if not self.path.exists():
            return []
        with self._connect() as conn:
            rows = conn.execute("SELECT path, made FROM ssh_mounts WHERE lease_ref = ? "
                                "ORDER BY length(path) DESC, path", (lease_ref,)).fetchall()
        return [(r["path"], bool(r["made"])) for r in rows]

    def drop_mount(self, lease_ref: str, path: str) -> None:
        with self._connect(write=True) as conn:
            conn.execute("DELETE FROM ssh_mounts WHERE lease_ref = ? AND path = ?",
                         (lease_ref, path))


@contextlib.asynccontextmanager
async def _file_lock(path: Path, what: str, wait_s: float = LOCK_WAIT_S):
    """An exclusive lock across processes; the kernel drops it if the holder dies."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise AdapterError(f"{what} is busy in another process (waited {wait_s:g}s)") from None
                await asyncio.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing releases the lock


# -- running ssh ----------------------------------------------------------------------------


async def _spawn(argv: Sequence[str], timeout_s: float | None) -> tuple[int, bytes, bytes] | None:
    """Run a local process; None when it outlived `timeout_s` (it is killed)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True)
    except FileNotFoundError:
        raise BackendUnavailable(NO_CLIENT) from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        return None
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    return proc.returncode or 0, out, err


def _last_line(err: bytes) -> str:
    lines = [line.strip() for line in err.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "no message from ssh"


class HostKeyRefused(BackendUnavailable):
    """The host's key is not one sbx may trust (exit 5): nothing ran on the host."""

    @classmethod
    def of(cls, host: Host, err: bytes) -> HostKeyRefused | None:
        text = err.decode(errors="replace")
        if "Host key verification failed" not in text:
            return None
        if "HOST IDENTIFICATION HAS CHANGED" in text or "has changed and you have" in text:
            return cls(f"ssh host {host.describe()}: its host key is not the one trusted for it "
                       "(changed since: a reinstalled host, or someone in between); refused. "
                       "If the new key is right, remove the old one (ssh-keygen -R) or pin the "
                       "new one with host_key: in the inventory")
        return cls(f"ssh host {host.describe()}: its host key is not known (strict checking); "
                   "add it to ~/.ssh/known_hosts, pin it in the inventory entry (host_key: or "
                   "known_hosts:), or set host_key_policy: tofu to trust the first key seen")


def _ssh_path(path: Path | str) -> str:
    """A path as an ssh option value: `%` is a token there, and a space splits values."""
    text = str(path).replace("%", "%%")
    return f'"{text}"' if any(c.isspace() for c in text) else text


class SSHAdapter(Adapter):
    name = "ssh"
    description = "leases on existing hosts over SSH, from an inventory file (attach)"
    # files: the base's defaults (tar, find, stat, rm, mkdir, mv on the host, through exec
    # with its input streamed over the session); processes: the core's, on exec and sh
    # pty: `ssh -tt` on a pseudo-terminal of this host; a resize reaches the host as ssh's
    # own window-change message (docs/terminals-and-ports.md)
    # volumes: folders on one host, bind-mounted into the sandboxes leased there (VOLUMES_DIR)
    capabilities = frozenset({Capability.EXEC, Capability.FILES, Capability.PROCESSES,
                              Capability.PTY, Capability.VOLUMES})

    def __init__(self, home: Path | None = None) -> None:
        self.home = home
        self._leases: LeaseStore | None = None

    # -- plumbing ---------------------------------------------------------------------------

    def _folder(self) -> Path:
        if self.home is None:
            self.home = state_folder()
        return self.home

    @property
    def leases(self) -> LeaseStore:
        if self._leases is None:
            override = os.environ.get(LEASES_ENV)
            self._leases = LeaseStore(Path(override).expanduser() if override
                                      else self._folder() / "ssh-leases.db")
        return self._leases

    def _lock_path(self, host: Host, kind: str) -> Path:
        folder = self.leases.path.parent / "ssh-locks"
        folder.mkdir(mode=0o700, exist_ok=True)
        return folder / f"{_digest(host.address)}.{kind}"

    @staticmethod
    def _control_path(host: Host, trust: Sequence[str]) -> Path:
        """Short (a socket path has ~100 bytes), private, one per host, key and host key
        checking: a connection made under one trust is never reused under another."""
        folder = Path(tempfile.gettempdir()) / f"sbx-ssh-{os.getuid()}"
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise BackendUnavailable(f"{folder} must be a private folder of this user (mode 0700)")
        return folder / _digest(f"{host.address}|{host.key}|{' '.join(trust)}")

    def _pinned_file(self, host: Host) -> tuple[Path, str]:
        """A known-hosts file holding exactly the entry's pinned keys, under an alias of the
        host's own (so what ~/.ssh/config makes of the name does not matter); (file, alias)."""
        alias = f"sbx-pinned-{_digest(host.address)}"
        folder = self.leases.path.parent / "ssh-pinned"
        folder.mkdir(mode=0o700, exist_ok=True)
        path = folder / f"{_digest(alias + '|' + '|'.join(host.host_key))}.known_hosts"
        text = "".join(f"{alias} {key}\n" for key in host.host_key)
        if not path.is_file() or path.read_text() != text:
            scratch = path.with_name(f".{path.name}.{os.getpid()}")
            scratch.write_text(text)
            os.replace(scratch, path)
        return path, alias

    def _host_key_options(self, host: Host) -> list[str]:
        """How the host's key is checked. Pinned (host_key:, known_hosts:): those keys only.
        Otherwise strictly against the user's known hosts ($HOME's ~/.ssh/known_hosts and the
        system's /etc/ssh/ssh_known_hosts, as ssh reads them) and sbx's own file; with
        host_key_policy: tofu a host none of them knows is trusted on first use and
        remembered in sbx's file. A changed key is refused either way."""
        if host.host_key:
            pinned, alias = self._pinned_file(host)
            return ["-o", f"UserKnownHostsFile={_ssh_path(pinned)}",
                    "-o", "GlobalKnownHostsFile=/dev/null", "-o", f"HostKeyAlias={alias}",
                    "-o", "StrictHostKeyChecking=yes"]
        if host.known_hosts:
            return ["-o", f"UserKnownHostsFile={_ssh_path(host.known_hosts)}",
                    "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes"]
        users = [Path.home() / ".ssh" / "known_hosts", Path.home() / ".ssh" / "known_hosts2"]
        own = self.leases.path.parent / "ssh-known_hosts"
        files = [own, *users] if host.host_key_policy == TOFU else [*users, own]  # new keys
        checking = "accept-new" if host.host_key_policy == TOFU else "yes"  # go to the first
        return ["-o", f"UserKnownHostsFile={' '.join(_ssh_path(f) for f in files)}",
                "-o", f"StrictHostKeyChecking={checking}"]

    def _ssh(self, host: Host, connect_timeout: float) -> list[str]:
        """The client with every option that keeps it from waiting on anything."""
        if shutil.which("ssh") is None:
            raise BackendUnavailable(NO_CLIENT)
        trust = self._host_key_options(host)
        key = ["-i", host.key, "-o", "IdentitiesOnly=yes"] if host.key else []
        return ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={math.ceil(connect_timeout)}",
                "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
                "-o", "LogLevel=ERROR", "-o", f"ControlPath={self._control_path(host, trust)}",
                *trust, *key, "-p", str(host.port), "-l", host.user]

    async def _master_running(self, host: Host, connect_timeout: float) -> bool:
        result = await _spawn([*self._ssh(host, connect_timeout), "-O", "check", host.host], 10)
        return result is not None and result[0] == 0

    async def connect(self, host: Host, connect_timeout: float) -> None:
        """Make sure this host's shared connection is up; BackendUnavailable naming the host
        when it does not answer within the timeout."""
        if await self._master_running(host, connect_timeout):
            return
        async with _file_lock(self._lock_path(host, "connect"), f"connecting to {host.describe()}"):
            if await self._master_running(host, connect_timeout):
                return  # another process made it while we waited
            control = self._control_path(host, self._host_key_options(host))
            with contextlib.suppress(FileNotFoundError):
                control.unlink()  # a dead master's socket
            result = await _spawn(
                [*self._ssh(host, connect_timeout), "-o", "ControlMaster=yes",
                 "-o", f"ControlPersist={CONTROL_PERSIST_S}", "-f", "-N", host.host],
                connect_timeout + 5)
        if result is None:
            raise BackendUnavailable(f"ssh host {host.describe()} did not answer within "
                                     f"{connect_timeout:g}s")
        if result[0] != 0:
            raise HostKeyRefused.of(host, result[2]) or BackendUnavailable(
                f"ssh host {host.describe()} is unreachable: {_last_line(result[2])}")

    async def run(self, host: Host, argv: Sequence[str], *, connect_timeout: float,
                  timeout_s: float | None, cwd: str | None = None, stdin: Stdin = None,
                  env: Mapping[str, str] | None = None) -> ExecResult:
        """Run `argv` on the host (no shell in between): its exit status, stdout and stderr.
        A command that outlives `timeout_s` is killed on the host with everything it started,
        and its result keeps the output it produced until then."""
        out, err = bytearray(), bytearray()
        async for item in self.stream(host, argv, connect_timeout=connect_timeout,
                                      timeout_s=timeout_s, cwd=cwd, stdin=stdin, env=env):
            if isinstance(item, ExecResult):
                return ExecResult(item.exit_code, bytes(out), bytes(err),
                                  item.duration_s, item.timed_out)
            (out if item[0] == "stdout" else err).extend(item[1])
        raise AssertionError("unreachable: the stream ends with its result")

    async def stream(self, host: Host, argv: Sequence[str], *, connect_timeout: float,
                     timeout_s: float | None, cwd: str | None = None, stdin: Stdin = None,
                     env: Mapping[str, str] | None = None,
                     ) -> AsyncIterator[tuple[str, bytes] | ExecResult]:
        """`run`, as its output comes: ("stdout" | "stderr", bytes) pairs, then the
        ExecResult (a timeout's note comes last on stderr). `stdin` (bytes or chunks) is
        written to the ssh client's stdin, which the session carries to the command, then
        closed; without it the command's stdin is empty. Every process of the command
        carries a mark in its environment (EXEC_MARK), which is how a timeout finds and ends
        all of them, including those that left its process group."""
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        await self.connect(host, connect_timeout)
        mark = uuid.uuid4().hex
        variables = {**(env or {}), EXEC_MARK: mark}
        header = b"".join(f"{k}=".encode() + base64.b64encode(v.encode()) + b"\n"
                          for k, v in variables.items()) + b"\n"
        # the remote shell sets the variables read from stdin, reports its pid (= its
        # process group: sshd starts each command in a session of its own), then becomes
        # the command
        remote = f"exec sh -c {shlex.quote(READ_ENV_THEN_EXEC)} sbx {shlex.join(argv)}"
        if cwd is not None:
            remote = f"cd -- {shlex.quote(cwd)} && {remote}"
        ssh = self._ssh(host, connect_timeout)
        try:
            proc = await asyncio.create_subprocess_exec(
                *ssh, "-o", "ControlMaster=no", host.host, remote,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True)
        except FileNotFoundError:
            raise BackendUnavailable(NO_CLIENT) from None
        remote_pid: list[int] = []
        before = bytearray()  # what the remote login shell printed before the marker (rc files)
        tail = bytearray()  # the end of stderr: the client's own message, when it fails
        queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue(maxsize=16)

        async def pump(reader: asyncio.StreamReader, name: str) -> None:
            if name == "stderr":
                while line := await reader.readline():
                    if line.startswith(PID_MARKER) and line[len(PID_MARKER):].strip().isdigit():
                        remote_pid.append(int(line[len(PID_MARKER):]))
                        break
                    before.extend(line)
                if before and remote_pid:
                    await queue.put((name, bytes(before)))
            while chunk := await reader.read(STREAM_CHUNK):
                if name == "stderr":
                    tail[:] = (tail + chunk)[-4096:]
                await queue.put((name, chunk))
            await queue.put(None)

        given = CallerStdin(stdin)  # a failure of the caller's is raised once the command ends

        async def feed() -> None:
            try:
                proc.stdin.write(header)
                await proc.stdin.drain()
                async for chunk in given:
                    proc.stdin.write(chunk)
                    await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the command stopped reading its input: its exit status says the rest
            finally:
                proc.stdin.close()

        tasks = [asyncio.create_task(pump(proc.stdout, "stdout")),
                 asyncio.create_task(pump(proc.stderr, "stderr")),
                 asyncio.create_task(feed())]
        open_streams, timed_out = 2, False
        try:
            while open_streams:
                left = None if deadline is None else deadline - loop.time()
                try:
                    if left is not None and left <= 0:
                        raise TimeoutError
                    item = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    timed_out = True
                    break
                if item is None:
                    open_streams -= 1
                else:
                    yield item
            if timed_out:
                killed = await self._kill_remote(host, connect_timeout, remote_pid, mark)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                while not queue.empty():  # what was read before the deadline is kept
                    item = queue.get_nowait()
                    if item is not None:
                        yield item
                note = "" if killed else f" (the command may still run on {host.name})"
                yield "stderr", f"sbx: timed out after {timeout_s:g}s{note}\n".encode()
                yield ExecResult(124, b"", b"", time.perf_counter() - started, timed_out=True)
                return
            code = await proc.wait()
            given.raise_if_failed()
        finally:
            for task in tasks:
                task.cancel()
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        if code == 255 and not remote_pid:  # the client's own failure: the command never ran
            raise BackendUnavailable(f"ssh host {host.describe()}: {_last_line(bytes(before))}")
        if code == 255 and not await self._master_running(host, connect_timeout):
            raise BackendUnavailable(f"lost the connection to ssh host {host.describe()}: "
                                     f"{_last_line(bytes(tail or before))}")
        if before and not remote_pid:  # the login shell failed before the command (cd DIR)
            yield "stderr", bytes(before)
        yield ExecResult(code, b"", b"", time.perf_counter() - started)

    async def _kill_remote(self, host: Host, connect_timeout: float, pid: list[int],
                           mark: str) -> bool:
        """End the command's process group and every process carrying its mark."""
        script = shlex.quote(KILL_MARKED)
        result = await _spawn([*self._ssh(host, connect_timeout), "-o", "ControlMaster=no",
                               host.host, f"sh -c {script} {mark} {EXEC_MARK} "
                               f"{pid[0] if pid else ''}"], connect_timeout + 5)
        return result is not None and result[0] == 0

    async def _run_checked(self, lease: Lease, command: str, step: str) -> None:
        # setup and cleanup may key their work on the sandbox (a folder per sandbox, say)
        argv = ["env", f"SBX_SANDBOX_ID={lease.sandbox_id}", f"SBX_HOST_NAME={lease.host.name}",
                "sh", "-c", command]
        result = await self.run(lease.host, argv,
                                connect_timeout=lease.connect_timeout,
                                timeout_s=lease.command_timeout)
        if result.exit_code != 0:
            why = "timed out" if result.timed_out else f"exit {result.exit_code}"
            raise AdapterError(f"{step} command {command!r} failed on ssh host "
                               f"{lease.host.describe()} ({why}): {_last_line(result.stderr)}")

    async def _sweep(self, lease: Lease) -> None:
        """End the lease user's processes and remove its temporary files (SWEEP)."""
        result = await self.run(lease.host, ["sh", "-c", SWEEP],
                                connect_timeout=lease.connect_timeout,
                                timeout_s=lease.command_timeout)
        if result.exit_code != 0:
            why = "timed out" if result.timed_out else f"exit {result.exit_code}"
            raise AdapterError(f"ending the lease's processes and removing its temporary files "
                               f"failed on ssh host {lease.host.describe()} ({why}): "
                               f"{_last_line(result.stderr)}")

    async def _clean_and_release(self, lease: Lease) -> None:
        """Cleanup, then release: a host whose cleanup failed is not handed out again."""
        async with _file_lock(self._lock_path(lease.host, "release"),
                              f"releasing {lease.host.describe()}", lease.command_timeout + 30):
            current = self.leases.get(lease.ref)
            if current is None:
                return  # another process released it while we waited
            self.leases.mark_releasing(lease.ref)
            for command in current.cleanup:
                await self._run_checked(current, command, "cleanup")
            await self._unmount(current)
            await self._sweep(current)
            self.leases.release(lease.ref)

    # -- contract ---------------------------------------------------------------------------

    def validate(self, request: CreateRequest) -> None:
        settings = settings_from(request.options)
        hosts = settings.hosts()
        candidates = matching(hosts, settings.match)
        if not candidates:
            raise BadConfiguration(f"no host in {settings.source} has the labels "
                                   f"{dict(settings.match)} (options.match)")
        if request.image:
            raise CapabilityNotSupported("the ssh backend attaches to existing hosts: it has no "
                                         "image or template; remove image/template")
        if request.command is not None:
            raise CapabilityNotSupported("the ssh backend runs no main process on a host; "
                                         "remove command (use options.setup)")
        if request.env:
            raise CapabilityNotSupported("the ssh backend cannot set environment variables on a "
                                         "host it attaches to; remove env and secrets")
        if request.network != "full":
            raise CapabilityNotSupported(
                f"the ssh backend cannot restrict a host's network (network mode "
                f"{request.network!r}); an attached host keeps its own: set network.mode: full")
        limits = request.resources
        for value, name in ((limits.memory_bytes, "memory"), (limits.pids, "pids"),
                            (limits.disk_bytes, "disk"), (limits.gpu, "gpu")):
            if value is not None:
                raise CapabilityNotSupported(
                    f"the ssh backend leases a whole host and cannot limit resources.{name}; "
                    f"set resources.{name}: null")
        candidates = self._placed(candidates, request, settings)
        taken = self.leases.holders()
        if all(h.address in taken for h in candidates):  # checked again, atomically, at create
            raise NoFreeHost.of(candidates, taken, settings)

    async def ensure_available(self) -> None:
        if shutil.which("ssh") is None:
            raise BackendUnavailable(NO_CLIENT)

    async def health(self) -> Health:
        client = shutil.which("ssh")
        if client is None:
            return Health(False, False, NO_CLIENT)
        try:
            leased = len(self.leases.all())
        except (OSError, sqlite3.Error) as exc:
            return Health(False, True, f"cannot read the ssh leases at {self.leases.path}: {exc}")
        detail = f"OpenSSH client {client}; {leased} host(s) leased"
        inventory = os.environ.get(INVENTORY_ENV)
        if inventory:
            try:
                detail += f"; inventory {inventory}: {len(load_inventory(inventory))} host(s)"
            except AdapterError as exc:
                return Health(False, True, str(exc))
        return Health(True, True, detail)

    async def create(self, request: CreateRequest) -> BackendObject:
        settings = settings_from(request.options)
        candidates = self._placed(matching(settings.hosts(), settings.match), request, settings)
        lease = await asyncio.to_thread(self.leases.take, candidates, request, settings)
        setup = list(settings.setup)  # the profile's own `setup:` the core runs through exec
        try:
            await self.connect(lease.host, lease.connect_timeout)
            for mount in request.mounts:
                await self._mount(lease, mount)
            for command in setup:
                await self._run_checked(lease, command, "setup")
        except BaseException as exc:
            if not isinstance(exc, BackendUnavailable):  # a reachable host is cleaned up
                with contextlib.suppress(Exception):
                    for command in lease.cleanup:
                        await self._run_checked(lease, command, "cleanup")
                    await self._unmount(lease)
                    await self._sweep(lease)
            self.leases.release(lease.ref)
            raise
        return lease.object()

    async def destroy(self, ref: str, *, services: bool = True) -> None:
        lease = self.leases.get(ref)
        if lease is None:
            return  # already released: success
        await self._clean_and_release(lease)

    async def get(self, ref: str) -> BackendObject | None:
        lease = self.leases.get(ref)
        return lease.object() if lease else None

    async def list(self, labels: Mapping[str, str]) -> list[BackendObject]:
        want = dict(labels).items()
        return [lease.object() for lease in self.leases.all() if want <= dict(lease.labels).items()]

    async def change_marker(self, labels: Mapping[str, str], since: float) -> str | None:
        """What list() answers comes from this installation's lease file alone: a digest of
        the leases carrying `labels` changes exactly when that answer would."""
        objects = await self.list(labels)
        seen = sorted((o.ref, o.status, sorted(o.labels.items())) for o in objects)
        return "leases:" + hashlib.sha256(repr(seen).encode()).hexdigest()

    def _lease(self, ref: str, user: str | None) -> Lease:
        if user is not None:
            raise CapabilityNotSupported(
                "the ssh backend runs every command as the host's inventory user; it cannot "
                f"run one as {user!r} (remove user, or list the host with that user)")
        if ref.startswith(HELPER_PREFIX):  # a volume's files, without a sandbox
            volume = self.leases.volume(ref[len(HELPER_PREFIX):])
            if volume is None:
                raise BackendObjectGone(f"ssh volume {ref[len(HELPER_PREFIX):]} is gone")
            return Lease(ref=ref, sandbox_id="", host=volume.host, labels={}, cleanup=(),
                         connect_timeout=DEFAULT_CONNECT_TIMEOUT,
                         command_timeout=DEFAULT_COMMAND_TIMEOUT, state=LEASED,
                         leased_at=datetime.now(UTC))
        lease = self.leases.get(ref)
        if lease is None:
            raise BackendObjectGone(f"ssh lease {ref} is released")
        return lease

    async def exec(self, ref: str, argv: Sequence[str], timeout_s: float | None = None,
                   env: Mapping[str, str] | None = None, *, cwd: str | None = None,
                   user: str | None = None, stdin: Stdin = None) -> ExecResult:
        lease = self._lease(ref, user)
        return await self.run(lease.host, argv, connect_timeout=lease.connect_timeout,
                              timeout_s=timeout_s, cwd=cwd, stdin=stdin, env=env)

    async def exec_stream(self, ref: str, argv: Sequence[str], timeout_s: float | None = None,
                          env: Mapping[str, str] | None = None, *, cwd: str | None = None,
                          user: str | None = None, stdin: Stdin = None,
                          ) -> AsyncIterator[tuple[str, bytes] | ExecResult]:
        """Output as it comes over the session (a tree read with get_archive is streamed)."""
        lease = self._lease(ref, user)
        async for item in self.stream(lease.host, argv, connect_timeout=lease.connect_timeout,
                                      timeout_s=timeout_s, cwd=cwd, stdin=stdin, env=env):
            yield item

    async def open_pty(self, ref: str, argv: Sequence[str], *, cols: int = 80, rows: int = 24,
                       env: Mapping[str, str] | None = None, cwd: str | None = None,
                       ) -> PtyChannel:
        """`ssh -tt` run on a pseudo-terminal of this host, through the host's shared
        connection: sshd gives the program a terminal of the same size and TERM; a resize
        of the local one makes ssh send the host a window-change. The variables go in on
        the terminal, silenced (READ_ENV_ON_TTY), never on a command line."""
        lease = self._lease(ref, None)
        host, connect_timeout = lease.host, lease.connect_timeout
        await self.connect(host, connect_timeout)
        variables = dict(env or {})
        term = variables.get("TERM", "xterm-256color")
        header = b"".join(f"{k}=".encode() + base64.b64encode(v.encode()) + b"\n"
                          for k, v in variables.items()) + b"\n"
        remote = f"exec sh -c {shlex.quote(READ_ENV_ON_TTY)} sbx {shlex.join(argv)}"
        if cwd is not None:
            remote = f"cd -- {shlex.quote(cwd)} && {remote}"
        # a connection of its own, not the shared one: a multiplexed session's window
        # changes go to the master, which was started without a terminal and drops them
        ssh = _without_option(self._ssh(host, connect_timeout), "ControlPath")
        master, slave = os.openpty()
        try:
            _set_size(slave, cols, rows)
            proc = await asyncio.create_subprocess_exec(
                *ssh, "-tt", "-o", "ControlMaster=no", "-o", "ControlPath=none",
                host.host, remote,
                stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                env={**os.environ, "TERM": term})
        except FileNotFoundError:
            os.close(master)
            raise BackendUnavailable(NO_CLIENT) from None
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        channel = _SSHPty(proc, master)
        try:
            said = await asyncio.wait_for(channel.until(PTY_READY), connect_timeout + 10)
            if said is not None:
                await channel.write(header)
                said = await asyncio.wait_for(channel.until(PTY_GO), connect_timeout + 10)
        except BaseException:
            await channel.close()
            raise
        if said is None:  # it ended before the program started: the client or the shell said why
            code = await channel.wait()
            text = _last_line(channel.pending)
            await channel.close()
            if code == 255:
                raise BackendUnavailable(f"ssh host {host.describe()}: {text}")
            raise AdapterError(f"cannot open a terminal on ssh host {host.describe()}: {text}")
        return channel


    # -- volumes (docs/volumes.md) ----------------------------------------------------------

    def _placed(self, candidates: list[Host], request: CreateRequest,
                settings: Settings) -> list[Host]:
        """A sandbox mounting volumes runs on the host that keeps them: the candidates
        narrowed to it, or BadConfiguration (exit 2) when the profile does not offer it."""
        if not request.mounts:
            return candidates
        kept: dict[str, SSHVolume] = {}
        for mount in request.mounts:
            volume = self.leases.volume(mount.ref)
            if volume is None:
                raise BadConfiguration(f"no ssh volume {mount.ref} in this sbx's state folder")
            kept[volume.host.address] = volume
        if len(kept) > 1:
            names = ", ".join(sorted(repr(v.host.name) for v in kept.values()))
            raise BadConfiguration(f"the volumes to mount are kept on different ssh hosts "
                                   f"({names}): a sandbox runs on one host, so mount volumes "
                                   "of one host")
        address, volume = next(iter(kept.items()))
        placed = [h for h in candidates if h.address == address]
        if not placed:
            raise BadConfiguration(
                f"volume {volume.volume_id} is kept on ssh host {volume.host.name!r}, which "
                f"{settings.source} with options.match {dict(settings.match)} does not offer: "
                "a sandbox mounting it must run on that host")
        return placed

    async def _volume_sh(self, host: Host, script: str, *args: str,
                         stdin: bytes | None = None) -> ExecResult:
        return await self.run(host, ["sh", "-c", script, "sbx", *args],
                              connect_timeout=DEFAULT_CONNECT_TIMEOUT,
                              timeout_s=DEFAULT_COMMAND_TIMEOUT, stdin=stdin)

    async def _mount(self, lease: Lease, mount: Any) -> None:
        """Bind-mount the volume's data at the mount's path on the leased host (read-only:
        remounted ro, which root cannot write through either)."""
        volume = self.leases.volume(mount.ref)
        if volume is None or volume.host.address != lease.host.address:
            raise BadConfiguration(f"no ssh volume {mount.ref} on ssh host {lease.host.name!r}")
        self.leases.add_mount(lease.ref, mount.path, False)  # before: a crash still unmounts
        result = await self.run(lease.host, ["sh", "-c", MOUNT_VOLUME, "sbx",
                                             f"{volume.folder}/volume", mount.path,
                                             "1" if mount.read_only else ""],
                                connect_timeout=lease.connect_timeout,
                                timeout_s=lease.command_timeout)
        if result.exit_code != 0:
            self.leases.drop_mount(lease.ref, mount.path)
            if result.exit_code == 3:
                raise BadConfiguration(
                    f"the ssh backend mounts a volume with a bind mount, which needs the "
                    f"inventory user of ssh host {lease.host.name!r} to be root there (it is "
                    f"{lease.host.user!r}); docs/volumes.md")
            raise AdapterError(f"cannot mount volume {volume.volume_id} at {mount.path} on ssh "
                               f"host {lease.host.name!r}: {_last_line(result.stderr)}")
        self.leases.add_mount(lease.ref, mount.path, b"made=1" in result.stdout)

    async def _unmount(self, lease: Lease) -> None:
        """Undo the lease's bind mounts (and the mount points it made), deepest first, so
        the next lessee of the host sees no volume of this one's."""
        for path, made in self.leases.mounts(lease.ref):
            result = await self.run(lease.host, ["sh", "-c", UNMOUNT_VOLUME, "sbx", path,
                                                 "1" if made else ""],
                                    connect_timeout=lease.connect_timeout,
                                    timeout_s=lease.command_timeout)
            if result.exit_code != 0:
                raise AdapterError(f"cannot unmount the volume at {path} on ssh host "
                                   f"{lease.host.name!r}: {_last_line(result.stderr)}")
            self.leases.drop_mount(lease.ref, path)

    async def create_volume(self, volume_id: str, labels: Mapping[str, str]) -> str:
        """A folder on the first host of the backend's inventory ($SBX_SSH_INVENTORY); the
        volume remembers that host, and sandboxes mounting it are placed there."""
        inventory = os.environ.get(INVENTORY_ENV)
        if not inventory:
            raise BadConfiguration(f"an ssh volume is kept on a host of the ssh backend's "
                                   f"inventory: set ${INVENTORY_ENV} (docs/volumes.md)")
        host = load_inventory(inventory)[0]
        result = await self._volume_sh(host, MAKE_VOLUME, volume_id,
                                       stdin=json.dumps(dict(labels), sort_keys=True).encode())
        folder = result.stdout.decode(errors="replace").strip().splitlines()[-1:] or [""]
        if result.exit_code != 0 or not folder[0].startswith("/"):
            raise AdapterError(f"cannot make the volume's folder on ssh host {host.name!r}: "
                               f"{_last_line(result.stderr)}")
        volume = SSHVolume(ref=f"{host.name}/{volume_id}", volume_id=volume_id, host=host,
                           folder=folder[0], labels=dict(labels))
        await asyncio.to_thread(self.leases.add_volume, volume)
        return volume.ref

    async def remove_volume(self, ref: str) -> None:
        """Only a folder carrying sbx's mark is removed; a volume already gone is success."""
        volume = self.leases.volume(ref)
        if volume is None:
            return
        result = await self._volume_sh(volume.host, REMOVE_VOLUME, volume.folder)
        if result.exit_code == 3:
            raise InvalidRequest(f"the folder of ssh volume {ref} is not one of sbx's: left alone")
        if result.exit_code != 0:
            raise AdapterError(f"cannot remove ssh volume {ref} on ssh host "
                               f"{volume.host.name!r}: {_last_line(result.stderr)}")
        self.leases.drop_volume(ref)

    async def volume_size(self, ref: str) -> int | None:
        """`du` of the volume's data (bytes, or KiB blocks where du has no -b)."""
        volume = self.leases.volume(ref)
        if volume is None:
            return None
        result = await self._volume_sh(volume.host, VOLUME_SIZE, volume.folder)
        unit, _, number = result.stdout.decode(errors="replace").strip().partition(" ")
        if result.exit_code != 0 or not number.isdigit():
            return None
        return int(number) * (1024 if unit == "k" else 1)

    async def list_volumes(self, labels: Mapping[str, str]) -> list[str]:
        want = dict(labels).items()
        return [v.ref for v in self.leases.volumes() if want <= dict(v.labels).items()]

    async def open_volume(self, ref: str, labels: Mapping[str, str]) -> str:
        """Nothing is made: the helper is the volume's folder reached over ssh."""
        if self.leases.volume(ref) is None:
            raise BackendObjectGone(f"ssh volume {ref} is gone")
        return HELPER_PREFIX + ref

    async def close_volume(self, helper: str) -> None:
        return None

    def _in_helper(self, ref: str, path: str) -> tuple[str, str | None]:
        """A helper's /volume... as the host's path (and the folder, to keep it out of
        messages); any other ref's path as it is."""
        if not ref.startswith(HELPER_PREFIX):
            return path, None
        volume = self.leases.volume(ref[len(HELPER_PREFIX):])
        if volume is None:
            raise BackendObjectGone(f"ssh volume {ref[len(HELPER_PREFIX):]} is gone")
        if path != HELPER_ROOT and not path.startswith(HELPER_ROOT + "/"):
            raise InvalidRequest(f"{path}: a volume's paths are under {HELPER_ROOT}")
        return volume.folder + path, volume.folder

    async def put_archive(self, ref: str, path: str, tar: AsyncIterator[bytes]) -> None:
        there, folder = self._in_helper(ref, path)
        try:
            await super().put_archive(ref, there, tar)
        except AdapterError as exc:
            if folder is None:
                raise
            raise type(exc)(str(exc).replace(folder, "")) from None

    async def get_archive(self, ref: str, path: str) -> AsyncIterator[bytes]:
        there, folder = self._in_helper(ref, path)
        try:
            async for chunk in super().get_archive(ref, there):
                yield chunk
        except AdapterError as exc:
            if folder is None:
                raise
            raise type(exc)(str(exc).replace(folder, "")) from None


def _without_option(argv: Sequence[str], name: str) -> list[str]:
    """`argv` without its `-o NAME=...` (ssh keeps the first value an option is given)."""
    out: list[str] = []
    skip = False
    for at, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg == "-o" and at + 1 < len(argv) and argv[at + 1].startswith(f"{name}="):
            skip = True
        else:
            out.append(arg)
    return out


def _set_size(fd: int, cols: int, rows: int) -> None:
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class _SSHPty(PtyChannel):
    """The ssh client on a pseudo-terminal of this host: the master end is read and written
    here; b"" once every holder of the other end (the client) is gone."""

    def __init__(self, proc: asyncio.subprocess.Process, master: int) -> None:
        self._proc = proc
        self._master: int | None = master
        os.set_blocking(master, False)
        self.pending = b""  # read, not yet handed out
        self._ended = False
        self._waiting: set[asyncio.Future] = set()

    async def _wait_fd(self, writer: bool) -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def ready() -> None:
            if not done.done():
                done.set_result(None)

        fd = self._master
        (loop.add_writer if writer else loop.add_reader)(fd, ready)
        self._waiting.add(done)
        try:
            await done
        finally:
            self._waiting.discard(done)
            if self._master == fd:  # close() removed it already (the number may be reused)
                (loop.remove_writer if writer else loop.remove_reader)(fd)

    async def _raw(self) -> bytes:
        while self._master is not None:
            try:
                return os.read(self._master, STREAM_CHUNK)
            except BlockingIOError:
                await self._wait_fd(False)
            except OSError:  # EIO: the client, the last holder of the terminal, is gone
                return b""
        return b""

    async def until(self, marker: bytes) -> bytes | None:
        """Read up to `marker`'s line and drop what came before it and the line itself;
        None (all that came kept in `pending`) if the output ends first."""
        while True:
            at = self.pending.find(marker)
            if at >= 0:
                end = self.pending.find(b"\n", at)
                if end >= 0:
                    self.pending = self.pending[end + 1:]
                    return marker
            chunk = await self._raw()
            if not chunk:
                return None
            self.pending += chunk

    async def wait(self) -> int:
        return await self._proc.wait()

    async def read(self) -> bytes:
        if self.pending:
            chunk, self.pending = self.pending, b""
            return chunk
        if self._ended:
            return b""
        chunk = await self._raw()
        if not chunk:
            self._ended = True
            self.exit_code = await self._proc.wait()
        return chunk

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view and self._master is not None:
            try:
                view = view[os.write(self._master, view):]
            except BlockingIOError:
                await self._wait_fd(True)
            except OSError:
                return  # the program ended: its exit code says the rest

    async def resize(self, cols: int, rows: int) -> None:
        if self._master is None or self._proc.returncode is not None:
            return
        _set_size(self._master, cols, rows)
        # the client is not the terminal's session leader: tell it the size changed
        with contextlib.suppress(ProcessLookupError):
            self._proc.send_signal(signal.SIGWINCH)

    async def close(self) -> None:
        """Hang up: the client ends, sshd closes the host's terminal (SIGHUP)."""
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.terminate()
            try:
                await asyncio.wait_for(self._proc.wait(), 10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.kill()
                await self._proc.wait()
        if self._master is not None:
            fd, self._master = self._master, None
            loop = asyncio.get_running_loop()
            loop.remove_reader(fd)
            loop.remove_writer(fd)
            for waiting in self._waiting:  # a read or write waiting on it ends
                if not waiting.done():
                    waiting.set_result(None)
            os.close(fd)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]
