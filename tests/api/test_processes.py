"""Background processes (docs/api.md, "Background processes") on the real Docker engine, in
the busybox image: started with env and cwd, their output read and read again from an offset
by another client, stdin written and closed, signals and exit codes, the bounded tail of a
large output, the exit recorded once, the idle rule of the reaper, and processes ending with
their sandbox. Every sandbox carries the run label and is removed by id (the client fixture)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from datetime import timedelta
from pathlib import Path

import pytest
from sshd import sshd_server  # noqa: F401 (a fixture)

import sandboxer
from sandboxer.core.lifecycle.processes import KEEP_BYTES
from sandboxer.core.rules.profiles import ProfileLoader
from tests.api.conftest import RUN, debian_box
from tests.store.test_postgres import pg_url  # noqa: F401 (a fixture)

pytestmark = pytest.mark.docker


def another_client(client: sandboxer.AsyncSandboxer, sbx_home: Path,
                   service) -> sandboxer.AsyncSandboxer:
    """A second, independent client of the same sbx (a new Sandboxer: nothing shared in
    memory with `client`)."""
    if service is None:
        return sandboxer.AsyncSandboxer(home=sbx_home, actor="api-test")
    return sandboxer.AsyncSandboxer(url=service.url, token=service.key())


async def read_all(proc, **offsets) -> dict[str, list[sandboxer.ProcessOutput]]:
    items: dict[str, list] = {"stdout": [], "stderr": []}
    async for item in proc.output(**offsets):
        items[item.stream].append(item)
    return items


def joined(items) -> bytes:
    return b"".join(i.data for i in items)


def of_type(events, kind: str):
    return [e for e in events if e.type == kind]


async def test_start_with_env_and_cwd_then_another_client_reattaches_from_an_offset(
        client, sbx_home, service):
    box = await client.create("default", ttl="10m", labels=RUN)
    proc = await box.processes.start(
        ["sh", "-c", 'echo "$GREETING from $(pwd)"; read line; echo "line: $line"; '
                     'echo warned >&2'],
        env={"GREETING": "hello"}, cwd="/tmp", stdin=True)
    assert proc.pid > 0 and proc.running and proc.exit_code is None
    assert (proc.cwd, proc.env_names, proc.stdin) == ("/tmp", ["GREETING"], True)

    # the first line, as it comes (the process then waits for its input)
    first: list[sandboxer.ProcessOutput] = []
    async with contextlib.aclosing(proc.output(follow=True)) as stream:
        async for item in stream:
            first.append(item)
            if joined(first).endswith(b"\n"):
                break
    assert joined(first) == b"hello from /tmp\n"
    resume_at = first[-1].end
    assert resume_at == len(b"hello from /tmp\n")

    await proc.write("abc\n")
    await proc.close_stdin()

    # a new client, which never saw this process, finds it by pid and reads what it missed
    other = another_client(client, sbx_home, service)
    try:
        again = await (await other.get(box.id)).processes.get(proc.pid)
        assert again.argv == proc.argv
        missed = await read_all(again, stdout_offset=resume_at, stderr_offset=0)
        assert joined(missed["stdout"]) == b"line: abc\n"
        assert missed["stdout"][0].offset == resume_at
        assert joined(missed["stderr"]) == b"warned\n"
        assert not again.running and again.exit_code == 0  # following ended with its exit
        whole = await read_all(again)  # from the start, as often as anyone likes
        assert joined(whole["stdout"]) == b"hello from /tmp\nline: abc\n"
    finally:
        await other.close()
    assert await proc.wait(timeout="30s") == 0
    assert proc.ended_at is not None and proc.ended_at >= proc.started_at

    events = await box.events()
    started = of_type(events, "sandbox.process.started")
    assert [e.payload["pid"] for e in started] == [proc.pid]
    assert started[0].payload["env"] == ["GREETING"] and started[0].payload["cwd"] == "/tmp"
    assert "hello" not in json.dumps([dict(e.payload) for e in events])  # names, never values
    await box.destroy()


async def test_signals_end_it_with_their_exit_code_recorded_once(client, sbx_home, service):
    box = await client.create("default", ttl="10m", labels=RUN)
    termed = await box.processes.start(["sleep", "1000"], stdin=False)
    killed = await box.processes.start(["sleep", "1000"])
    assert {p.pid for p in await box.processes.list()} == {termed.pid, killed.pid}

    await termed.kill(signal.SIGTERM)
    assert await termed.wait(timeout="30s") == 143
    await killed.kill()  # SIGKILL by default
    assert await killed.wait(timeout="30s") == 137

    # everyone who looks sees the same end; it is recorded once
    other = another_client(client, sbx_home, service)
    try:
        again = await (await other.get(box.id)).processes.get(termed.pid)
        assert (again.running, again.exit_code) == (False, 143)
        assert await again.wait() == 143
        async for _ in again.output():
            pass
    finally:
        await other.close()
    assert [(p.pid, p.exit_code) for p in await box.processes.list()] == [
        (termed.pid, 143), (killed.pid, 137)]
    exits = of_type(await box.events(), "sandbox.process.exited")
    assert sorted((e.payload["pid"], e.payload["exit_code"]) for e in exits) == sorted(
        [(termed.pid, 143), (killed.pid, 137)])
    assert all(e.payload["duration_s"] >= 0 for e in exits)

    with pytest.raises(sandboxer.Conflict) as ended:  # nothing left to signal
        await termed.kill()
    assert ended.value.exit_code == 4 and "has ended" in str(ended.value)
    await box.destroy()


async def test_wait_with_a_timeout_says_it_still_runs(client):
    box = await client.create("default", ttl="10m", labels=RUN)
    proc = await box.processes.start(["sleep", "1000"], stdin=False)
    with pytest.raises(sandboxer.OperationFailed) as late:
        await proc.wait(timeout="1s")
    assert "still runs" in str(late.value) and late.value.exit_code == 1
    assert (await proc.refresh()).running
    await box.destroy()


async def test_more_output_than_is_kept_leaves_the_bounded_tail_and_the_offsets_show_the_gap(
        client):
    box = await client.create("default", ttl="10m", labels=RUN)
    count = 2_000_000  # `seq` prints about 14.9 MB: more than the 8 MiB kept
    expected = "".join(f"{i}\n" for i in range(1, count + 1)).encode()
    proc = await box.processes.start(["seq", "1", str(count)], stdin=False)
    assert await proc.wait(timeout="120s") == 0

    items = (await read_all(proc))["stdout"]
    first = items[0].offset
    assert first > 0  # the beginning is gone: the first item says where what is kept starts
    kept = joined(items)
    assert kept == expected[first:]  # continuous from there to the very end
    # docs/api.md: at least the last 8 MiB of each stream, less than 10 MiB in all
    assert KEEP_BYTES <= len(kept) < KEEP_BYTES + 2 * 1024 * 1024
    for before, after in zip(items, items[1:], strict=False):
        assert after.offset == before.end

    # asking from an offset inside what is kept starts exactly there
    later = first + 12345
    tail = (await read_all(proc, stdout_offset=later))["stdout"]
    assert tail[0].offset == later and joined(tail) == expected[later:]
    await box.destroy()


def idle_profile(tmp_path: Path):
    path = tmp_path / "idler.yaml"
    path.write_text("extends: default\nttl:\n  default: 2h\n  idle: 5m\n")
    return ProfileLoader().load_file(path)


async def test_a_running_process_keeps_an_idle_sandbox_from_the_reaper(
        sbx_home, tmp_path, monkeypatch):
    """Idle 5m: a reaper whose clock is 1m ahead warns only the sandbox that has nothing
    running; one 10m ahead ends that sandbox,
    and keeps (recording activity) the one whose process still runs; once that process has
    ended, the next cycle ends it too."""
    from support import remove_test_containers

    profile = idle_profile(tmp_path)
    async with sandboxer.AsyncSandboxer(home=sbx_home, actor="api-test") as sbx:
        try:
            busy = await sbx.create(profile, labels=RUN)
            idle = await sbx.create(profile, labels=RUN)
            proc = await busy.processes.start(["sleep", "100000"], stdin=False)
            before = (await busy.refresh()).idle_deadline
            # a process that ended long ago is no activity
            done = await idle.processes.start(["true"], stdin=False)
            assert await done.wait(timeout="30s") == 0

            # at +1m both are within the 5m warning of their idle deadline: only the idle
            # one is warned; the busy one's process is activity
            monkeypatch.setenv("SBX_CLOCK_OFFSET", "1m")
            async with sandboxer.AsyncSandboxer(home=sbx_home, actor="reaper") as later:
                report = await later.reap()
            assert report.warned == (idle.id,) and report.destroyed == ()
            assert of_type(await busy.events(), "sandbox.expiring") == []

            monkeypatch.setenv("SBX_CLOCK_OFFSET", "10m")
            async with sandboxer.AsyncSandboxer(home=sbx_home, actor="reaper") as later:
                report = await later.reap()
            assert report.destroyed == (idle.id,) and report.reasons[idle.id] == "idle"
            assert [s["id"] for s in report.skipped] == [busy.id]
            await busy.refresh()
            assert busy.state is sandboxer.State.RUNNING
            assert busy.idle_deadline - before >= timedelta(minutes=9)  # activity at +10m

            await proc.kill()
            monkeypatch.setenv("SBX_CLOCK_OFFSET", "30m")
            async with sandboxer.AsyncSandboxer(home=sbx_home, actor="reaper") as later:
                report = await later.reap()
            assert report.destroyed == (busy.id,) and report.reasons[busy.id] == "idle"
            exits = of_type(await busy.events(), "sandbox.process.exited")
            # recorded once, by whoever first saw it end (core/lifecycle/processes.py): the
            # reaper, or the kill itself when its signal script found the process gone already
            assert [(e.payload["pid"], e.payload["exit_code"]) for e in exits] == [
                (proc.pid, 137)]
            assert exits[0].actor in ("reaper", "api-test")
        finally:
            monkeypatch.delenv("SBX_CLOCK_OFFSET", raising=False)
            remove_test_containers(sbx_home)


async def test_processes_end_with_their_sandbox(client, docker_api):
    box = await client.create("default", ttl="10m", labels=RUN)
    proc = await box.processes.start(["sleep", "100000"], stdin=False)
    ref = box.backend_ref
    assert any("sleep 100000" in " ".join(p) for p in docker_api.top(ref)["Processes"])
    await box.destroy()
    assert docker_api.containers(all=True, filters={"id": ref}) == []
    [gone] = await box.processes.list()
    assert (gone.pid, gone.running, gone.exit_code) == (proc.pid, False, None)
    [ended] = of_type(await box.events(), "sandbox.process.exited")
    assert ended.payload["how"] == "sandbox-ended"
    with pytest.raises(sandboxer.Conflict):
        async for _ in gone.output():
            pass


async def test_bad_input_is_refused_and_changes_nothing(client):
    box = await client.create("default", ttl="10m", labels=RUN)
    proc = await box.processes.start(["sleep", "1000"], stdin=False)
    events_before = await box.events()
    activity_before = (await box.refresh()).idle_deadline

    for argv in ([], "sleep 1", ["ok", 3]):
        with pytest.raises(sandboxer.BadInput) as bad:
            await box.processes.start(argv)
        assert bad.value.exit_code == 2 and "argv" in str(bad.value)
    with pytest.raises(sandboxer.BadInput) as relative:
        await box.processes.start(["pwd"], cwd="tmp")
    assert "absolute" in str(relative.value)
    with pytest.raises(sandboxer.BadInput) as env:
        await box.processes.start(["env"], env={"NOT OK": "x"})
    assert "NOT OK" in str(env.value)
    with pytest.raises(sandboxer.NotFound) as no_dir:
        await box.processes.start(["pwd"], cwd="/no/such/folder")
    assert no_dir.value.exit_code == 3 and "/no/such/folder" in str(no_dir.value)

    unknown = 999_999
    with pytest.raises(sandboxer.NotFound) as missing:
        await box.processes.get(unknown)
    assert missing.value.exit_code == 3 and str(unknown) in str(missing.value)
    with pytest.raises(sandboxer.Conflict) as no_stdin:  # started with stdin=False
        await proc.write("x")
    assert no_stdin.value.exit_code == 4

    assert [p.pid for p in await box.processes.list()] == [proc.pid]
    assert [(e.id, e.type) for e in await box.events()] == [
        (e.id, e.type) for e in events_before]
    assert (await box.refresh()).idle_deadline == activity_before
    await box.destroy()


async def test_a_backend_without_processes_refuses_with_exit_4(stub_profile, sbx_home):
    async with sandboxer.AsyncSandboxer(home=sbx_home, actor="api-test") as sbx:
        box = await sbx.create(stub_profile)
        with pytest.raises(sandboxer.Conflict) as refused:
            await box.processes.start(["true"])
        assert refused.value.exit_code == 4 and "stub" in str(refused.value)
        assert await box.processes.list() == []
        await box.destroy()


async def test_the_same_supervisor_runs_on_debian(client, docker_api, tmp_path):
    """Written once for every POSIX sh: Debian's dash and coreutils run what busybox runs."""
    box = await debian_box(client, docker_api, tmp_path)
    proc = await box.processes.start(["sh", "-c", 'echo "$WHO in $PWD"; cat; exit 5'],
                                     env={"WHO": "dash"}, cwd="/usr")
    await proc.write(b"from stdin\n")
    await proc.close_stdin()
    out = await read_all(proc)
    assert joined(out["stdout"]) == b"dash in /usr\nfrom stdin\n"
    assert (proc.running, proc.exit_code) == (False, 5)
    sleeper = await box.processes.start(["sleep", "1000"], stdin=False)
    await sleeper.kill(signal.SIGTERM)
    assert await sleeper.wait(timeout="30s") == 143
    # dash, too, refuses a records folder another user made (here root, for nobody)
    await box.exec(["mkdir", "-m", "777", "/tmp/.sbx-processes-65534"])
    with pytest.raises(sandboxer.OperationFailed) as refused:
        await box.processes.start(["true"], user="nobody", stdin=False)
    assert "/tmp/.sbx-processes-65534 is not this user's own folder" in str(refused.value)
    await box.destroy()


@pytest.mark.sshd
async def test_the_same_supervisor_runs_on_an_ssh_host(sshd_server, sbx_home, tmp_path):  # noqa: F811
    """No backend code: the ssh backend (a real sshd on 127.0.0.1, so the host is this
    machine) runs the processes the docker one does; they outlive the exec that started
    them, which returns at once."""
    from tests.backends.test_ssh import inventory, ssh_profile

    hosts = inventory(tmp_path, [sshd_server.inventory_entry("proc-host", sshd_server.ports[0])])
    profile = ProfileLoader().load_file(ssh_profile(tmp_path, hosts, name="proc-ssh"))
    async with sandboxer.AsyncSandboxer(home=sbx_home, actor="api-test") as sbx:
        box = await sbx.create(profile)
        try:
            proc = await box.processes.start(["sh", "-c", 'echo "$WHO"; cat; echo done >&2'],
                                             env={"WHO": "ssh"}, cwd=str(tmp_path))
            assert Path(f"/proc/{proc.pid}").exists()  # on this machine, running
            # its records: in the user's own folder, which no other user may enter
            records = Path(f"/tmp/.sbx-processes-{os.getuid()}")
            assert (records / str(proc.pid)).is_dir()
            assert records.stat().st_uid == os.getuid()
            assert records.stat().st_mode & 0o777 == 0o700
            await proc.write("line\n")
            await proc.close_stdin()
            out = await read_all(proc)
            assert (joined(out["stdout"]), joined(out["stderr"])) == (b"ssh\nline\n", b"done\n")
            assert proc.exit_code == 0
            sleeper = await box.processes.start(["sleep", "1000"], stdin=False)
            await sleeper.kill(signal.SIGTERM)
            assert await sleeper.wait(timeout="30s") == 143
            assert not Path(f"/proc/{sleeper.pid}").exists()  # ended, and waited for
        finally:
            await box.destroy()


@pytest.mark.postgres
async def test_processes_on_postgresql(pg_url, sbx_home):  # noqa: F811
    """The processes table and its level-triggered exit on PostgreSQL (fleet mode)."""
    from support import remove_test_containers

    async with sandboxer.AsyncSandboxer(home=sbx_home, database_url=pg_url,
                                        actor="api-test") as sbx:
        try:
            box = await sbx.create("default", ttl="10m", labels=RUN)
            proc = await box.processes.start(["sh", "-c", "cat; exit 4"], env={"K": "v"})
            await proc.write(b"x" * 100_000)
            await proc.close_stdin()
            assert await proc.wait(timeout="30s") == 4
            async with sandboxer.AsyncSandboxer(home=sbx_home, database_url=pg_url,
                                                actor="api-test") as other:
                again = await (await other.get(box.id)).processes.get(proc.pid)
                out = await read_all(again)
            assert joined(out["stdout"]) == b"x" * 100_000
            assert [(p.pid, p.exit_code, p.env_names) for p in await box.processes.list()] == [
                (proc.pid, 4, ["K"])]
            assert len(of_type(await box.events(), "sandbox.process.exited")) == 1
            await box.destroy()
        finally:
            remove_test_containers(sbx_home)


async def test_a_process_runs_as_the_user_asked_and_is_still_seen_by_the_reaper(client):
    box = await client.create("default", ttl="10m", labels=RUN)
    proc = await box.processes.start(["sh", "-c", "id -u; exec sleep 1000"], user="nobody",
                                     stdin=False)
    assert proc.user == "nobody"
    async with contextlib.aclosing(proc.output()) as stream:
        async for item in stream:
            assert item.data == b"65534\n"
            break
    assert [p.running for p in await box.processes.list()] == [True]
    await proc.kill(signal.SIGTERM)  # as that user, too
    assert await proc.wait(timeout="30s") == 143
    await box.destroy()


def readers_in(docker_api, ref: str) -> list[str]:
    """The output readers (one exec of the script each) running in the container."""
    return [" ".join(p) for p in docker_api.top(ref, ps_args="-o pid,args")["Processes"]
            if "sbx-process output" in " ".join(p)]


async def test_a_follower_that_stops_leaves_no_reader_and_a_lingering_child_ends_no_follow(
        client, docker_api):
    import time

    box = await client.create("default", ttl="10m", labels=RUN)
    # the shell ends at once, but a child it left holds its stdout open
    parent = await box.processes.start(["sh", "-c", "sleep 100000 & echo started"],
                                       stdin=False)
    out = await read_all(parent)  # follows: ends with the exit, not with the child
    assert joined(out["stdout"]) == b"started\n" and parent.exit_code == 0

    talker = await box.processes.start(["sh", "-c", "echo one; exec sleep 100000"],
                                       stdin=False)
    async with contextlib.aclosing(talker.output(follow=True)) as stream:
        async for item in stream:
            assert item.data == b"one\n"
            break
    # the reader in the sandbox notices its reader has gone (it writes now and then)
    limit = time.monotonic() + 60
    while readers_in(docker_api, box.backend_ref) and time.monotonic() < limit:
        await asyncio.sleep(0.2)
    assert readers_in(docker_api, box.backend_ref) == []
    assert (await talker.refresh()).running
    await box.destroy()


# -- hostile records, paused sandboxes, stuck writes, the tenant's quota --------------------

PLANT = r'''for d in /tmp/.sbx-processes*/; do for pid in "$@"; do
  n="$d$pid
x"
  mkdir "$n" 2>/dev/null && : >"$n/exit" && touch -d 2020-01-01 "$n/exit" && echo planted
done; done'''


async def test_a_folder_named_pid_newline_in_the_records_removes_no_other_process(client):
    """Every start removes records that ended over a day ago: a folder another user (or
    the process itself) names `PID\\nx`, with an old `exit`, is removed as one name, never
    read as two (`PID`: another process's records)."""
    box = await client.create("default", ttl="10m", labels=RUN)
    mine = await box.processes.start(["sleep", "1000"], stdin=False)
    theirs = await box.processes.start(["sleep", "1000"], user="nobody", stdin=False)
    pids = [str(mine.pid), str(theirs.pid)]
    planted = await box.exec(["sh", "-c", PLANT, "sh", *pids], user="nobody")
    assert b"planted" in planted.stdout  # at least in nobody's own records folder

    await box.processes.start(["true"], stdin=False)  # each start cleans up, as its user
    await box.processes.start(["true"], user="nobody", stdin=False)
    for proc in (mine, theirs):
        assert (await proc.refresh()).running, proc.pid  # its records are still there
        await proc.kill(signal.SIGTERM)
        assert await proc.wait(timeout="30s") == 143
    left = await box.exec(["sh", "-c", "ls -a /tmp/.sbx-processes-65534/ | grep -c '^x$'"],
                          user="nobody")
    assert left.stdout.strip() == b"0"  # the planted ones went, as themselves
    await box.destroy()


async def test_records_folder_made_by_another_user_is_refused_and_records_are_private(
        client):
    """Each user's records folder is its own (mode 700): one made first by another user
    is refused, naming it, with nothing started or recorded; in one's own, another user
    can neither replace a process's records nor fake its end; and closing stdin kills only
    the supervisor's own holder, whatever pid the `holder` file names."""
    box = await client.create("default", ttl="10m", labels=RUN)
    made = await box.exec(["sh", "-c", "mkdir -m 777 /tmp/.sbx-processes "
                           "/tmp/.sbx-processes-0 && echo made"], user="nobody")
    assert made.stdout.strip() == b"made"
    events_before = await box.events()
    with pytest.raises(sandboxer.OperationFailed) as refused:
        await box.processes.start(["sleep", "1000"], stdin=False)
    message = str(refused.value)
    assert "/tmp/.sbx-processes-0 is not this user's own folder" in message
    assert "\n" not in message and refused.value.exit_code == 1
    assert await box.processes.list() == []
    assert [e.id for e in await box.events()] == [e.id for e in events_before]

    await box.exec(["rm", "-rf", "/tmp/.sbx-processes-0"])  # root clears it
    victim = await box.processes.start(["sleep", "1000"], stdin=False)
    proc = await box.processes.start(
        ["sh", "-c", 'read other; for d in /tmp/.sbx-processes-*/$$; do '
                     'echo "$other" >"$d/holder"; done; echo pointed; cat'])
    swap = await box.exec(["sh", "-c", 'd=/tmp/.sbx-processes-0/$1; mv "$d" "$d.old" || '
                           'exit 9; mkdir "$d"; echo "42 1" >"$d/exit"; echo 0 >"$d/started"',
                           "sh", str(proc.pid)], user="nobody")
    assert swap.exit_code == 9  # nobody cannot get into root's records folder
    assert (await proc.refresh()).running and proc.exit_code is None

    # the process points its own `holder` at another process: closing stdin spares it
    await proc.write(f"{victim.pid}\n")
    async with contextlib.aclosing(proc.output(follow=True)) as stream:
        async for item in stream:
            assert item.data == b"pointed\n"
            break
    await proc.close_stdin()
    assert (await victim.refresh()).running
    await victim.kill(signal.SIGTERM)
    assert await victim.wait(timeout="30s") == 143
    await proc.kill()
    assert await proc.wait(timeout="30s") == 137
    await box.destroy()


async def test_a_paused_sandbox_with_a_process_is_idle(sbx_home, tmp_path, monkeypatch):
    """Nothing runs in a paused sandbox: its recorded process keeps it from nothing, and
    the reaper ends it at its idle limit, not at its TTL."""
    from support import remove_test_containers

    profile = idle_profile(tmp_path)
    async with sandboxer.AsyncSandboxer(home=sbx_home, actor="api-test") as sbx:
        try:
            box = await sbx.create(profile, labels=RUN)
            proc = await box.processes.start(["sleep", "100000"], stdin=False)
            await box.pause()
            monkeypatch.setenv("SBX_CLOCK_OFFSET", "10m")
            async with sandboxer.AsyncSandboxer(home=sbx_home, actor="reaper") as later:
                report = await later.reap()
            assert report.destroyed == (box.id,) and report.reasons[box.id] == "idle"
            [ended] = await box.processes.list()
            assert (ended.pid, ended.running) == (proc.pid, False)
        finally:
            monkeypatch.delenv("SBX_CLOCK_OFFSET", raising=False)
            remove_test_containers(sbx_home)


async def test_a_write_the_process_does_not_read_times_out(sbx_home, monkeypatch):
    """A write waits for the process to read (a pipe holds 64 KiB): bounded by the
    control timeout and the size, then TimedOut (exit 1); the process runs on."""
    import time

    from sandboxer.core.lifecycle import processes

    monkeypatch.setattr(processes, "CONTROL_TIMEOUT_S", 3.0)
    async with sandboxer.AsyncSandboxer(home=sbx_home, actor="api-test") as sbx:
        from support import remove_test_containers

        try:
            box = await sbx.create("default", ttl="10m", labels=RUN)
            proc = await box.processes.start(["sleep", "600"])  # never reads its stdin
            began = time.monotonic()
            with pytest.raises(sandboxer.OperationFailed) as late:  # TimedOut
                await asyncio.wait_for(proc.write(b"x" * (1 << 20)), 120)
            assert time.monotonic() - began < 60
            assert late.value.exit_code == 1 and "does not read its input" in str(late.value)
            assert (await proc.refresh()).running
            await proc.kill()
            assert await proc.wait(timeout="30s") == 137
        finally:
            remove_test_containers(sbx_home)


async def test_background_processes_count_against_the_tenants_max_execs(sbx_home):
    """A background process is one of the tenant's commands until its end is recorded:
    with max_execs 1, a second start is refused (QuotaExceeded, exit 4, nothing recorded);
    once the first has ended, even unseen by anyone, the next start is let in."""
    from tests.service.live import LiveService

    live = LiveService(sbx_home).start()
    try:
        async with sandboxer.AsyncSandboxer(home=sbx_home, actor="test-setup") as admin:
            _, token = await admin.create_api_key("write", owner="carol", max_execs=1)
        async with sandboxer.AsyncSandboxer(url=live.url, token=token) as carol:
            box = await carol.create("default", ttl="10m", labels=RUN)
            first = await box.processes.start(["sleep", "1000"], stdin=False)
            events_before = await box.events()
            with pytest.raises(sandboxer.QuotaExceeded) as refused:
                await box.processes.start(["true"], stdin=False)
            assert refused.value.exit_code == 4 and "max_execs" in str(refused.value)
            assert [p.pid for p in await box.processes.list()] == [first.pid]
            assert [e.id for e in await box.events()] == [e.id for e in events_before]

            await first.kill()
            assert await first.wait(timeout="30s") == 137
            quick = await box.processes.start(["true"], stdin=False)
            # it ends; nobody asks sbx, only the sandbox's own files say so
            await box.exec(["sh", "-c", f"until [ -f /tmp/.sbx-processes-0/{quick.pid}/exit ]; "
                           "do sleep 0.1; done"], timeout="60s")
            last = await box.processes.start(["true"], stdin=False)  # its end is seen: room
            assert await last.wait(timeout="30s") == 0
            assert (await quick.refresh()).exit_code == 0
            await box.destroy()
    finally:
        live.stop()
        from support import remove_test_containers

        remove_test_containers(sbx_home)
