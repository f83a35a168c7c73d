"""A bad profile document is said in one clear line naming the field and what is wrong, in
words a person reads without knowing sbx's models (issue 29, point 5): no "Input should be a
valid dictionary or instance of TTLPolicy", no "Extra inputs are not permitted". The same
words from `sbx profiles validate`, `sbx create` and `POST /v1/profiles/validate`."""

from __future__ import annotations

import pytest
from support import SbxRunner, table_rows

JARGON = ("Input should", "Extra inputs", "instance of", "dictionary", "pydantic",
          "validation error", "errors.pydantic.dev", "Field required", "Value error",
          "Traceback")

CASES = {
    "wrong-type": ("backend: docker\nttl: 5\n", "ttl: should be a mapping, not 5"),
    "wrong-type-deep": ("backend: docker\nresources: {memory: [1]}\n",
                        "resources.memory: should be a size such as 512m or 2g, not [1]"),
    "unknown-key": ("backend: docker\nimagee: busybox\n",
                    "imagee: unknown field (did you mean 'image'?)"),
    "missing": ("description: nothing else\n", "backend: required, not given"),
    "yaml-syntax": ("backend: docker\nimage: [unclosed\n",
                    "line 3: invalid YAML: did not find expected ',' or ']'"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sbx_profiles_validate_says_the_field_and_what_is_wrong(sbx: SbxRunner, case):
    text, said = CASES[case]
    (sbx.cwd / "bad.yaml").write_text(text)
    result = sbx("profiles", "validate", "bad.yaml")
    assert (result.code, result.out) == (2, "")
    assert result.err.splitlines() == [f"bad.yaml: {said}"]
    made = sbx("create", "--profile-file", "bad.yaml")
    assert made.code == 2 and made.err.splitlines() == [f"sbx: bad.yaml: {said}"]
    assert not [j for j in JARGON if j in result.err + made.err]
    assert table_rows(sbx.home, "sandboxes") == []


def test_several_problems_of_one_file_are_one_line_for_create(sbx: SbxRunner):
    (sbx.cwd / "bad.yaml").write_text("backend: docker\nttl: 5\nnetwork: 7\ncolour: blue\n")
    made = sbx("create", "--profile-file", "bad.yaml")
    assert made.code == 2
    assert made.err.splitlines() == ["sbx: bad.yaml: network: should be a mapping, not 7; "
                                     "ttl: should be a mapping, not 5; colour: unknown field"]


@pytest.mark.parametrize(("body", "status", "said"), [
    ({"backend": "docker", "ttl": 5}, 400, "the profile document: ttl: should be a mapping, "
                                           "not 5"),
    ({"backend": "docker", "imagee": "x"}, 400,
     "the profile document: imagee: unknown field (did you mean 'image'?)"),
    ({"backend": "docker", "resources": {"memory": [1]}}, 400,
     "the profile document: resources.memory: should be a size such as 512m or 2g, not [1]"),
    ([1, 2], 422, "body: should be a mapping, not [1, 2]"),
    (b'{"backend": "docker", ', 422,
     "body: not JSON (Expecting property name enclosed in double quotes)"),
    (b"backend: docker\nimage: [unclosed\n", 422,
     "body: should be a mapping, not text that is not JSON"),
])
def test_post_profiles_validate_says_the_field_and_what_is_wrong(api, body, status, said):
    if isinstance(body, bytes):
        answer = api.post("/v1/profiles/validate", content=body,
                          headers={"Content-Type": "application/json" if body.startswith(b"{")
                                   else "application/yaml"})
    else:
        answer = api.post("/v1/profiles/validate", json=body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["kind"], error["message"]) == (2, "bad_input", said)
    assert not [j for j in JARGON if j in answer.text]
