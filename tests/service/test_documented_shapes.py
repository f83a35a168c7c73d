"""The document describes what the service sends. Its record schemas are derived from the
one shape of each record (docs/openapi.json; sandboxer_tui/service/schemas.py): a sandbox,
its events, a command's result, a backend's status and a profile, as a live service on the
stub answers them, carry exactly the fields their schema names, each of its JSON type."""

from __future__ import annotations

import jsonschema


def test_each_record_the_service_sends_has_the_fields_and_types_its_schema_names(live, api,
                                                                                 stub_named):
    doc = api.get("/openapi.json").json()

    def check(body: dict, model: str, *, beside: set[str] = frozenset()) -> None:
        """`body` is valid against `model` and names no field it does not (but `beside`)."""
        schema = {"$ref": f"#/components/schemas/{model}", "components": doc["components"]}
        jsonschema.Draft202012Validator(schema).validate(body)
        assert set(body) - beside <= set(doc["components"]["schemas"][model]["properties"])

    made = api.post("/v1/sandboxes", json={"profile": stub_named, "labels": {"k": "v"}})
    assert made.status_code == 201, made.text
    box = made.json()
    check(box, "SandboxRecord")
    check(api.get(f"/v1/sandboxes/{box['id']}", params={"with_profile": True}).json(),
          "SandboxRecord")
    check(api.post(f"/v1/sandboxes/{box['id']}/extend", json={"by": "5m"}).json(), "Extended")
    page = api.get("/v1/sandboxes").json()
    check(page, "SandboxPage")
    assert [item["id"] for item in page["items"]] == [box["id"]]
    # a watched sandbox: the stored fields (its document leaves out launch and pool)
    for item in api.get("/v1/inventory").json():
        check(item, "WatchedSandbox", beside={"launch", "pool"})

    ran = api.post(f"/v1/sandboxes/{box['id']}/exec", json={"argv": ["echo", "hi"]}).json()
    check(ran, "ExecResult")
    assert set(ran) == set(doc["components"]["schemas"]["ExecResult"]["required"])

    events = api.get("/v1/events", params={"sandbox": box["id"]}).json()
    assert {e["type"] for e in events} >= {"sandbox.created", "sandbox.exec"}
    for event in events:
        check(event, "Event")
        assert set(event) == set(doc["components"]["schemas"]["Event"]["required"])

    backends = api.get("/v1/backends", params={"name": "stub"}).json()
    assert [b["name"] for b in backends] == ["stub"]
    check(backends[0], "BackendStatus")
    profiles = api.get("/v1/profiles").json()
    assert stub_named in {p["name"] for p in profiles}
    for profile in profiles:
        check(profile, "ProfileInfo")

    gone = api.delete(f"/v1/sandboxes/{box['id']}").json()
    check(gone, "Destroyed")
    assert (gone["state"], gone["already_destroyed"]) == ("destroyed", False)
    again = api.delete(f"/v1/sandboxes/{box['id']}").json()
    assert again["already_destroyed"] is True
