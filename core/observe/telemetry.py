"""OpenTelemetry for sbx: a span for every lifecycle operation, the W3C trace context handed
to the sandbox and to each exec, and per-sandbox container metrics, sent over OTLP.

Only the standard variables configure it (docs/telemetry.md): `OTEL_EXPORTER_OTLP_ENDPOINT`
(or a per-signal `..._TRACES_ENDPOINT` / `..._METRICS_ENDPOINT`), `OTEL_TRACES_EXPORTER` /
`OTEL_METRICS_EXPORTER`, `OTEL_EXPORTER_OTLP_PROTOCOL`, `OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES` and the exporters' own. With none of them set, no opentelemetry
package is imported and a traced call costs a look at the environment: `sbx ls`, `sbx reap`
and `sbx --help` stay as fast as before.

The environment is read at each operation, not once: a process forked by `sbx server` takes
its caller's environment after it started.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

# attribute names of the spans and metrics (docs/telemetry.md)
SANDBOX_ID = "sbx.sandbox.id"
BACKEND = "sbx.backend"
PROFILE = "sbx.profile"
RESULT = "sbx.result"
REF = "sbx.ref"
CHECKPOINT_ID = "sbx.checkpoint.id"

PROTOCOLS = ("http/protobuf", "grpc")
EXPORTERS = ("otlp", "console")

_current: ContextVar[_Operation | None] = ContextVar("sbx_operation", default=None)
_lock = threading.Lock()
_tracing: _Tracing | None = None
_metering: _Metering | None = None


# -- configuration ---------------------------------------------------------------------------


def _exporters(signal: str) -> list[str]:
    """The exporters the environment asks for one signal ("traces", "metrics"); [] is off."""
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    chosen = env.get(f"OTEL_{signal.upper()}_EXPORTER")
    if chosen is not None:
        names = [n.strip().lower() for n in chosen.split(",") if n.strip()]
        names = [n for n in names if n != "none"]
        for name in names:
            if name not in EXPORTERS:
                from sandboxer.core.rules.errors import BadInput

                raise BadInput(f"OTEL_{signal.upper()}_EXPORTER={chosen!r}: sbx sends "
                               f"{signal} to {' or '.join(EXPORTERS)} (or none)")
        return names
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(
            f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"):
        return ["otlp"]
    return []


def tracing_on() -> bool:
    """Whether spans are made now (cheap: the environment, no import)."""
    return _sdk_present("traces")


def metrics_on() -> bool:
    return _sdk_present("metrics")


def _sdk_present(signal: str) -> bool:
    """The environment asks for `signal` and the packages that send it are installed. OTEL_
    variables are often set for a whole machine or pod: without the `otel` extra, sbx says
    so once on stderr and goes on without spans or metrics. A bad setting is still refused
    (BadInput) before anything is done."""
    names = _exporters(signal)
    if not names:
        return False
    key = (signal, _settings_key())
    found = _present.get(key)
    if found is None:
        found = _present[key] = _missing_package(signal, names) is None
    return found


_present: dict[tuple, bool] = {}
_warned = False


def _missing_package(signal: str, names: list[str]) -> str | None:
    """The first package `signal`'s exporters need that is not installed (said once on
    stderr), else None. Looked up, not imported."""
    global _warned
    import importlib.util

    modules = ["opentelemetry.sdk"] + [
        f"opentelemetry.exporter.otlp.proto.{'grpc' if _protocol(signal) == 'grpc' else 'http'}"
        for name in names if name == "otlp"]
    for module in modules:
        try:
            spec = importlib.util.find_spec(module)
        except ImportError:  # a parent package missing
            spec = None
        if spec is None:
            package = module.replace(".", "-")
            with _lock:
                warn, _warned = not _warned, True
            if warn:
                print(f"sbx: OTEL_ variables ask for {signal} but {package} is not installed: "
                      "going on without OpenTelemetry (pip install 'sandboxer[otel]', or "
                      "unset the OTEL_ variables)", file=sys.stderr, flush=True)
            return package
    return None


def _protocol(signal: str) -> str:
    env = os.environ
    variable = f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL"
    if variable not in env:
        variable = "OTEL_EXPORTER_OTLP_PROTOCOL"
    protocol = env.get(variable, "http/protobuf").strip().lower() or "http/protobuf"
    if protocol not in PROTOCOLS:
        from sandboxer.core.rules.errors import BadInput

        raise BadInput(f"{variable}={env[variable]!r}: sbx speaks "
                       f"{' or '.join(PROTOCOLS)}")
    return protocol


def _settings_key() -> tuple:
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("OTEL_")))


def _sdk_missing(exc: ImportError) -> Exception:
    from sandboxer.core.rules.errors import Unavailable

    return Unavailable(f"OpenTelemetry is configured (OTEL_* variables) but {exc.name} is not "
                       "installed: pip install 'sandboxer[otel]', or unset the OTEL_ variables")


def _resource() -> Any:
    """OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES as the SDK reads them; `sbx` and this
    version where they say nothing."""
    from importlib.metadata import PackageNotFoundError, version

    from opentelemetry.sdk.resources import Resource

    found = Resource.create()
    extra: dict[str, str] = {}
    if str(found.attributes.get("service.name", "")).startswith("unknown_service"):
        extra["service.name"] = "sbx"
    if "service.version" not in found.attributes:
        with contextlib.suppress(PackageNotFoundError):
            extra["service.version"] = version("sandboxer")
    return found.merge(Resource(extra)) if extra else found


def _exporter(signal: str, name: str) -> Any:
    """One exporter; the OTLP ones read their endpoint, headers, timeout and certificates
    from the environment themselves."""
    kind = "trace" if signal == "traces" else "metric"
    if name == "console":
        if kind == "trace":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            return ConsoleSpanExporter(out=sys.stderr)  # stdout is the command's output
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        return ConsoleMetricExporter(out=sys.stderr)
    if _protocol(signal) == "grpc":
        if kind == "trace":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            return OTLPSpanExporter()
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter()
    if kind == "trace":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter()


# -- traces ----------------------------------------------------------------------------------


class _Tracing:
    def __init__(self, key: tuple) -> None:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.key = key
        names = _exporters("traces")
        exporters = [_exporter("traces", name) for name in names]  # refused before anything
        self.provider = TracerProvider(resource=_resource(), shutdown_on_exit=False)
        for exporter in exporters:
            self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("sandboxer")


def _tracer() -> Any:
    global _tracing
    key = _settings_key()
    with _lock:
        if _tracing is None or _tracing.key != key:
            old, _tracing = _tracing, None
            if old is not None:
                old.provider.shutdown()
            try:
                _tracing = _Tracing(key)
            except ImportError as exc:
                raise _sdk_missing(exc) from None
        return _tracing.tracer


class _Operation:
    """One lifecycle operation's span while it runs."""

    __slots__ = ("span",)

    def __init__(self, span: Any) -> None:
        self.span = span

    def set(self, attrs: Mapping[str, Any], *, replace: bool = True) -> None:
        existing = getattr(self.span, "attributes", None) or {}
        for key, value in attrs.items():
            if value is None or (not replace and key in existing):
                continue
            self.span.set_attribute(key, value if isinstance(value, bool | int | float | str)
                                    else str(value))


def _parent_context() -> Any:
    """The caller's current span, else the trace this process was started in (a TRACEPARENT
    in its environment, as sbx hands to sandboxes), else none: a new trace."""
    from opentelemetry import context, trace

    current = context.get_current()
    if trace.get_current_span(current).get_span_context().is_valid:
        return current
    carrier = {k.lower(): v for k in ("TRACEPARENT", "TRACESTATE")
               if (v := os.environ.get(k))}
    if not carrier:
        return current
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(carrier, context=current)


@contextlib.contextmanager
def _span(name: str, attrs: Mapping[str, Any]) -> Iterator[_Operation]:
    """A span made current for the block; the error leaving it is recorded on it."""
    from opentelemetry import context, trace
    from opentelemetry.trace import Status, StatusCode

    parent = _parent_context()
    span = _tracer().start_span(name, context=parent, kind=trace.SpanKind.INTERNAL)
    operation = _Operation(span)
    operation.set(attrs)
    token = context.attach(trace.set_span_in_context(span, parent))
    mine = _current.set(operation)
    try:
        yield operation
    except BaseException as exc:
        _record_error(operation, exc, Status, StatusCode)
        raise
    else:
        operation.set({RESULT: "ok"}, replace=False)
    finally:
        _current.reset(mine)
        context.detach(token)
        span.end()


def _record_error(operation: _Operation, exc: BaseException, status: Any, code: Any) -> None:
    from sandboxer.core.rules.errors import classify, one_line

    if isinstance(exc, Exception):
        kind = classify(exc)[1]
        message = one_line(exc)
    else:
        kind, message = "cancelled", type(exc).__name__
    operation.set({RESULT: kind})
    operation.span.record_exception(exc)
    operation.span.set_status(status(code.ERROR, message))


def _describe(value: Any) -> dict[str, Any]:
    """Span attributes from what an operation returned: a sandbox or checkpoint record, a
    (record, flag) pair, an exec's result, a reaper's report."""
    if isinstance(value, tuple) and value and isinstance(value[0], Mapping):
        return _describe(value[0])
    if isinstance(value, Mapping):
        ident = value.get("id")
        if isinstance(ident, str) and ident.startswith("ckpt-"):
            return {CHECKPOINT_ID: ident, SANDBOX_ID: value.get("sandbox_id"),
                    BACKEND: value.get("backend"), PROFILE: value.get("profile")}
        if isinstance(ident, str) and ident.startswith("sbx-"):
            return {SANDBOX_ID: ident, BACKEND: value.get("backend"),
                    PROFILE: value.get("profile"), "sbx.sandbox.state": value.get("state"),
                    "sbx.sandbox.restored_from": value.get("restored_from")}
        return {}
    if hasattr(value, "exit_code") and hasattr(value, "timed_out"):
        return {"sbx.exec.exit_code": value.exit_code, "sbx.exec.timed_out": value.timed_out}
    if hasattr(value, "destroyed") and hasattr(value, "reconciled"):
        return {"sbx.reap.destroyed": len(value.destroyed), "sbx.reap.failed": len(value.failed),
                "sbx.reap.reconciled": len(value.reconciled)}
    if isinstance(value, list):
        return {"sbx.count": len(value)}
    return {}


def _call_attrs(attrs: Callable[..., Mapping[str, Any]] | None, args: tuple,
                kwargs: dict) -> dict[str, Any]:
    if attrs is not None:
        return dict(attrs(*args, **kwargs))
    ref = args[1] if len(args) > 1 else None  # (self, ref, ...): the sandbox as given
    return {REF: ref} if isinstance(ref, str) else {}


def traced(name: str, attrs: Callable[..., Mapping[str, Any]] | None = None) -> Callable:
    """A method as one span `name` (a coroutine, an async generator or a plain function),
    with `attrs(self, *args, **kwargs)` (default: the ref it was given), what it returned
    and its error. Untouched when tracing is off."""
    def wrap(fn: Callable) -> Callable:
        if inspect.isasyncgenfunction(fn):
            @functools.wraps(fn)
            def gen_wrapper(*args: Any, **kwargs: Any) -> Any:
                if not tracing_on():
                    return fn(*args, **kwargs)
                return _traced_gen(name, _call_attrs(attrs, args, kwargs), fn(*args, **kwargs))
            return gen_wrapper
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def coro_wrapper(*args: Any, **kwargs: Any) -> Any:
                if not tracing_on():
                    return await fn(*args, **kwargs)
                with _span(name, _call_attrs(attrs, args, kwargs)) as operation:
                    result = await fn(*args, **kwargs)
                    operation.set(_describe(result), replace=False)
                    return result
            return coro_wrapper

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not tracing_on():
                return fn(*args, **kwargs)
            with _span(name, _call_attrs(attrs, args, kwargs)) as operation:
                result = fn(*args, **kwargs)
                operation.set(_describe(result), replace=False)
                return result
        return wrapper
    return wrap


async def _traced_gen(name: str, attrs: Mapping[str, Any], agen: Any) -> Any:
    """An async generator as one span from its first item to its end. The span is current
    only while the generator runs (between two items its consumer may be anywhere)."""
    from opentelemetry import context, trace
    from opentelemetry.trace import Status, StatusCode

    parent = _parent_context()
    span = _tracer().start_span(name, context=parent, kind=trace.SpanKind.INTERNAL)
    operation = _Operation(span)
    operation.set(attrs)
    try:
        while True:
            token = context.attach(trace.set_span_in_context(span, parent))
            mine = _current.set(operation)
            try:
                item = await agen.__anext__()
            except StopAsyncIteration:
                break
            finally:
                _current.reset(mine)
                context.detach(token)
            if isinstance(item, tuple) and len(item) == 2 and item[0] == "exit":
                operation.set({"sbx.exec.exit_code": item[1].get("exit_code"),
                               "sbx.exec.timed_out": item[1].get("timed_out")})
            yield item
        operation.set({RESULT: "ok"}, replace=False)
    except GeneratorExit:
        operation.set({RESULT: "ok"}, replace=False)  # the consumer had what it wanted
        raise
    except BaseException as exc:
        _record_error(operation, exc, Status, StatusCode)
        raise
    finally:
        with contextlib.suppress(Exception):
            await agen.aclose()
        span.end()


def note(attrs: Mapping[str, Any]) -> None:
    """Add attributes to the operation running now (nothing when none is traced)."""
    operation = _current.get()
    if operation is not None:
        operation.set(attrs)


def note_sandbox(row: Mapping[str, Any]) -> None:
    """The sandbox an operation acts on: its id, backend and profile (the first one noted
    in a span stays: a create's setup commands resolve the same sandbox again)."""
    operation = _current.get()
    if operation is not None:
        operation.set({SANDBOX_ID: row.get("id"), BACKEND: row.get("backend"),
                       PROFILE: row.get("profile")}, replace=False)


def trace_env() -> dict[str, str]:
    """`TRACEPARENT` (and `TRACESTATE`) of the operation running now, for the environment of
    the sandbox or exec it starts, so the workload's spans join the trace; {} untraced."""
    operation = _current.get()
    if operation is None:
        return {}
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier,
                                           context=trace.set_span_in_context(operation.span))
    return {key.upper(): value for key, value in carrier.items()}


# -- metrics ---------------------------------------------------------------------------------


class _Metering:
    """The container metrics of the sandboxes read last, observed by the SDK's reader."""

    def __init__(self, key: tuple) -> None:
        from opentelemetry.metrics import Observation
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        from sandboxer.core.observe.families import FAMILIES

        self.key = key
        readers = [PeriodicExportingMetricReader(_exporter("metrics", name))
                   for name in _exporters("metrics")]
        self.provider = MeterProvider(resource=_resource(), metric_readers=readers,
                                      shutdown_on_exit=False)
        self.readings: dict[str, Mapping[str, Any]] = {}
        self.lock = threading.Lock()
        meter = self.provider.get_meter("sandboxer")
        for family in FAMILIES:
            def observe(options: Any, family: Any = family) -> list[Any]:
                with self.lock:
                    readings = list(self.readings.values())
                return [Observation(value, attributes)
                        for reading in readings
                        for attributes, value in family.points(reading)]
            make = (meter.create_observable_counter if family.kind == "counter"
                    else meter.create_observable_gauge)
            make(family.name, callbacks=[observe], unit=family.unit,
                 description=family.description)


def _meter() -> _Metering:
    global _metering
    key = _settings_key()
    with _lock:
        if _metering is None or _metering.key != key:
            old, _metering = _metering, None
            if old is not None:
                old.provider.shutdown()
            try:
                _metering = _Metering(key)
            except ImportError as exc:
                raise _sdk_missing(exc) from None
        return _metering


def start_metrics() -> None:
    """Before a long sampling run: a bad OTEL_ setting or a missing SDK is said now, once,
    not swallowed with a sandbox's stream."""
    if metrics_on():
        _meter()


def record_readings(readings: list[Mapping[str, Any]]) -> None:
    """The latest reading of each sandbox (sandboxer.core.follow.containermetrics.reading), for the next
    export; nothing when metrics are off."""
    if not readings or not metrics_on():
        return
    metering = _meter()
    with metering.lock:
        for reading in readings:
            metering.readings[reading["sandbox_id"]] = reading


def forget(sandbox_id: str) -> None:
    """A sandbox no longer followed: its series stop."""
    if _metering is not None:
        with _metering.lock:
            _metering.readings.pop(sandbox_id, None)


# -- the end of a command or a client --------------------------------------------------------


def flush(timeout_ms: int = 10_000) -> None:
    """Send what is pending (a library client's close)."""
    for part in (_tracing, _metering):
        if part is not None:
            with contextlib.suppress(Exception):
                part.provider.force_flush(timeout_ms)


def shutdown() -> None:
    """Send what is pending and stop the exporters (the end of a CLI command)."""
    global _tracing, _metering
    with _lock:
        parts, _tracing, _metering = (_tracing, _metering), None, None
    for part in parts:
        if part is not None:
            with contextlib.suppress(Exception):
                part.provider.shutdown()
