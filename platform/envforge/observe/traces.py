"""OpenTelemetry spans: one per trajectory, with children per step, sandbox acquire and grade, so
one trajectory can be followed from the scheduler through its container to its grade.

Off by default (spans cost nothing: `span()` is a null context). Switched on by
`configure_tracing(exporter)` (tests give the SDK's InMemorySpanExporter) or from the
environment: ENVFORGE_TRACES=otlp exports over OTLP/HTTP to OTEL_EXPORTER_OTLP_ENDPOINT (the
standard variable; default http://localhost:4318), ENVFORGE_TRACES=console prints them.

envforge keeps its own TracerProvider instead of the global one, so a host application's
tracing set-up is never overridden and tests can reconfigure. The provider flushes its spans
when the process exits (the SDK's shutdown at exit).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter

_provider: TracerProvider | None = None
_tracer: trace.Tracer | None = None
_env_checked = False


def configure_tracing(
    exporter: SpanExporter | None, *, batch: bool = True, service_name: str = "envforge"
) -> TracerProvider | None:
    """Export envforge's spans to `exporter` (None: tracing off). Returns the provider (flush/shutdown)."""
    global _provider, _tracer, _env_checked
    _env_checked = True
    if _provider is not None:
        _provider.shutdown()
    if exporter is None:
        _provider = _tracer = None
        return None
    _provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    _provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    _tracer = _provider.get_tracer("envforge")
    return _provider


def exporter_from_env() -> SpanExporter | None:
    from envforge.settings import read_env

    kind = read_env().traces.lower()
    if kind in ("", "off", "0", "none"):
        return None
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if kind == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:  # the exporter is a pinned dependency; a trimmed install may lack it
            raise RuntimeError(
                "ENVFORGE_TRACES=otlp needs opentelemetry-exporter-otlp-proto-http "
                f"(pip install -c constraints.txt opentelemetry-exporter-otlp-proto-http): {exc}"
            )
        return OTLPSpanExporter()  # reads OTEL_EXPORTER_OTLP_ENDPOINT / _HEADERS itself
    raise ValueError(f"environment variable ENVFORGE_TRACES: expected off, console or otlp, got {kind!r}")


def tracer() -> trace.Tracer | None:
    global _env_checked
    if not _env_checked:
        _env_checked = True
        exporter = exporter_from_env()
        if exporter is not None:
            configure_tracing(exporter)
    return _tracer


def span(name: str, **attributes: Any):
    """A span as the current one (child of the enclosing span), or a null context when tracing is off."""
    t = _tracer if _env_checked else tracer()
    if t is None:
        return nullcontext(None)
    return t.start_as_current_span(name, attributes={k: v for k, v in attributes.items() if v is not None})


def set_attributes(current: Any, **attributes: Any) -> None:
    """Attributes learnt after a span began (the container id after acquire); no-op when off."""
    if current is not None:
        current.set_attributes({k: v for k, v in attributes.items() if v is not None})


def annotate(**attributes: Any) -> None:
    """Attributes on whatever span is current (code that does not hold its span: the grader's copy)."""
    if _tracer is not None:
        trace.get_current_span().set_attributes({k: v for k, v in attributes.items() if v is not None})
