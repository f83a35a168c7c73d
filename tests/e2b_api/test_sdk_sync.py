"""The unmodified `e2b` SDK (sync classes) against `sbx serve` on the real Docker engine
(docs/e2b-api.md): create from a profile, commands in the foreground and background, files,
set_timeout, list by metadata, kill; what is not implemented is a 501 naming it; tenants
and scopes hold."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest
from support import RUN_LABEL

pytestmark = pytest.mark.docker

LABEL_KEY, LABEL_VALUE = RUN_LABEL.split("=")


def _sandbox(**metadata: str):
    from e2b import Sandbox

    return Sandbox.create("default", timeout=120,
                          metadata={LABEL_KEY: LABEL_VALUE, **metadata})


def test_a_command_runs_and_its_output_exit_code_and_failure_reach_the_sdk(e2b_env, live):
    from e2b import CommandExitException

    box = _sandbox()
    try:
        result = box.commands.run("echo hi")
        assert (result.stdout, result.exit_code) == ("hi\n", 0)
        seen: list[str] = []
        result = box.commands.run("echo $GREETING; echo oops >&2; pwd", envs={
            "GREETING": "hello"}, cwd="/tmp", on_stdout=seen.append, on_stderr=seen.append)
        assert result.stdout == "hello\n/tmp\n" and result.stderr == "oops\n"
        assert "".join(seen).count("hello") == 1 and "oops\n" in "".join(seen)
        with pytest.raises(CommandExitException) as failed:
            box.commands.run("echo bad >&2; exit 3")
        assert failed.value.exit_code == 3 and failed.value.stderr == "bad\n"
        # the library sees the same sandbox, owned by the key's owner, on record
        import sandboxer

        with sandboxer.Sandboxer(home=live.home) as sbx:
            record = sbx.get(box.sandbox_id)
            assert record.owner == "writer" and record.state == "running"
            started = [e for e in record.events() if e.type == "sandbox.process.started"]
            assert len(started) == 3 and {e.actor for e in started} == {"writer"}
            assert record.events()[0].actor == "writer"
    finally:
        box.kill()


def test_a_background_command_is_waited_for_fed_stdin_and_killed(e2b_env):
    from e2b import CommandExitException, NotFoundException

    box = _sandbox()
    try:
        handle = box.commands.run("read line; echo got $line", background=True, stdin=True)
        assert handle.pid in [p.pid for p in box.commands.list()]
        box.commands.send_stdin(handle.pid, "ping\n")
        assert handle.wait().stdout == "got ping\n"
        # input as a stream: each piece reaches the process as it is sent
        paired = box.commands.run("read a; read b; echo $a+$b", background=True, stdin=True)
        box.commands.stream_input(paired.pid, ["left\n", b"right\n"])
        assert paired.wait().stdout == "left+right\n"
        with pytest.raises(NotFoundException):
            box.commands.stream_input(paired.pid + 100000, ["nobody\n"])
        sleeper = box.commands.run("sleep 300", background=True)
        assert sleeper.kill() is True
        with pytest.raises(CommandExitException) as killed:
            sleeper.wait()
        assert killed.value.exit_code == 137
        assert sleeper.pid not in [p.pid for p in box.commands.list()]
    finally:
        box.kill()


def test_files_are_written_read_listed_moved_and_removed(e2b_env):
    box = _sandbox()
    try:
        info = box.files.write("/tmp/work/a.txt", "alpha")
        assert info.path == "/tmp/work/a.txt"
        assert box.files.read("/tmp/work/a.txt") == "alpha"
        assert box.files.read("/tmp/work/a.txt", format="bytes") == b"alpha"
        box.files.write("/tmp/work/z.txt", "zipped " * 1000, gzip=True)  # octet-stream, gzip
        assert box.files.read("/tmp/work/z.txt") == "zipped " * 1000
        box.files.remove("/tmp/work/z.txt")
        assert box.files.exists("/tmp/work/a.txt") and not box.files.exists("/tmp/nope")
        assert box.files.make_dir("/tmp/work/sub") is True
        assert box.files.make_dir("/tmp/work/sub") is False
        names = {e.name: e.type.value for e in box.files.list("/tmp/work")}
        assert names == {"a.txt": "file", "sub": "dir"}
        moved = box.files.rename("/tmp/work/a.txt", "/tmp/work/sub/b.txt")
        assert moved.path == "/tmp/work/sub/b.txt"
        assert box.files.get_info("/tmp/work/sub/b.txt").size == 5
        box.files.remove("/tmp/work")
        assert not box.files.exists("/tmp/work")
        assert box.commands.run("ls /tmp").stdout == ""
    finally:
        box.kill()


def test_set_timeout_list_by_metadata_and_kill(e2b_env, live):
    from e2b import Sandbox, SandboxQuery

    one, two = _sandbox(which="one"), _sandbox(which="two")
    try:
        before = one.get_info().end_at
        one.set_timeout(600)
        after = one.get_info().end_at
        assert after - before > timedelta(seconds=300)
        assert after - datetime.now(UTC) <= timedelta(seconds=601)
        one.set_timeout(10)  # sbx never moves a deadline earlier (docs/e2b-api.md)
        assert one.get_info().end_at == after
        found = Sandbox.list(query=SandboxQuery(metadata={"which": "two"})).next_items()
        assert [s.sandbox_id for s in found] == [two.sandbox_id]
        assert found[0].metadata["which"] == "two"
        assert Sandbox.kill(two.sandbox_id) is True
        assert Sandbox.kill(two.sandbox_id) is False
        assert [s.sandbox_id for s in Sandbox.list(
            query=SandboxQuery(metadata={"which": "two"})).next_items()] == []
    finally:
        one.kill()


def test_what_is_not_implemented_is_a_501_naming_it_and_metrics_are_read(e2b_env, live):
    from e2b import Sandbox, SandboxException

    box = _sandbox()
    try:
        with pytest.raises(SandboxException, match="file metadata .* is not implemented"):
            box.files.write("/tmp/m.txt", "x", metadata={"kind": "note"})
        assert not box.files.exists("/tmp/m.txt")  # refused: nothing written
        # the SDK's signed URLs point at the host's root, naming no sandbox, without a key:
        # a 501 naming them (docs/e2b-api.md, "What is refused"), and nothing written
        for answer in (httpx.get(box.download_url("/tmp/m.txt")),
                       httpx.post(box.upload_url("/tmp/m.txt"), files={"file": b"x"})):
            assert answer.status_code == 501
            assert answer.json()["code"] == 501
            assert "signed file URLs" in answer.json()["message"]
        assert not box.files.exists("/tmp/m.txt")
        box.commands.run("true")
        readings = box.get_metrics()  # a live reading when none is stored yet
        assert readings and readings[0].mem_used > 0 and readings[0].mem_total > 0
        answer = httpx.get(f"{live.url}/e2b/templates", headers={"X-API-KEY": e2b_env})
        assert answer.status_code == 501
        assert answer.json() == {"code": 501, "message": "templates is not implemented by "
                                 "sbx's E2B API (docs/e2b-api.md lists what is)"}
        assert Sandbox.connect(box.sandbox_id).commands.run("true").exit_code == 0
    finally:
        box.kill()


def test_another_tenants_sandbox_is_not_found_and_a_read_key_cannot_create(e2b_env, live):
    from e2b import AuthenticationException, NotFoundException, Sandbox, SandboxException

    box = _sandbox()
    try:
        other = live.key("write", owner="someone-else")
        with pytest.raises(NotFoundException):
            Sandbox.connect(box.sandbox_id, api_key=other)
        assert Sandbox.kill(box.sandbox_id, api_key=other) is False
        assert Sandbox.list(api_key=other).next_items() == []
        reader = live.key("read", owner="writer")
        with pytest.raises(SandboxException, match="needs a write key"):
            Sandbox.create("default", api_key=reader)
        with pytest.raises(AuthenticationException):
            Sandbox.list(api_key="not-a-key").next_items()
        # the `e2b_` form of the key is the same key
        assert [s.sandbox_id for s in Sandbox.list(api_key="e2b_" + e2b_env).next_items()] \
            == [box.sandbox_id]
        assert box.is_running()
    finally:
        box.kill()


def test_bad_input_is_refused_with_its_reason_and_changes_nothing(e2b_env, live):
    from e2b import InvalidArgumentException, NotFoundException, Sandbox, SandboxException

    with pytest.raises(SandboxException, match="no-such-profile"):
        Sandbox.create("no-such-profile")
    with pytest.raises(SandboxException, match="timeout must be"):
        Sandbox.create("default", timeout=10 ** 9)
    assert Sandbox.list().next_items() == []
    box = _sandbox()
    try:
        hard = datetime.now(UTC) + timedelta(hours=4)
        box.set_timeout(86400)  # past the profile's ttl.max (4h): the hard deadline holds
        assert box.get_info().end_at <= hard + timedelta(seconds=5)
        with pytest.raises((NotFoundException, SandboxException)):
            box.files.read("/no/such/file")
        with pytest.raises(NotFoundException, match="no folder /no/such/folder"):
            box.commands.run("true", cwd="/no/such/folder")
        with pytest.raises(InvalidArgumentException):
            box.files.list("/root/../..//bad\x00path")
        assert box.files.list("/tmp") == [] or all(
            e.name.startswith(".sbx") for e in box.files.list("/tmp"))
    finally:
        box.kill()


def test_relative_paths_and_commands_start_in_the_home_and_lists_are_newest_first(e2b_env):
    from e2b import Sandbox, SandboxQuery

    older, newer = _sandbox(pair="yes"), _sandbox(pair="yes")
    try:
        home = older.commands.run("pwd").stdout.strip()
        assert home == "/root"  # busybox has no /home/user (E2B's): root's home
        older.files.write("notes.txt", "n")
        assert older.files.get_info("notes.txt").path == "/root/notes.txt"
        assert older.commands.run("cat notes.txt").stdout == "n"
        older.files.remove("never-there.txt")  # as envd: nothing to remove is done
        query = SandboxQuery(metadata={"pair": "yes"})
        assert [s.sandbox_id for s in Sandbox.list(query=query).next_items()] == [
            newer.sandbox_id, older.sandbox_id]
        pages = Sandbox.list(query=query, limit=1)
        first = pages.next_items()
        assert pages.has_next and [s.sandbox_id for s in first] == [newer.sandbox_id]
        assert [s.sandbox_id for s in pages.next_items()] == [older.sandbox_id]
        assert not pages.has_next
        older.pause()
        assert not older.is_running()
    finally:
        older.kill()
        newer.kill()


def test_create_envs_reach_every_command_and_the_record_keeps_names_only(e2b_env, live):
    from e2b import Sandbox

    box = Sandbox.create("default", timeout=120, envs={"TOKEN": "s3cret-value"},
                         metadata={LABEL_KEY: LABEL_VALUE})
    try:
        assert box.commands.run("echo $TOKEN").stdout == "s3cret-value\n"
        assert box.commands.run("echo $TOKEN $MORE", envs={"MORE": "x"}).stdout == \
            "s3cret-value x\n"
        import sandboxer

        with sandboxer.Sandboxer(home=live.home) as sbx:
            text = repr([e.to_dict() for e in sbx.get(box.sandbox_id).events()])
        assert "TOKEN" in text and "s3cret-value" not in text
    finally:
        box.kill()
