"""Per-request timelines on OpenTelemetry: bsrctl's OTLP receiver and collector
(``collect``), its own spans (``spans``), spans to Chrome trace events and critical paths
(``timeline``), and the stack spec's ``trace`` field (``spec``).

Importing this package imports no OpenTelemetry SDK: only what uses it does."""

from bsrkv.trace.spec import TraceSpec

__all__ = ["TraceSpec"]
