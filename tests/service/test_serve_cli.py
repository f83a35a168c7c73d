"""`sbx serve` as a process and `sbx` as its client: SBX_URL (or --url) and SBX_TOKEN make
every command act on the service's inventory, not the local one; `sbx api-keys`; what
`sbx serve` refuses before it starts."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from support import RUN_LABEL, SBX, install_id_of, query, remove_test_containers

from tests.service.live import start_process, stop_process


@pytest.fixture
def served(sbx, tmp_path):
    """A real `sbx serve` on 127.0.0.1 over the test's SBX_HOME, its write key, and a client
    home of its own (which must stay empty)."""
    created = sbx("api-keys", "create", "--scope", "write", "--owner", "cli-user")
    assert created.code == 0, created.err
    token = created.out.split()[-1]
    proc, url = start_process(SBX, sbx.env(), cwd=tmp_path)
    client_home = tmp_path / "client-home"
    env = {**sbx.env(), "SBX_HOME": str(client_home), "SBX_URL": url, "SBX_TOKEN": token}
    yield url, token, env, client_home
    stop_process(proc)


def run(env, *args, cwd=None):
    return subprocess.run([*SBX, *args], env=env, capture_output=True, text=True, timeout=120,
                          cwd=cwd)


@pytest.mark.docker
def test_every_command_is_a_client_of_the_service(sbx, served, tmp_path):
    url, token, env, client_home = served
    made = run(env, "create", "--ttl", "10m", "--label", RUN_LABEL, "--name", "via-http",
               "--json")
    assert made.returncode == 0, made.stderr
    sandbox_id = json.loads(made.stdout)["id"]
    listed = run(env, "ls", "--json")
    assert [b["id"] for b in json.loads(listed.stdout)] == [sandbox_id]
    out = run(env, "exec", "via-http", "--", "sh", "-c", "echo over http; exit 7")
    assert (out.returncode, out.stdout) == (7, "over http\n")
    gone = run(env, "destroy", "via-http")
    assert gone.returncode == 0 and gone.stdout.strip() == f"destroyed {sandbox_id}"
    # the service's database has all of it, done by the key's owner ...
    rows = query(sbx.home, "SELECT id, state, owner FROM sandboxes")
    assert rows == [{"id": sandbox_id, "state": "destroyed", "owner": "cli-user"}]
    actors = {r["actor"] for r in query(sbx.home, "SELECT actor FROM events WHERE "
                                                  "sandbox_id = ?", sandbox_id)}
    assert actors == {"cli-user"}
    types = [r["type"] for r in query(sbx.home, "SELECT type FROM events WHERE sandbox_id = ? "
                                                "ORDER BY id", sandbox_id)]
    assert "sandbox.exec" in types and types[-1] == "sandbox.destroyed"
    # ... and the client's own home has nothing: no database, no installation
    assert not (client_home / "sbx.db").exists() and install_id_of(client_home) is None
    # --url does what SBX_URL does
    plain = {k: v for k, v in env.items() if k != "SBX_URL"}
    shown = run(plain, "--url", url, "show", sandbox_id, "--json")
    assert shown.returncode == 0 and '"state": "destroyed"' in shown.stdout
    remove_test_containers(sbx.home)


def test_errors_over_the_service_keep_the_clis_codes_and_lines(sbx, served):
    url, token, env, client_home = served
    missing = run(env, "show", "sbx-nothere")
    assert missing.returncode == 3
    assert missing.stderr.startswith("sbx: ") and "sbx-nothere" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    bad = run(env, "create", "--ttl", "soon")
    assert bad.returncode == 2 and "ttl" in bad.stderr
    as_reader = run({**env, "SBX_TOKEN": "sbxk_bogus"}, "ls")
    assert as_reader.returncode == 5 and "API key" in as_reader.stderr  # refused: unauthorized
    keys = run(env, "api-keys", "ls")  # a write key may not manage keys
    assert keys.returncode == 2 and "admin" in keys.stderr
    nowhere = run({**env, "SBX_URL": "http://127.0.0.1:9"}, "ls")
    assert nowhere.returncode == 5 and "cannot reach the sbx service" in nowhere.stderr
    assert not (client_home / "sbx.db").exists()


def test_api_keys_create_ls_revoke(sbx):
    made = sbx("api-keys", "create", "--scope", "read", "--owner", "dashboards")
    assert made.code == 0, made.err
    token = made.out.split()[-1]
    assert token.startswith("sbxk_")
    listed = sbx("api-keys", "ls", "--json").json()
    assert [(k["scope"], k["owner"], k["revoked_at"]) for k in listed] == [
        ("read", "dashboards", None)]
    stored = query(sbx.home, "SELECT * FROM api_keys")
    assert token not in repr(stored) and len(stored[0]["key_hash"]) == 64
    gone = sbx("api-keys", "revoke", listed[0]["id"])
    assert gone.code == 0 and "revoked" in gone.out
    assert sbx("api-keys", "ls", "--json").json()[0]["revoked_at"] is not None
    assert sbx("api-keys", "revoke", "key-nothere").code == 3
    before = query(sbx.home, "SELECT * FROM api_keys")
    bad = sbx("api-keys", "create", "--scope", "root")
    assert bad.code == 2 and len(bad.err.strip().splitlines()) == 1
    assert query(sbx.home, "SELECT * FROM api_keys") == before


def test_serve_beyond_loopback_without_a_key_refuses_to_start(sbx):
    result = sbx("serve", "--listen", "0.0.0.0:0", timeout=60)
    assert result.code == 2
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and "beyond loopback" in lines[0] and "api-keys create" in lines[0]
    assert sbx("serve", "--listen", "nonsense", timeout=60).code == 2
    assert sbx("serve", "--reap-every", "soon", timeout=60).code == 2


def test_serve_on_a_socket_of_mode_0600(sbx, tmp_path):
    import time

    import httpx

    path = tmp_path / "sbx.sock"
    proc = subprocess.Popen([*SBX, "serve", "--socket", str(path)], env=sbx.env(),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 60
        while not path.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.1)
        assert os.stat(path).st_mode & 0o777 == 0o600
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(path)),
                          base_url="http://sbx") as http:
            deadline = time.monotonic() + 30
            while True:
                try:
                    listed = http.get("/v1/sandboxes")
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
        assert listed.status_code == 200 and listed.json() == {"items": [],
                                                               "next_cursor": None}
        second = sbx("serve", "--socket", str(path), timeout=60)  # one service per socket
        assert second.code == 4 and "another service" in second.err
    finally:
        _, err = stop_process(proc)
    assert proc.returncode == 0, err
    assert not path.exists()  # removed on the way out


@pytest.mark.docker
def test_metrics_all_over_the_service_follows_the_services_sandboxes(sbx, served):
    """`sbx metrics --all --follow` as a client: the service follows its running sandboxes."""
    import queue
    import threading
    import time

    url, token, env, client_home = served
    made = run(env, "create", "--ttl", "10m", "--label", RUN_LABEL, "--json")
    assert made.returncode == 0, made.stderr
    sandbox_id = json.loads(made.stdout)["id"]
    follow = subprocess.Popen([*SBX, "metrics", "--all", "--follow", "--json"], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in follow.stdout], daemon=True).start()
    seen, deadline = [], time.monotonic() + 90
    try:
        while not seen and time.monotonic() < deadline and follow.poll() is None:
            try:
                doc = json.loads(lines.get(timeout=1))
            except queue.Empty:
                continue
            if doc["sandbox_id"] == sandbox_id:
                seen.append(doc)
    finally:
        follow.terminate()
        _, err = follow.communicate(timeout=30)
        run(env, "destroy", sandbox_id)
        remove_test_containers(sbx.home)
    assert seen and seen[0]["memory_bytes"], err
    assert "Traceback" not in err and follow.returncode == 0, err
    assert not (client_home / "sbx.db").exists()
