"""The state table: every legal transition and the event type it writes. One place."""

from __future__ import annotations

import enum
import hashlib
import json
import os
import secrets
import socket
from collections.abc import Collection, Iterable, Mapping
from functools import cache
from typing import Any

from sandboxer.core.rules.catalog import EventType
from sandboxer.core.rules.errors import Conflict


class State(enum.StrEnum):
    CREATING = "creating"
    RUNNING = "running"
    PAUSED = "paused"
    DESTROYING = "destroying"
    DESTROYED = "destroyed"
    FAILED = "failed"
    LOST = "lost"
    WARM = "warm"  # a pool member: made from its profile, waiting for a create to claim it


S = State
LIVE = frozenset({S.CREATING, S.RUNNING, S.PAUSED, S.DESTROYING, S.WARM})
# Holding resources on a deadline: extend applies, the TTL counts down.
ON_THE_CLOCK = frozenset({S.CREATING, S.RUNNING, S.PAUSED})
# Up and usable: touch applies, the expiry warning fires.
ACTIVE = frozenset({S.RUNNING, S.PAUSED})
# What the reaper destroys when due (a creating row only once its lease has lapsed; a warm
# pool member once it is past its pool's max_age).
REAPABLE = frozenset({S.CREATING, S.RUNNING, S.PAUSED, S.LOST, S.WARM})

# (from, to) -> event type written with the transition.
TRANSITIONS: dict[tuple[State, State], str] = {
    (S.CREATING, S.RUNNING): "sandbox.created",
    (S.CREATING, S.FAILED): "sandbox.failed",
    (S.RUNNING, S.PAUSED): "sandbox.paused",
    (S.PAUSED, S.RUNNING): "sandbox.resumed",
    (S.RUNNING, S.DESTROYING): "sandbox.destroying",
    (S.PAUSED, S.DESTROYING): "sandbox.destroying",
    (S.CREATING, S.DESTROYING): "sandbox.destroying",
    # cleaning up what a failed create or a lost sandbox may have left behind
    (S.FAILED, S.DESTROYING): "sandbox.destroying",
    (S.LOST, S.DESTROYING): "sandbox.destroying",
    (S.DESTROYING, S.DESTROYED): "sandbox.destroyed",
    (S.CREATING, S.LOST): "sandbox.lost",
    (S.RUNNING, S.LOST): "sandbox.lost",
    (S.PAUSED, S.LOST): "sandbox.lost",
    (S.DESTROYING, S.LOST): "sandbox.lost",
    # pool members (core/pools/__init__.py): made warm, claimed by a create, or retired
    (S.CREATING, S.WARM): "sandbox.warmed",
    (S.WARM, S.RUNNING): "sandbox.claimed",
    (S.WARM, S.DESTROYING): "sandbox.destroying",
    (S.WARM, S.LOST): "sandbox.lost",
}

# The event type of a new row, which has no "from" state.
CREATED_EVENT = "sandbox.creating"
# ...or of a row that reconcile made for a backend object of ours that had none.
ADOPTED_EVENT = "sandbox.adopted"
# Not a transition: the backend stopped the sandbox and started it again (an engine restart),
# and it is running (or, paused before, paused again) as it was.
RESTARTED_EVENT = EventType.SANDBOX_RESTARTED.value


class IllegalTransition(Conflict):
    pass


def transition_event(current: State | str, target: State | str) -> str:
    """The event type for current -> target; IllegalTransition (exit 4) when not allowed."""
    key = (State(current), State(target))
    try:
        return TRANSITIONS[key]
    except KeyError:
        raise IllegalTransition(
            f"sandbox is {key[0].value}: it cannot become {key[1].value}"
        ) from None


def can_transition(current: State | str, target: State | str) -> bool:
    return (State(current), State(target)) in TRANSITIONS


def entry_events(target: State | str) -> set[str]:
    """The event types written on entering `target` (to find an interrupted intent's reason)."""
    return {event for (_, dst), event in TRANSITIONS.items() if dst == State(target)}


def runs_setup(row: Mapping[str, Any]) -> bool:
    """The row's create runs its profile's setup commands while it says creating (a new
    sandbox or pool member, not a restore): one whose maker died is failed, never made
    running or warm half set up."""
    if row.get("restored_from") or not row.get("profile_json"):
        return False
    return bool(json.loads(row["profile_json"]).get("setup"))


def leased(row, now_iso: str, dead: Collection[str] = ()) -> bool:
    """Some process holds this row's lease: its operation is in progress. `dead`: lease
    owners known to be dead processes (see holder_gone), whose leases have lapsed at once."""
    owner = row["lease_owner"]
    return bool(owner) and row["lease_expires_at"] >= now_iso and owner not in dead


def held(row, now_iso: str, install_id: str) -> bool:
    """leased(), judging the holder now: what the manager checks inside its transactions."""
    return leased(row, now_iso) and not holder_gone(row["lease_owner"], install_id)


def dead_holders(rows: Iterable[Mapping[str, Any]], now_iso: str,
                 install_id: str) -> frozenset[str]:
    """The owners of the live leases among `rows` that are dead processes of this host (for
    the reaper's planners, which do no I/O themselves)."""
    owners = {r["lease_owner"] for r in rows if leased(r, now_iso)}
    return frozenset(o for o in owners if holder_gone(o, install_id))


# -- who holds a lease ---------------------------------------------------------------------
#
# A lease owner reads `HOST:PID:TOKEN/INSTALL.BOOT.PIDNS.START`: the part before the slash for
# people (the "busy" message), the part after it to tell whether that process still lives.
# INSTALL is a digest of the installation id (a fleet's hosts each have their own), BOOT the
# kernel's boot id, PIDNS the pid namespace, START the process's start time in clock ticks
# since boot (/proc/PID/stat field 22), which a reused pid does not share.


@cache
def _this_kernel() -> tuple[str, str] | None:
    """(boot id, pid namespace) of this process; None without /proc (then leases only lapse)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip().replace("-", "")[:16]
        pidns = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return None
    return (boot, pidns) if boot else None


def _start_time(pid: int) -> str | None:
    """The start time of process `pid` (field 22 of /proc/PID/stat); None when there is no
    such process, or only its zombie (dead, not yet waited for)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces
    if len(fields) < 20 or fields[0] in ("Z", "X"):  # fields[0] is field 3, the state
        return None
    return fields[19]


def _install_digest(install_id: str) -> str:
    return hashlib.sha256(install_id.encode()).hexdigest()[:10]


def lease_owner(install_id: str) -> str:
    """This process's name as a lease holder."""
    person = f"{socket.gethostname()[:40]}:{os.getpid()}:{secrets.token_hex(4)}"
    kernel, start = _this_kernel(), _start_time(os.getpid())
    if kernel is None or start is None:
        return person
    return f"{person}/{_install_digest(install_id)}.{kernel[0]}.{kernel[1]}.{start}"


def _holder(owner: str | None, install_id: str) -> tuple[str, str, int, str] | None:
    """(boot id, pid namespace, pid, start time) of a lease holder of this installation, from
    its name; None when its name says none (another installation's, or made without /proc)."""
    if not owner or "/" not in owner:
        return None
    person, _, identity = owner.rpartition("/")
    try:
        install, boot, pidns, start = identity.split(".")
        pid = int(person.rsplit(":", 2)[-2])
    except ValueError:
        return None
    return (boot, pidns, pid, start) if install == _install_digest(install_id) else None


def holder_alive(owner: str | None, install_id: str) -> bool:
    """The lease holder `owner` is known to be a live process of this host (this
    installation); False when it is gone or when that cannot be known."""
    holder, here = _holder(owner, install_id), _this_kernel()
    return (holder is not None and here is not None and holder[:2] == here
            and _start_time(holder[2]) == holder[3])


def holder_gone(owner: str | None, install_id: str) -> bool:
    """The lease holder `owner` is a process of this host (this installation) that no longer
    exists: this host booted since, or its pid is gone or now belongs to another process.
    False whenever that cannot be known (another host, another pid namespace, no /proc):
    such a lease lapses only when it expires."""
    holder, here = _holder(owner, install_id), _this_kernel()
    if holder is None or here is None:
        return False
    boot, pidns, pid, start = holder
    if boot != here[0]:
        return True  # this host has restarted since: every process of that boot is gone
    if pidns != here[1]:
        return False
    return _start_time(pid) != start
