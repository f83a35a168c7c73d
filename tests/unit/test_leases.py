"""Who holds a lease (sandboxer.core.rules.states.lease_owner / holder_gone): a lease of a dead process of
this host lapses at once; one whose holder's fate cannot be known waits for its expiry."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from sandboxer.core.rules.states import dead_holders, held, holder_gone, lease_owner, leased

INSTALL = "inst-01test"


def owner_of(pid: int, template: str) -> str:
    """`template` (a lease owner of this process) as if written by process `pid`."""
    person, _, identity = template.rpartition("/")
    host, _, token = person.split(":")
    return f"{host}:{pid}:{token}/{identity}"


def with_field(owner: str, index: int, value: str) -> str:
    person, _, identity = owner.rpartition("/")
    parts = identity.split(".")
    parts[index] = value
    return f"{person}/{'.'.join(parts)}"


def exited_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def row(owner: str | None, expires: str = "2999-01-01T00:00:00.000000Z") -> dict:
    return {"lease_owner": owner, "lease_expires_at": expires}


def test_this_process_is_alive():
    mine = lease_owner(INSTALL)
    assert "/" in mine and mine.split(":")[1] == str(os.getpid())
    assert not holder_gone(mine, INSTALL)
    assert held(row(mine), "2026-01-01T00:00:00.000000Z", INSTALL)


def test_a_process_that_exited_is_gone():
    owner = owner_of(exited_pid(), lease_owner(INSTALL))
    assert holder_gone(owner, INSTALL)
    assert not held(row(owner), "2026-01-01T00:00:00.000000Z", INSTALL)


def test_a_live_process_of_another_pid_is_not_gone():
    proc = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.05)
        # its own start time, as its own lease owner would carry it
        start = open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()[19]
        owner = with_field(owner_of(proc.pid, lease_owner(INSTALL)), 3, start)
        assert not holder_gone(owner, INSTALL)
        os.kill(proc.pid, signal.SIGSTOP)  # stopped is alive
        assert not holder_gone(owner, INSTALL)
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60  # a limit for a loaded machine, not a wait
        while open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert holder_gone(owner, INSTALL)  # a zombie: dead, not yet waited for
    finally:
        proc.kill()
        proc.wait()


def test_a_reused_pid_is_another_process():
    mine = lease_owner(INSTALL)
    assert holder_gone(with_field(mine, 3, "1"), INSTALL)  # our pid, another start time


def test_a_lease_from_before_this_boot_is_gone():
    mine = lease_owner(INSTALL)
    assert holder_gone(with_field(mine, 1, "0" * 16), INSTALL)


def test_what_cannot_be_judged_here_waits_for_its_expiry():
    mine = lease_owner(INSTALL)
    dead = owner_of(exited_pid(), mine)
    assert not holder_gone(dead, "inst-another-host")  # another installation's host
    assert not holder_gone(with_field(dead, 2, "1"), INSTALL)  # another pid namespace
    assert not holder_gone(dead.split("/")[0], INSTALL)  # an owner without identity
    for garbage in ("", "x/y", "host:notapid:t/a.b.c.d", "h:1:t/a.b.c"):
        assert not holder_gone(garbage, INSTALL), garbage


def test_dead_holders_names_only_dead_holders_of_live_leases():
    now = "2026-01-01T00:00:00.000000Z"
    mine = lease_owner(INSTALL)
    dead = owner_of(exited_pid(), mine)
    expired_dead = owner_of(exited_pid(), mine)
    rows = [row(mine), row(dead), row(expired_dead, "2025-01-01T00:00:00.000000Z"), row(None)]
    lapsed = dead_holders(rows, now, INSTALL)
    assert lapsed == {dead}
    assert [leased(r, now, lapsed) for r in rows] == [True, False, False, False]
