"""OpenTelemetry (docs/telemetry.md), against a local OTLP receiver on 127.0.0.1 that decodes
the protobuf with opentelemetry-proto's classes: every lifecycle operation is a span with the
sandbox, backend, profile and result, errors recorded; the sandbox and each exec get the
span's TRACEPARENT; container metrics go out under the semantic-convention names; nothing
but the OTEL_ variables configures it, and bad ones are refused before anything is done."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

import pytest
from support import (
    RUN_LABEL,
    SBX,
    containers_of,
    install_id_of,
    table_rows,
    write_profile,
)

from tests.otlp_receiver import GRPCReceiver, HTTPReceiver

pytestmark = pytest.mark.docker

LIFECYCLE = ("sbx.create", "sbx.exec", "sbx.extend", "sbx.pause", "sbx.resume", "sbx.snapshot",
             "sbx.restore", "sbx.destroy", "sbx.reap", "sbx.touch")


@pytest.fixture
def receiver():
    server = HTTPReceiver()
    yield server
    server.close()


@pytest.fixture
def grpc_receiver():
    server = GRPCReceiver()
    yield server
    server.close()


def otel_env(url: str, **extra: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_SERVICE_NAME": "sbx-under-test", "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test,team=infra",
            "SBX_NO_SERVER": "1", **extra}


def trace_and_span(traceparent: str) -> tuple[str, str]:
    version, trace_id, span_id, flags = traceparent.strip().split("-")
    assert version == "00" and len(trace_id) == 32 and len(span_id) == 16, traceparent
    return trace_id, span_id


def test_every_lifecycle_operation_is_a_span_with_its_sandbox(sbx, receiver, docker_api):
    env = otel_env(receiver.url)
    box = sbx.create("--task", "traced", env=env)
    steps = [("exec", box["id"], "--", "true"), ("extend", box["id"], "10m"),
             ("touch", box["id"]), ("pause", box["id"]), ("resume", box["id"])]
    for args in steps:
        done = sbx(*args, env=env)
        assert done.code == 0, done.err
    snap = sbx("snapshot", box["id"], "--json", env=env)
    assert snap.code == 0, snap.err
    restored = sbx("restore", snap.json()["id"], "--label", RUN_LABEL, "--json", env=env)
    assert restored.code == 0, restored.err
    for sandbox_id in (box["id"], restored.json()["id"]):
        assert sbx("destroy", sandbox_id, env=env).code == 0
    assert sbx("reap", env=env).code == 0

    received = receiver.received
    received.wait_for(lambda r: {s.name for s in r.spans} >= set(LIFECYCLE))
    for name in LIFECYCLE:
        for span in received.spans_named(name):
            assert span.attributes["sbx.result"] == "ok", (name, span.attributes)
            assert not span.failed
            assert span.resource["service.name"] == "sbx-under-test"
            assert span.resource["deployment.environment"] == "test"
            assert span.resource["team"] == "infra"
            if name != "sbx.reap":
                assert span.attributes["sbx.sandbox.id"] in (box["id"], restored.json()["id"])
                assert span.attributes["sbx.backend"] == "docker"
                assert span.attributes["sbx.profile"] == "default"
    (create,) = [s for s in received.spans_named("sbx.create")
                 if s.attributes["sbx.sandbox.id"] == box["id"]]
    (restore,) = received.spans_named("sbx.restore")
    # a restore makes its sandbox inside the restore's own trace
    restore_create = [s for s in received.spans_named("sbx.create")
                      if s.attributes["sbx.sandbox.id"] == restored.json()["id"]]
    assert [s.parent_span_id for s in restore_create] == [restore.span_id]
    assert create.attributes["sbx.sandbox.state"] == "running"
    assert received.spans_named("sbx.exec")[0].attributes["sbx.exec.exit_code"] == 0
    assert received.spans_named("sbx.reap")[0].attributes["sbx.reap.mode"] == "reap"


def test_an_error_is_recorded_on_its_span(sbx, receiver):
    env = otel_env(receiver.url)
    box = sbx.create(env=env)
    assert sbx("pause", box["id"], env=env).code == 0
    again = sbx("pause", box["id"], env=env)
    assert again.code == 4
    received = receiver.received
    received.wait_for(lambda r: any(s.failed for s in r.spans_named("sbx.pause")))
    (failed,) = [s for s in received.spans_named("sbx.pause") if s.failed]
    assert failed.attributes["sbx.result"] == "conflict"
    assert failed.attributes["sbx.sandbox.id"] == box["id"]
    assert "cannot pause" in failed.status_message
    assert "exception" in failed.events
    assert sbx("destroy", box["id"], env=env).code == 0


def test_the_sandbox_and_each_exec_get_the_spans_traceparent(sbx, receiver, docker_api):
    """The workload's spans can join the trace: TRACEPARENT in the sandbox's environment is
    the create span's, in an exec's the exec span's (`sh -c 'echo $TRACEPARENT'`; the CLI
    streams, the library test below runs the plain exec)."""
    env = otel_env(receiver.url)
    box = sbx.create(env=env)
    container_env = dict(item.split("=", 1)
                         for item in docker_api.inspect_container(box["backend_ref"])
                         ["Config"]["Env"])
    echoed = sbx("exec", box["id"], "--", "sh", "-c", "echo $TRACEPARENT", env=env)
    assert echoed.code == 0, echoed.err
    streamed = sbx("exec", box["id"], "--", "sh", "-c", 'echo "$TRACEPARENT"', env=env)
    received = receiver.received
    received.wait_for(lambda r: len(r.spans_named("sbx.exec")) == 2)
    (create,) = received.spans_named("sbx.create")
    assert trace_and_span(container_env["TRACEPARENT"]) == (create.trace_id, create.span_id)
    execs = {(s.trace_id, s.span_id) for s in received.spans_named("sbx.exec")}
    assert trace_and_span(echoed.out) in execs
    assert trace_and_span(streamed.out) in execs
    assert trace_and_span(echoed.out) != trace_and_span(streamed.out)  # a span each
    assert sbx("destroy", box["id"], env=env).code == 0


def test_spans_over_otlp_grpc(sbx, grpc_receiver):
    env = otel_env(grpc_receiver.url, OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                   OTEL_EXPORTER_OTLP_INSECURE="true")
    box = sbx.create(env=env)
    assert sbx("destroy", box["id"], env=env).code == 0
    received = grpc_receiver.received
    received.wait_for(lambda r: {"sbx.create", "sbx.destroy"} <= {s.name for s in r.spans})
    assert received.spans_named("sbx.destroy")[0].attributes["sbx.sandbox.id"] == box["id"]


def test_a_traceparent_in_the_callers_environment_is_the_parent(sbx, receiver):
    """`sbx` run by a traced workload (a CI job, an agent inside a sandbox) joins its trace."""
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    env = otel_env(receiver.url, TRACEPARENT=parent)
    box = sbx.create(env=env)
    received = receiver.received
    received.wait_for(lambda r: r.spans_named("sbx.create"))
    (create,) = received.spans_named("sbx.create")
    assert (create.trace_id, create.parent_span_id) == trace_and_span(parent)
    assert sbx("destroy", box["id"], env=env).code == 0


def test_the_library_joins_the_callers_span_and_sends_on_close(sbx_home, receiver, monkeypatch):
    from opentelemetry.sdk.trace import TracerProvider

    import sandboxer

    for key, value in otel_env(receiver.url).items():
        monkeypatch.setenv(key, value)
    caller = TracerProvider().get_tracer("the-callers-program")
    with caller.start_as_current_span("agent step") as step:
        client = sandboxer.Sandboxer()
        box = client.create(labels=dict([RUN_LABEL.split("=")]))
        echoed = box.exec(["sh", "-c", "echo $TRACEPARENT"])
        box.destroy()
        client.close()
    received = receiver.received
    received.wait_for(lambda r: {"sbx.create", "sbx.exec", "sbx.destroy"}
                      <= {s.name for s in r.spans}, within=5)  # sent by close, not later
    trace_id = format(step.get_span_context().trace_id, "032x")
    span_id = format(step.get_span_context().span_id, "016x")
    for name in ("sbx.create", "sbx.exec", "sbx.destroy"):
        (span,) = received.spans_named(name)
        assert (span.trace_id, span.parent_span_id) == (trace_id, span_id), name
    (exec_span,) = received.spans_named("sbx.exec")
    assert trace_and_span(echoed.stdout.decode()) == (trace_id, exec_span.span_id)


def test_container_metrics_over_otlp_and_as_prometheus_text(sbx, receiver):
    from prometheus_client.parser import text_string_to_metric_families

    env = otel_env(receiver.url, OTEL_METRICS_EXPORTER="otlp")
    # a network of the installation's own, so the backend has network figures to report
    networked = write_profile(sbx.cwd, "networked", "extends: default\nnetwork: {mode: full}\n")
    box = sbx.create("--profile-file", str(networked), env=env)
    shot = sbx("metrics", "--all", "--format", "prometheus", env=env)
    assert shot.code == 0, shot.err
    families = {f.name: f for f in text_string_to_metric_families(shot.out)}
    assert {"container_cpu_usage", "container_memory_usage_bytes", "container_network_io_bytes",
            "container_uptime_seconds", "sbx_sandbox_memory_limit_bytes",
            "sbx_sandbox_pids"} <= families.keys()
    assert families["container_network_io_bytes"].type == "counter"
    network = {s.labels["network_io_direction"] for s in families["container_network_io_bytes"]
               .samples if s.labels["sbx_sandbox_id"] == box["id"]}
    assert network == {"receive", "transmit"}
    memory = [s for s in families["container_memory_usage_bytes"].samples
              if s.labels["sbx_sandbox_id"] == box["id"]]
    assert memory and memory[0].value > 0
    assert (memory[0].labels["sbx_backend"], memory[0].labels["sbx_profile"]) == (
        "docker", "networked")
    assert memory[0].labels["container_id"] == box["backend_ref"]
    limit = [s for s in families["sbx_sandbox_memory_limit_bytes"].samples
             if s.labels["sbx_sandbox_id"] == box["id"]]
    assert limit[0].value == 512 * 1024**2  # the default profile's limit

    received = receiver.received
    received.wait_for(lambda r: {"container.cpu.usage", "container.memory.usage",
                                 "container.network.io"} <= {p.metric for p in r.points})
    points = [p for p in received.points if p.attributes.get("sbx.sandbox.id") == box["id"]]
    by_name = {p.metric: p for p in points}
    assert by_name["container.memory.usage"].unit == "By"
    assert by_name["container.cpu.usage"].unit == "{cpu}"
    io = [p for p in points if p.metric == "container.network.io"]
    assert {p.attributes["network.io.direction"] for p in io} == {"receive", "transmit"}
    assert all(p.kind == "sum" and p.monotonic for p in io)
    assert by_name["container.memory.usage"].resource["service.name"] == "sbx-under-test"
    assert sbx("destroy", box["id"], env=env).code == 0


def test_metrics_all_sends_otlp_while_it_follows(sbx, receiver):
    env = otel_env(receiver.url, OTEL_METRICS_EXPORTER="otlp", OTEL_TRACES_EXPORTER="none",
                   OTEL_METRIC_EXPORT_INTERVAL="500")
    box = sbx.create(env=env)
    follower = subprocess.Popen([*SBX, "metrics", "--all", "--follow", "--json"], cwd=sbx.cwd,
                                env=sbx.env(env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        receiver.received.wait_for(lambda r: any(
            p.metric == "container.memory.usage" and p.attributes["sbx.sandbox.id"] == box["id"]
            for p in r.points), within=60)
    finally:
        follower.send_signal(signal.SIGTERM)
        out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    assert json.loads(out.splitlines()[0])["sandbox_id"] == box["id"]
    assert receiver.received.spans == []  # OTEL_TRACES_EXPORTER=none: metrics only
    assert sbx("destroy", box["id"], env=env).code == 0


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "OTEL_EXPORTER_OTLP_PROTOCOL='http/json': "
                                                 "sbx speaks http/protobuf or grpc"),
    ("OTEL_TRACES_EXPORTER", "zipkin", "OTEL_TRACES_EXPORTER='zipkin': sbx sends traces to "
                                       "otlp or console (or none)"),
])
def test_bad_otel_settings_are_refused_before_anything_is_done(sbx, receiver, docker_api,
                                                               variable, value, said):
    env = otel_env(receiver.url, **{variable: value})
    before = table_rows(sbx.home, "sandboxes")
    made = sbx("create", "--label", RUN_LABEL, env=env)
    assert (made.code, made.out) == (2, "")
    assert made.err.strip() == f"sbx: {said}"
    assert table_rows(sbx.home, "sandboxes") == before
    install = install_id_of(sbx.home)
    assert install is None or containers_of(docker_api, install) == []
    assert receiver.received.spans == []


def test_a_collector_that_does_not_answer_does_not_fail_the_command(sbx):
    closed = HTTPReceiver()
    closed.close()  # its port now refuses
    env = otel_env(closed.url, OTEL_EXPORTER_OTLP_TIMEOUT="2")
    box = sbx.create(env=env)
    gone = sbx("destroy", box["id"], env=env)
    assert gone.code == 0
    assert gone.out.strip() == f"destroyed {box['id']}"
    assert len(gone.err.strip().splitlines()) <= 1  # at most the exporter's one line


def test_unset_nothing_is_traced_and_commands_work(sbx, receiver):
    """The receiver runs, but no OTEL_ variable names it: nothing is sent."""
    box = sbx.create(env={"SBX_NO_SERVER": "1"})
    assert sbx("destroy", box["id"], env={"SBX_NO_SERVER": "1"}).code == 0
    time.sleep(1)
    assert receiver.received.requests == []
    assert not any(k.startswith("OTEL_") for k in os.environ)


def test_commands_through_sbx_server_are_traced_and_the_server_itself_is_not(sbx, receiver):
    """`sbx server` started with the OTEL_ variables set: its preloading makes no span and
    starts no exporter thread (the server refuses to fork with a thread running); each command
    handed to it is traced with its caller's variables."""
    from tests.cli.test_resident_server import Launcher

    launcher = Launcher(sbx.home, sbx.cwd)
    env = {k: v for k, v in otel_env(receiver.url).items() if k != "SBX_NO_SERVER"}
    started = launcher("server", "start", "--json", env=env)
    assert started.code == 0, started.err
    pid = started.json()["pid"]
    try:
        box = launcher("create", "--label", RUN_LABEL, "--json", env=env)
        assert box.code == 0, box.err
        sandbox_id = json.loads(box.out)["id"]
        assert launcher("destroy", sandbox_id, env=env).code == 0
        assert launcher.status()["served"] >= 2  # the server ran them
    finally:
        launcher("server", "stop")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    received = receiver.received
    received.wait_for(lambda r: {"sbx.create", "sbx.destroy"} <= {s.name for s in r.spans})
    assert {s.attributes.get("sbx.sandbox.id") for s in received.spans} == {sandbox_id}
    assert not any(s.attributes.get("sbx.backend") == "stub" for s in received.spans)
