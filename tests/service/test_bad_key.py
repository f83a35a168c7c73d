"""A key the service refuses is an authentication failure, not bad input (issue 29, point 5):
the CLI as a client of a real `sbx serve` exits 5 (docs/cli.md: credentials missing or
refused), in one line naming the service and where the key comes from, and the 401's body
says code 5, kind `unauthorized`. Nothing is done."""

from __future__ import annotations

import json

import httpx
from support import table_rows

from tests.service.test_serve_cli import run, served  # noqa: F401 (the fixture)


def test_a_wrong_missing_or_revoked_key_exits_5(sbx, served):  # noqa: F811
    url, token, env, _ = served
    revoked = sbx("api-keys", "create", "--scope", "write", "--owner", "gone")
    revoked_token = revoked.out.split()[-1]
    revoked_id = next(k["id"] for k in sbx("api-keys", "ls", "--json").json()
                      if k["owner"] == "gone")
    assert sbx("api-keys", "revoke", revoked_id).code == 0
    before = {t: table_rows(sbx.home, t) for t in ("sandboxes", "events")}

    wrong = "sbxk_" + token[5:-4] + "xxxx"
    for key in (wrong, revoked_token, ""):
        for argv in (["ls"], ["create", "--ttl", "10m"]):
            result = run({**env, "SBX_TOKEN": key}, *argv)
            assert result.returncode == 5, (key[:12], argv, result.stderr)
            [line] = result.stderr.splitlines()
            assert line.startswith(f"sbx: the sbx service at {url} refused the API key "
                                   "(SBX_TOKEN): ")
            assert token not in line
            as_json = run({**env, "SBX_TOKEN": key}, *argv, "--json")
            error = json.loads(as_json.stdout)["error"]
            assert (as_json.returncode, error["code"], error["kind"]) == (5, 5, "unauthorized")

    answer = httpx.get(f"{url}/v1/sandboxes", headers={"Authorization": f"Bearer {wrong}"})
    assert answer.status_code == 401
    assert answer.json()["error"] == {
        "code": 5, "kind": "unauthorized",
        "message": "the API key is not one of this service's, or it was revoked"}
    assert {t: table_rows(sbx.home, t) for t in ("sandboxes", "events")} == before
    assert run(env, "ls").returncode == 0  # the right key still works
