"""The ssh backend ("attach") through the real `sbx` CLI, against a real OpenSSH server on
127.0.0.1 (tests/sshd.py). The server listens on three ports; an inventory lists each port as
a host of its own, so one sshd stands in for three machines. Setup and cleanup commands run
on "the host", which is this machine: their traces are files in the test's tmp folder.
(The conformance kit runs against the same server in tests/backends/test_conformance.py.)
"""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from sshd import free_port, sshd_server, start_sshd  # noqa: F401 (sshd_server: a fixture)
from support import SBX, events_of, library_terminal, query, show, table_rows, write_profile

pytestmark = pytest.mark.sshd


def inventory(folder: Path, hosts: list[dict], name: str = "hosts.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump({"hosts": hosts}))
    return path


def ssh_profile(folder: Path, inventory_path: Path, *, name: str = "attach", match=None,
                setup=(), cleanup=(), connect_timeout: float = 3) -> Path:
    options = {"inventory": str(inventory_path), "connect_timeout": connect_timeout}
    if match:
        options["match"] = match
    if setup:
        options["setup"] = list(setup)
    if cleanup:
        options["cleanup"] = list(cleanup)
    body = ("backend: ssh\nnetwork: {mode: full}\nresources: {memory: null, pids: null}\n"
            + yaml.safe_dump({"options": options}))
    return write_profile(folder, name, body)


def leases(home: Path) -> list[dict]:
    """The lease rows, read straight from the adapter's file."""
    path = home / "ssh-leases.db"
    if not path.exists():
        return []
    with sqlite3.connect(path) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM ssh_leases ORDER BY address")]


def nothing_written(sbx) -> None:
    assert sbx("ls", "--all", "--json").json() == []
    assert table_rows(sbx.home, "events") == []
    assert leases(sbx.home) == []


@pytest.fixture
def three_hosts(sshd_server, tmp_path) -> Path:  # noqa: F811
    return inventory(tmp_path, [
        sshd_server.inventory_entry(f"host-{i}", port, {"pool": "ci", "slot": str(i)})
        for i, port in enumerate(sshd_server.ports, 1)])


@pytest.fixture
def one_host(sshd_server, tmp_path) -> Path:  # noqa: F811
    return inventory(tmp_path, [sshd_server.inventory_entry("only", sshd_server.ports[0],
                                                            {"pool": "ci"})], "one.yaml")


# -- the lifecycle --------------------------------------------------------------------------


def test_create_runs_setup_exec_gives_exit_codes_destroy_runs_cleanup(sbx, three_hosts,
                                                                      sshd_server, tmp_path):  # noqa: F811
    work = tmp_path / "on-host"
    profile = ssh_profile(
        tmp_path, three_hosts, match={"slot": "2"},
        setup=[f"mkdir -p {work}/$SBX_SANDBOX_ID", f"echo ready > {work}/$SBX_SANDBOX_ID/setup"],
        cleanup=[f"rm -rf {work}/$SBX_SANDBOX_ID"])
    box = sbx.create("--profile-file", str(profile), "--label", "team=infra")
    assert (box["backend"], box["state"]) == ("ssh", "running")
    assert box["backend_ref"] == f"host-2/{box['id']}"  # the host with slot=2
    assert (work / box["id"] / "setup").read_text() == "ready\n"
    [lease] = leases(sbx.home)
    assert lease["address"] == f"{sshd_server.user}@127.0.0.1:{sshd_server.ports[1]}"
    assert lease["sandbox_id"] == box["id"]

    ran = sbx("exec", box["id"], "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert (ran.code, ran.out, ran.err) == (7, "out\n", "err\n")
    quoted = sbx("exec", box["id"], "--", "printf", "%s|", "a b", "c'd", "$HOME")
    assert (quoted.code, quoted.out) == (0, "a b|c'd|$HOME|")  # argv arrives as given
    assert sbx("exec", box["id"], "--", "sh", "-c", "exit 255").code == 255  # the command's own

    done = sbx("destroy", box["id"], "--yes")
    assert done.code == 0, done.err
    assert not (work / box["id"]).exists()
    assert leases(sbx.home) == []
    assert show(sbx, box["id"])["state"] == "destroyed"
    assert sbx("destroy", box["id"], "--yes").code == 0  # already destroyed: fine

    key = sshd_server.key.read_text().split("\n")[1]  # the private key's first line of data
    for path in sbx.home.rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), f"the private key is in {path}"


def test_a_lease_survives_a_restart_and_keeps_the_host_from_others(sbx, one_host, tmp_path):
    profile = ssh_profile(tmp_path, one_host)
    box = sbx.create("--profile-file", str(profile))
    # every call below is a new sbx process: the lease is in the file, not in a process
    listed = sbx("ls", "--json").json()
    assert [(b["id"], b["state"]) for b in listed] == [(box["id"], "running")]
    taken = sbx("create", "--profile-file", str(profile))
    assert taken.code == 1, taken.err
    assert "no free ssh host" in taken.err and box["id"] in taken.err
    assert len(taken.err.strip().splitlines()) == 1
    assert [b["id"] for b in sbx("ls", "--all", "--json").json()] == [box["id"]]  # nothing written

    reconciled = sbx("reconcile", "--json")
    assert reconciled.code == 0, reconciled.err
    assert show(sbx, box["id"])["state"] == "running"  # listed with its labels: not lost
    assert sbx("exec", box["id"], "--", "true").code == 0

    assert sbx("destroy", box["id"], "--yes").code == 0
    again = sbx.create("--profile-file", str(profile))  # the host is free again
    assert again["backend_ref"] == f"only/{again['id']}"
    assert sbx("destroy", again["id"], "--yes").code == 0


def concurrently(sbx, *commands: list[str]) -> list[tuple[int, str, str]]:
    procs = [subprocess.Popen([*SBX, *args], cwd=sbx.cwd, env=sbx.env(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for args in commands]
    return [(p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for p in procs]


def test_two_concurrent_creates_with_one_free_host_one_wins_the_other_fails_cleanly(
        sbx, sshd_server, tmp_path):  # noqa: F811
    hosts = inventory(tmp_path, [sshd_server.inventory_entry("busy", sshd_server.ports[0]),
                                 sshd_server.inventory_entry("free", sshd_server.ports[1])])
    profile = ssh_profile(tmp_path, hosts)
    first = sbx.create("--profile-file", str(profile))
    assert first["backend_ref"].startswith("busy/")

    results = concurrently(sbx, *[["create", "--profile-file", str(profile), "--json"]] * 2)
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 1], results
    [(_, out, _)] = [r for r in results if r[0] == 0]
    [(_, lost, _)] = [r for r in results if r[0] == 1]
    error = json.loads(lost)["error"]  # --json: the error is one JSON object on stdout
    assert error["code"] == 1 and error["message"].startswith("no free ssh host"), error
    winner = show(sbx, json.loads(out)["id"])
    assert winner["backend_ref"].startswith("free/")

    rows = leases(sbx.home)
    assert len(rows) == 2 and len({r["address"] for r in rows}) == 2  # never double-leased
    running = [b for b in sbx("ls", "--json").json() if b["state"] == "running"]
    assert sorted(b["id"] for b in running) == sorted([first["id"], winner["id"]])


def test_concurrent_creates_take_different_hosts(sbx, three_hosts, tmp_path):
    profile = ssh_profile(tmp_path, three_hosts, match={"pool": "ci"})
    results = concurrently(sbx, *[["create", "--profile-file", str(profile), "--json"]] * 4)
    assert sorted(code for code, _, _ in results) == [0, 0, 0, 1], results
    refs = [json.loads(out)["backend_ref"] for code, out, _ in results if code == 0]
    assert sorted(ref.split("/")[0] for ref in refs) == ["host-1", "host-2", "host-3"]
    assert len({r["address"] for r in leases(sbx.home)}) == 3


# -- hosts that do not answer ---------------------------------------------------------------


def test_a_closed_port_is_reported_naming_the_host_and_releases_the_lease(
        sbx, sshd_server, tmp_path):  # noqa: F811
    entry = {**sshd_server.inventory_entry("gone", free_port()), "labels": {}}
    profile = ssh_profile(tmp_path, inventory(tmp_path, [entry]), connect_timeout=3)
    started = time.monotonic()
    result = sbx("create", "--profile-file", str(profile))
    assert time.monotonic() - started < 15
    assert result.code == 5, result.err
    assert "'gone'" in result.err and "Connection refused" in result.err
    assert leases(sbx.home) == []  # the host is not kept by a create that failed


def test_a_host_that_accepts_but_never_speaks_is_reported_within_the_timeout(
        sbx, sshd_server, tmp_path):  # noqa: F811
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel completes the TCP handshake; nothing ever answers
    try:
        entry = sshd_server.inventory_entry("silent", silent.getsockname()[1])
        profile = ssh_profile(tmp_path, inventory(tmp_path, [entry]), connect_timeout=2)
        started = time.monotonic()
        result = sbx("create", "--profile-file", str(profile))
        took = time.monotonic() - started
    finally:
        silent.close()
    assert result.code == 5, result.err
    assert "'silent'" in result.err
    assert took < 15, f"took {took:.1f}s with a 2s connect timeout"
    assert leases(sbx.home) == []


def test_a_host_that_goes_away_is_reported_and_keeps_its_lease_until_cleaned(sbx, tmp_path):
    server = start_sshd(tmp_path / "lonely-sshd")
    try:
        hosts = inventory(tmp_path, [server.inventory_entry("lonely", server.port)])
        profile = ssh_profile(tmp_path, hosts, cleanup=["true"], connect_timeout=2)
        box = sbx.create("--profile-file", str(profile))
        assert sbx("exec", box["id"], "--", "true").code == 0
    finally:
        server.stop()
    started = time.monotonic()
    ran = sbx("exec", box["id"], "--", "true")
    assert ran.code == 5, ran.err
    assert "'lonely'" in ran.err
    gone = sbx("destroy", box["id"], "--yes")
    assert time.monotonic() - started < 30
    assert gone.code == 5, gone.err
    assert "'lonely'" in gone.err
    # cleanup could not run: the host stays leased (never handed out dirty), the sandbox waits
    assert [r["sandbox_id"] for r in leases(sbx.home)] == [box["id"]]
    assert show(sbx, box["id"])["state"] == "destroying"


# -- setup failing, TTL, reconcile ---------------------------------------------------------


def test_a_failing_setup_fails_the_create_cleans_up_and_frees_the_host(sbx, one_host, tmp_path):
    trace = tmp_path / "cleaned"
    profile = ssh_profile(tmp_path, one_host, setup=["echo half-done", "echo broken >&2; exit 3"],
                          cleanup=[f"touch {trace}"])
    result = sbx("create", "--profile-file", str(profile))
    assert result.code == 1, result.err
    assert "setup command" in result.err and "exit 3" in result.err and "'only'" in result.err
    assert trace.exists()
    assert leases(sbx.home) == []
    [row] = sbx("ls", "--all", "--json").json()
    assert row["state"] == "failed"


def test_an_expired_lease_is_reaped_running_its_cleanup(sbx, one_host, tmp_path):
    trace = tmp_path / "reaped"
    profile = ssh_profile(tmp_path, one_host, cleanup=[f"echo $SBX_SANDBOX_ID > {trace}"])
    box = sbx.create("--profile-file", str(profile), "--ttl", "10m")
    assert sbx("reap", "--json").json()["destroyed"] == []
    reaped = sbx("reap", "--json", env={"SBX_CLOCK_OFFSET": "11m"})
    assert reaped.code == 0, reaped.err
    assert reaped.json()["destroyed"] == [box["id"]]
    assert trace.read_text() == f"{box['id']}\n"
    assert leases(sbx.home) == []
    assert [e["reason"] for e in events_of(sbx, box["id"]) if e["type"] == "sandbox.destroyed"] \
        == ["ttl"]


def test_a_pool_on_ssh_hosts_leases_members_ahead_and_a_create_claims_one(sbx, three_hosts,
                                                                          tmp_path):
    """Warm pools on the ssh backend (docs/pools.md): members lease hosts ahead of need, with
    their setup run; a create claims one; the reaper refills; drain runs their cleanup."""
    work = tmp_path / "on-host"
    folder = sbx.cwd / "xdg-config" / "sandboxer" / "profiles"  # on the search path
    folder.mkdir(parents=True, exist_ok=True)
    options = {"inventory": str(three_hosts), "connect_timeout": 3,
               "setup": [f"mkdir -p {work}/$SBX_SANDBOX_ID"],
               "cleanup": [f"rm -rf {work}/$SBX_SANDBOX_ID"]}
    (folder / "attach-warm.yaml").write_text(
        "backend: ssh\nnetwork: {mode: full}\nresources: {memory: null, pids: null}\n"
        "pool: {size: 2, max_age: 10m}\n" + yaml.safe_dump({"options": options}))

    filled = sbx("reap", "--json")
    assert filled.code == 0, filled.err
    warmed = sorted(p["id"] for p in filled.json()["pools"] if p["action"] == "warmed")
    assert len(warmed) == 2
    assert sorted(lease["sandbox_id"] for lease in leases(sbx.home)) == warmed
    assert sorted(p.name for p in work.iterdir()) == warmed  # setup ran before they were warm
    refs = {r["backend_ref"] for r in query(sbx.home, "SELECT backend_ref FROM sandboxes")}
    assert sbx("ls", "--json").json() == []  # members are nobody's

    box = sbx.create("--profile", "attach-warm", "--ttl", "5m", "--label", "team=infra")
    assert (box["launch"], box["backend"], box["state"]) == ("warm", "ssh", "running")
    assert box["backend_ref"] in refs and box["labels"]["team"] == "infra"
    ran = sbx("exec", box["id"], "--", "sh", "-c", "echo claimed")
    assert (ran.code, ran.out) == (0, "claimed\n")

    refilled = sbx("reap", "--json")
    assert refilled.code == 0, refilled.err
    assert [p["action"] for p in refilled.json()["pools"]] == ["warmed"]
    assert len(leases(sbx.home)) == 3  # the third host, for the new member

    drained = sbx("pool", "drain", "attach-warm", "--json")
    assert drained.code == 0, drained.err
    assert len(drained.json()["destroyed"]) == 2 and drained.json()["failed"] == []
    assert [lease["address"] for lease in leases(sbx.home)] == [
        lease["address"] for lease in leases(sbx.home) if lease["sandbox_id"] == box["id"]]
    assert len(leases(sbx.home)) == 1
    assert [p.name for p in work.iterdir()] == [box["backend_ref"].split("/", 1)[1]]
    assert sbx("destroy", box["id"], "--yes").code == 0
    assert leases(sbx.home) == [] and list(work.iterdir()) == []


def test_reconcile_adopts_a_lease_when_the_database_is_lost(sbx, one_host, tmp_path):
    box = sbx.create("--profile-file", str(ssh_profile(tmp_path, one_host)))
    for path in sbx.home.glob("sbx.db*"):
        path.unlink()
    result = sbx("reconcile", "--json", env={"SBX_CLOCK_OFFSET": "2m"})  # past the grace
    assert result.code == 0, result.err
    adopted = show(sbx, box["id"])
    assert (adopted["backend"], adopted["backend_ref"], adopted["state"]) == (
        "ssh", box["backend_ref"], "running")
    assert sbx("destroy", box["id"], "--yes").code == 0
    assert leases(sbx.home) == []


# -- bad input: exit 2 naming it, nothing written --------------------------------------------


def test_an_inventory_entry_without_a_host_is_refused_naming_it(sbx, sshd_server, tmp_path):  # noqa: F811
    entry = sshd_server.inventory_entry("nameless")
    del entry["host"]
    hosts = inventory(tmp_path, [sshd_server.inventory_entry("fine"), entry])
    result = sbx("create", "--profile-file", str(ssh_profile(tmp_path, hosts)))
    assert result.code == 2, result.err
    assert f"ssh inventory {hosts}: host #2 ('nameless'): no host" in result.err
    assert len(result.err.strip().splitlines()) == 1
    nothing_written(sbx)


def test_a_key_file_that_does_not_exist_is_refused_naming_the_entry(sbx, sshd_server, tmp_path):  # noqa: F811
    missing = tmp_path / "keys" / "nope"
    hosts = inventory(tmp_path, [{**sshd_server.inventory_entry("web-1"), "key": str(missing)}])
    result = sbx("create", "--profile-file", str(ssh_profile(tmp_path, hosts)))
    assert result.code == 2, result.err
    assert "'web-1'" in result.err and f"key file {missing} does not exist" in result.err
    assert len(result.err.strip().splitlines()) == 1
    nothing_written(sbx)


@pytest.mark.parametrize(("setup_profile", "message"), [
    (lambda tmp, inv: ssh_profile(tmp, tmp / "no-such.yaml"), "cannot read"),
    (lambda tmp, inv: ssh_profile(tmp, inv, match={"pool": "gpu"}), "options.match"),
    (lambda tmp, inv: write_profile(tmp, "typo", "backend: ssh\nnetwork: {mode: full}\n"
                                    "resources: {memory: null, pids: null}\n"
                                    f"options: {{inventory: {inv}, hots: 1}}\n"),
     "no option hots"),
    (lambda tmp, inv: ssh_profile(tmp, inv, connect_timeout=-1), "connect_timeout"),
], ids=["missing-inventory", "no-host-matches", "unknown-option", "negative-timeout"])
def test_bad_ssh_settings_exit_2_and_write_nothing(sbx, one_host, tmp_path, setup_profile,
                                                  message):
    result = sbx("create", "--profile-file", str(setup_profile(tmp_path, one_host)))
    assert result.code == 2, result.err
    assert message in result.err
    assert len(result.err.strip().splitlines()) == 1
    nothing_written(sbx)


def test_what_an_attached_host_cannot_enforce_is_refused(sbx, one_host, tmp_path):
    walled = write_profile(tmp_path, "walled", "backend: ssh\nresources: {memory: null, pids: null}\n"
                           f"options: {{inventory: {one_host}}}\n")  # network: none
    result = sbx("create", "--profile-file", str(walled))
    assert result.code == 4, result.err
    assert "network" in result.err
    capped = write_profile(tmp_path, "capped", "backend: ssh\nnetwork: {mode: full}\n"
                           f"options: {{inventory: {one_host}}}\n")  # memory: 512MiB default
    result = sbx("create", "--profile-file", str(capped))
    assert result.code == 4 and "resources.memory" in result.err, result.err
    nothing_written(sbx)


def test_doctor_shows_the_ssh_backend(sbx, one_host):
    report = sbx("doctor", "--json", env={"SBX_SSH_INVENTORY": str(one_host)}).json()
    ssh = {b["name"]: b for b in report["backends"]}["ssh"]
    assert ssh["loaded"] and ssh["reachable"] and ssh["capabilities"] == ["exec", "files", "processes", "pty",
                                                                  "volumes"]
    assert f"inventory {one_host}: 1 host(s)" in ssh["detail"]


# -- host keys: strict by default, pinned, or trusted on first use --------------------------


def unpinned(entry: dict, **fields) -> dict:
    """An inventory entry without the known_hosts file tests/sshd.py pins its key with."""
    return {**{k: v for k, v in entry.items() if k != "known_hosts"}, **fields}


def user_home(folder: Path, known_hosts: str = "") -> Path:
    """A $HOME for sbx, with a ~/.ssh/known_hosts holding `known_hosts`."""
    dot_ssh = folder / ".ssh"
    dot_ssh.mkdir(parents=True, mode=0o700)
    (dot_ssh / "known_hosts").write_text(known_hosts)
    return folder


def test_an_unknown_host_key_is_refused_by_default_and_nothing_is_leased(
        sbx, sshd_server, tmp_path):  # noqa: F811
    hosts = inventory(tmp_path, [unpinned(sshd_server.inventory_entry("stranger"))])
    profile = ssh_profile(tmp_path, hosts)
    nobody = {"HOME": str(user_home(tmp_path / "home-empty"))}
    result = sbx("create", "--profile-file", str(profile), env=nobody)
    assert result.code == 5, result.err
    [line] = result.err.strip().splitlines()
    assert "'stranger'" in line and "host key is not known" in line
    assert "host_key_policy: tofu" in line and "~/.ssh/known_hosts" in line
    assert leases(sbx.home) == []
    own = sbx.home / "ssh-known_hosts"  # nothing was learnt on the way
    assert not own.exists() or own.read_text() == ""
    assert (tmp_path / "home-empty" / ".ssh" / "known_hosts").read_text() == ""

    # the same host, known in the user's own ~/.ssh/known_hosts: accepted
    knows = {"HOME": str(user_home(tmp_path / "home-knows", sshd_server.known_hosts.read_text()))}
    box = sbx.create("--profile-file", str(profile), env=knows)
    assert sbx("exec", box["id"], "--", "true", env=knows).code == 0
    assert sbx("destroy", box["id"], "--yes", env=knows).code == 0
    assert leases(sbx.home) == []


def test_a_host_key_pinned_in_the_entry_is_the_only_one_accepted(sbx, sshd_server, tmp_path):  # noqa: F811
    nobody = {"HOME": str(user_home(tmp_path / "home-empty"))}
    pinned = inventory(tmp_path, [unpinned(sshd_server.inventory_entry("pinned"),
                                           host_key=sshd_server.host_public_key)], "pinned-hosts.yaml")
    box = sbx.create("--profile-file", str(ssh_profile(tmp_path, pinned, name="pin")), env=nobody)
    ran = sbx("exec", box["id"], "--", "echo", "pinned", env=nobody)
    assert (ran.code, ran.out) == (0, "pinned\n"), ran.err
    assert sbx("destroy", box["id"], "--yes", env=nobody).code == 0

    other = sshd_server.key.with_suffix(".pub").read_text().split()[:2]  # a key, not the host's
    wrong = inventory(tmp_path, [unpinned(sshd_server.inventory_entry("wrong"),
                                          host_key=" ".join(other))], "wrong-hosts.yaml")
    knows = {"HOME": str(user_home(tmp_path / "home-knows", sshd_server.known_hosts.read_text()))}
    result = sbx("create", "--profile-file", str(ssh_profile(tmp_path, wrong, name="wrong")),
                 env=knows)  # the pin wins over what the user's known_hosts says
    assert result.code == 5, result.err
    assert "'wrong'" in result.err and "not the one trusted" in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert leases(sbx.home) == []


def test_tofu_trusts_the_first_key_and_then_refuses_a_changed_one(sbx, tmp_path):
    server = start_sshd(tmp_path / "tofu-sshd")
    try:
        nobody = {"HOME": str(user_home(tmp_path / "home-empty"))}
        hosts = inventory(tmp_path, [unpinned(server.inventory_entry("fresh"),
                                              host_key_policy="tofu")])
        profile = ssh_profile(tmp_path, hosts)
        box = sbx.create("--profile-file", str(profile), env=nobody)
        assert sbx("destroy", box["id"], "--yes", env=nobody).code == 0
        learnt = (sbx.home / "ssh-known_hosts").read_text()
        assert server.host_public_key in learnt  # remembered in sbx's file, not the user's
        assert (tmp_path / "home-empty" / ".ssh" / "known_hosts").read_text() == ""

        server.restart_with_new_host_key()
        result = sbx("create", "--profile-file", str(profile), env=nobody)
        assert result.code == 5, result.err
        [line] = result.err.strip().splitlines()
        assert "'fresh'" in line and "not the one trusted" in line
        assert leases(sbx.home) == []
        assert (sbx.home / "ssh-known_hosts").read_text() == learnt  # the old key stays
    finally:
        server.stop()


@pytest.mark.parametrize(("fields", "message"), [
    ({"host_key": "ssh-ed25519 not-base64!"}, "is not a public key"),
    ({"host_key": "ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIA=="}, "is not a public key"),
    ({"host_key_policy": "yolo"}, "host_key_policy must be"),
    ({"host_key_policy": "tofu", "known_hosts": "PIN"}, "already pin it"),
], ids=["garbage-key", "type-mismatch", "unknown-policy", "tofu-and-pin"])
def test_bad_host_key_settings_exit_2_and_write_nothing(
        sbx, sshd_server, tmp_path, fields, message):  # noqa: F811
    entry = unpinned(sshd_server.inventory_entry("odd"), **fields)
    if entry.get("known_hosts") == "PIN":
        entry["known_hosts"] = str(sshd_server.known_hosts)
    result = sbx("create", "--profile-file",
                 str(ssh_profile(tmp_path, inventory(tmp_path, [entry]))))
    assert result.code == 2, result.err
    assert "'odd'" in result.err and message in result.err
    assert len(result.err.strip().splitlines()) == 1
    nothing_written(sbx)


# -- a terminal through the library ---------------------------------------------------------


def test_a_terminal_on_a_leased_host_through_the_library(one_host, sbx_home):
    """box.pty() on the ssh backend: the login shell the core chooses, on the host, at the
    size asked for; a resize reaches it; `exit 4` is the terminal's exit code."""
    import asyncio

    profile = {"name": "attach-pty", "backend": "ssh", "network": {"mode": "full"},
               "resources": {"memory": None, "pids": None},
               "options": {"inventory": str(one_host), "connect_timeout": 3}}
    seen, code = asyncio.run(library_terminal(sbx_home, "ssh-test", profile))
    assert b"20 90" in seen
    assert code == 4
