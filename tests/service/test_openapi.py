"""The OpenAPI document: the committed docs/openapi.json is what the service serves, and
schemathesis, generating requests from it, finds no server error (5xx) against a live
service on 127.0.0.1 (real uvicorn, real HTTP), on the stub and on the real engine.

Regenerate the document: .venv/bin/python -m sandboxer_tui.service.openapi > docs/openapi.json
"""

from __future__ import annotations

import json

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from support import ROOT

from tests.api.conftest import RUN
from tests.service.live import LiveService

# the documented example profile is Docker's: its creates need the engine, the stub's too
pytestmark = pytest.mark.docker

DOCUMENT = ROOT / "docs" / "openapi.json"
schemathesis.serializer.alias("application/gzip", "application/octet-stream")  # an archive
schemathesis.serializer.alias("application/x-tar", "application/octet-stream")  # a tree
schema = schemathesis.openapi.from_path(str(DOCUMENT))
FUZZ = settings(max_examples=6, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


def test_the_committed_document_is_what_the_service_serves(sbx_home, stub_named):
    live = LiveService(sbx_home).start()
    try:
        served = httpx.get(f"{live.url}/openapi.json").json()
    finally:
        live.stop()
    committed = json.loads(DOCUMENT.read_text())
    assert served["openapi"].startswith("3.1")
    assert served == committed, ("docs/openapi.json is stale: .venv/bin/python -m "
                                 "sandboxer_tui.service.openapi > docs/openapi.json")


@pytest.fixture(params=["stub", pytest.param("docker", marks=pytest.mark.docker)])
def fuzzed(request, sbx_home, stub_named):
    """A live service with an admin key and one sandbox (on the stub or on the engine) that
    about half the generated requests act on, so they reach real operations, not only 404."""
    from support import remove_test_containers

    if request.param == "docker":
        request.getfixturevalue("docker_api")
    live = LiveService(sbx_home).start()
    token = live.key("admin", owner="fuzzer")
    profile = stub_named if request.param == "stub" else "default"
    box = httpx.post(f"{live.url}/v1/sandboxes", json={"profile": profile, "labels": RUN},
                     headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert box.status_code == 201, box.text
    yield live, {"Authorization": f"Bearer {token}"}, box.json()["id"]
    live.stop()
    remove_test_containers(sbx_home)


@schema.parametrize()
@FUZZ
def test_no_request_the_document_allows_is_a_server_error(case, fuzzed):
    live, headers, sandbox_id = fuzzed
    if "ref" in (case.path_parameters or {}) and case.path.startswith("/v1/sandboxes/") \
            and hash(json.dumps(case.body, default=str, sort_keys=True)) % 2 == 0:
        case.path_parameters["ref"] = sandbox_id
    if case.query:
        case.query.pop("follow", None)  # a followed stream never ends by itself
    case.call_and_validate(base_url=live.url, headers=headers, checks=[not_a_server_error],
                           timeout=120)
