"""What `sbx exec` leaves in the event log: its argv with the sandbox's own secret values and
the settings' mask patterns replaced by `***`, before the chained event is written (so in the
database, `sbx events`, the JSON Lines sink and evidence alike). Real Docker sandboxes, the
real `sbx` in subprocesses (the `sbx` fixture: settings file <tmp>/xdg-config/sandboxer/
settings.toml)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
from support import (
    RUN_ID,
    RUN_LABEL,
    containers_of,
    events_of,
    install_id_of,
    table_rows,
    write_profile,
)

pytestmark = pytest.mark.docker

VARIABLE = f"SBX_TEST_TOKEN_{RUN_ID}"


def write_settings(sbx, text: str) -> Path:
    path = sbx.cwd / "xdg-config" / "sandboxer" / "settings.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def secret_profile(tmp_path: Path, setup: list[str] | None = None) -> Path:
    body = f'extends: default\nsecrets:\n  TOKEN: "env:{VARIABLE}"\n'
    if setup:
        body += f"setup: {json.dumps(setup)}\n"
    return write_profile(tmp_path, f"secretive-{secrets.token_hex(3)}", body)


def exec_argvs(sbx, sandbox_id: str) -> list[list[str]]:
    return [e["payload"]["argv"] for e in events_of(sbx, sandbox_id) if e["type"] == "sandbox.exec"]


def test_exec_argv_keeps_neither_the_sandboxs_secret_nor_a_masked_pattern(sbx, sbx_home,
                                                                          tmp_path):
    value = f"tok-{secrets.token_hex(16)}"
    other = f"ghp_{secrets.token_hex(12)}"  # no secret of this sandbox: a pattern names it
    env = {VARIABLE: value}
    write_settings(sbx, '[events]\nmask = ["ghp_[0-9a-f]+"]\n')
    box = sbx.create("--profile-file", str(secret_profile(tmp_path)), env=env)

    ran = sbx("exec", box["id"], "--", "sh", "-c", f"echo {value}", env=env)
    assert (ran.code, ran.out) == (0, f"{value}\n")  # it ran as typed; only the record masks
    ran = sbx("exec", box["id"], "--", "sh", "-c", f"echo --token={other}:{value}x", env=env)
    assert ran.code == 0 and ran.out == f"--token={other}:{value}x\n"
    assert exec_argvs(sbx, box["id"]) == [["sh", "-c", "echo ***"],
                                          ["sh", "-c", "echo --token=***:***x"]]

    shown = sbx("events", box["id"], "--json", env=env)
    assert shown.code == 0, shown.err
    delivered = sbx("events", "deliver", env=env)
    assert delivered.code == 0, delivered.err
    evidence = tmp_path / "evidence.json"
    assert sbx("evidence", box["id"], "-o", str(evidence), env=env).code == 0
    checked = sbx("evidence", "verify", str(evidence))
    assert checked.code == 0, checked.out + checked.err
    verified = sbx("events", "verify")
    assert verified.code == 0, verified.out + verified.err

    jsonl = sbx_home / "events.jsonl"
    assert b'"echo ***"' in jsonl.read_bytes()
    assert json.loads(evidence.read_text())["execs"][0]["argv"] == ["sh", "-c", "echo ***"]
    for needle in (value, other):
        assert needle not in shown.out
        assert needle.encode() not in jsonl.read_bytes()
        assert needle not in evidence.read_text()
        hits = [p.name for p in sbx_home.rglob("*") if p.is_file()
                and needle.encode() in p.read_bytes()]
        assert not hits, f"{needle} found in {hits}"


def test_setup_commands_exec_events_are_masked_too(sbx, tmp_path):
    value = f"tok-{secrets.token_hex(16)}"
    env = {VARIABLE: value}
    write_settings(sbx, '[events]\nmask = ["ghp_[0-9a-f]+"]\n')
    profile = secret_profile(tmp_path, setup=[f"echo {value} > /tmp/a",
                                              "echo ghp_0123abcd > /tmp/b"])
    box = sbx.create("--profile-file", str(profile), env=env)
    assert exec_argvs(sbx, box["id"]) == [["sh", "-c", "echo *** > /tmp/a"],
                                          ["sh", "-c", "echo *** > /tmp/b"]]
    ran = sbx("exec", box["id"], "--", "cat", "/tmp/a", "/tmp/b", env=env)
    assert (ran.code, ran.out) == (0, f"{value}\nghp_0123abcd\n")  # setup ran as written


BAD_MASKS = {
    "unclosed-group": ('[events]\nmask = ["ghp_[0-9a-f]+", "(unclosed"]\n',
                       ["events.mask", "'(unclosed'", "not a valid regular expression"]),
    "matches-empty": ('[events]\nmask = ["x*"]\n', ["events.mask", "'x*'", "empty"]),
    "not-a-list": ('[events]\nmask = "ghp_.*"\n', ["events.mask", "list"]),
    "not-strings": ("[events]\nmask = [1]\n", ["events.mask", "list"]),
    "events-not-a-table": ('events = "mask"\n', ["events", "table"]),
}


def test_bad_mask_patterns_exit_2_before_the_command_runs(sbx, sbx_home, tmp_path, docker_api):
    value = f"tok-{secrets.token_hex(16)}"
    env = {VARIABLE: value}
    box = sbx.create("--profile-file", str(secret_profile(tmp_path)), env=env)
    with_setup = secret_profile(tmp_path, setup=["touch /tmp/set-up"])
    install = install_id_of(sbx_home)

    def state():
        return {"sandboxes": table_rows(sbx_home, "sandboxes"),
                "events": table_rows(sbx_home, "events"),
                "containers": sorted(c["Id"] for c in containers_of(docker_api, install))}

    before = state()
    for case, (text, words) in BAD_MASKS.items():
        path = write_settings(sbx, text)
        for argv in (["exec", box["id"], "--", "touch", "/tmp/ran"],
                     ["create", "--profile-file", str(with_setup), "--label", RUN_LABEL]):
            result = sbx(*argv, env=env)
            assert result.code == 2, (case, argv[0], result.code, result.out, result.err)
            assert result.out == ""
            assert len(result.err.strip().splitlines()) == 1, result.err
            for word in [str(path), *words]:
                assert word in result.err, (case, word, result.err)
            assert "Traceback" not in result.err
        assert state() == before, case

    write_settings(sbx, "")
    ran = sbx("exec", box["id"], "--", "test", "-e", "/tmp/ran", env=env)
    assert ran.code == 1  # the refused command never ran
