"""A local OTLP receiver on 127.0.0.1 for the telemetry tests: OTLP/HTTP (protobuf bodies at
/v1/traces and /v1/metrics) or OTLP/gRPC, decoded with opentelemetry-proto's own classes, as
a collector would. It keeps what it received, flattened for assertions."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Status


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def _attributes(items) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in items}


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status_code: int
    status_message: str
    events: list[str]

    @property
    def failed(self) -> bool:
        return self.status_code == Status.STATUS_CODE_ERROR


@dataclass
class Point:
    metric: str
    unit: str
    kind: str  # gauge | sum
    monotonic: bool
    value: float
    attributes: dict[str, Any]
    resource: dict[str, Any]


@dataclass
class Received:
    spans: list[Span] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # the paths (or gRPC services) called
    lock: threading.RLock = field(default_factory=threading.RLock)

    def add_traces(self, request: ExportTraceServiceRequest) -> None:
        with self.lock:
            self.requests.append("traces")
            for resource_spans in request.resource_spans:
                resource = _attributes(resource_spans.resource.attributes)
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        self.spans.append(Span(
                            span.name, span.trace_id.hex(), span.span_id.hex(),
                            span.parent_span_id.hex(), _attributes(span.attributes), resource,
                            span.status.code, span.status.message,
                            [event.name for event in span.events]))

    def add_metrics(self, request: ExportMetricsServiceRequest) -> None:
        with self.lock:
            self.requests.append("metrics")
            for resource_metrics in request.resource_metrics:
                resource = _attributes(resource_metrics.resource.attributes)
                for scope in resource_metrics.scope_metrics:
                    for metric in scope.metrics:
                        kind = metric.WhichOneof("data")
                        data = getattr(metric, kind)
                        for point in data.data_points:
                            value = point.as_double if point.HasField("as_double") \
                                else point.as_int
                            self.points.append(Point(
                                metric.name, metric.unit, kind,
                                bool(getattr(data, "is_monotonic", False)), value,
                                _attributes(point.attributes), resource))

    def spans_named(self, name: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.name == name]

    def wait_for(self, what: Callable[[Received], bool], within: float = 30) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            with self.lock:
                if what(self):
                    return
            time.sleep(0.05)
        raise AssertionError(f"the receiver did not get it within {within}s: "
                             f"{[s.name for s in self.spans]}, "
                             f"{sorted({p.metric for p in self.points})}")


class HTTPReceiver:
    """OTLP/HTTP with protobuf bodies; its endpoint is `url` (the exporters add /v1/...)."""

    def __init__(self) -> None:
        self.received = Received()
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/traces":
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    received.add_traces(request)
                    answer = ExportTraceServiceResponse().SerializeToString()
                elif self.path == "/v1/metrics":
                    request = ExportMetricsServiceRequest()
                    request.ParseFromString(body)
                    received.add_metrics(request)
                    answer = ExportMetricsServiceResponse().SerializeToString()
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class GRPCReceiver:
    """OTLP/gRPC, plaintext on 127.0.0.1; its endpoint is `url`."""

    def __init__(self) -> None:
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        self.received = Received()
        received = self.received

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):  # noqa: N802 (the service's name)
                received.add_traces(request)
                return ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request, context):  # noqa: N802
                received.add_metrics(request)
                return ExportMetricsServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.url = f"http://127.0.0.1:{port}"

    def close(self) -> None:
        self.server.stop(None)
