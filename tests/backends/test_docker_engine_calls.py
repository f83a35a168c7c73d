"""What the docker backend asks the engine, on the real engine `make test` starts: dockerd's
time is the reaper's (issue 36), so a question two adapters of one engine ask at once (the
docker and compose backends, in one reaper cycle) is asked once, and calls arriving at once
at a fresh adapter make one client (one `/_ping`), not one each."""

from __future__ import annotations

import asyncio
import time

import docker
import pytest

from sandboxer.adapters.base import LABEL_INSTALL
from sandboxer.adapters.compose import ComposeAdapter
from sandboxer.adapters.docker import DockerAdapter

pytestmark = pytest.mark.docker


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often the engine was asked each question (the real calls, counted)."""
    counts = {"info": 0, "events": 0, "images": 0, "clients": 0}
    for name in ("info", "events", "images"):
        real = getattr(docker.APIClient, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            counts[_name] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(docker.APIClient, name, counted)
    real_init = docker.APIClient.__init__

    def made(self, *args, **kwargs):
        counts["clients"] += 1
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(docker.APIClient, "__init__", made)
    return counts


def test_the_docker_and_compose_backends_ask_one_engine_once(asked: dict[str, int]) -> None:
    async def both() -> list[str | None]:
        docker_backend, compose_backend = DockerAdapter(), ComposeAdapter()
        labels = {LABEL_INSTALL: "inst-engine-calls"}
        since = time.time()  # a window of milliseconds: no event of ours in it
        try:
            return await asyncio.gather(docker_backend.change_marker(labels, since),
                                        compose_backend.change_marker(labels, since),
                                        docker_backend.instance_id(),
                                        compose_backend.instance_id(),
                                        docker_backend.list_artifacts(labels),
                                        compose_backend.list_artifacts(labels))
        finally:
            await docker_backend.close()
            await compose_backend.close()

    (docker_marker, compose_marker, docker_id, compose_id, docker_artifacts,
     compose_artifacts) = asyncio.run(both())
    assert docker_marker == compose_marker == f"engine:{docker_id}"
    assert docker_id and docker_id == compose_id
    assert compose_artifacts == []  # an installation with none (the docker backend's list
    # also holds loose checkpoint images any installation left: other tests' may be there)
    assert all(not a.held for a in docker_artifacts)
    # each adapter asked each question; the engine was asked each once
    assert (asked["events"], asked["info"], asked["images"]) == (1, 1, 1)


def test_calls_arriving_at_once_make_one_client(asked: dict[str, int]) -> None:
    async def ten() -> list[dict]:
        backend = DockerAdapter()
        try:
            return await asyncio.gather(*(backend._call(lambda api: api.version())
                                          for _ in range(10)))
        finally:
            await backend.close()

    answers = asyncio.run(ten())
    assert len(answers) == 10 and all(a.get("ApiVersion") for a in answers)
    assert asked["clients"] == 1


def test_calls_waiting_on_a_client_that_cannot_be_made_fail_with_it(
        asked: dict[str, int], tmp_path) -> None:
    """An engine that takes connections and never answers: the first call's attempt times
    out, and the calls that waited for it meanwhile fail with its words, none trying again in
    turn (the fifth would otherwise wait five timeouts)."""
    import socket

    from sandboxer.adapters.base import BackendUnavailable

    path = tmp_path / "mute.sock"
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(str(path))
    mute.listen(64)  # connections wait in the backlog, never answered

    async def five() -> list:  # fewer than the loop's threads (6 on 2 cores): all wait at once
        backend = DockerAdapter(f"unix://{path}", timeout=2)
        try:
            return await asyncio.gather(*(backend._call(lambda api: api.version())
                                          for _ in range(5)), return_exceptions=True)
        finally:
            await backend.close()

    started = time.monotonic()
    try:
        failures = asyncio.run(five())
    finally:
        mute.close()
    assert all(isinstance(f, BackendUnavailable) for f in failures)
    assert len({str(f) for f in failures}) == 1 and "mute.sock" in str(failures[0])
    assert asked["clients"] == 1
    assert time.monotonic() - started < 8  # one timeout of 2 s, not five one after another
