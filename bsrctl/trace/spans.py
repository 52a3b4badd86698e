"""The spans bsrctl's own process emits, on the collector's tracer (``COLLECTOR.tracer``,
a no-op one when nothing collects): the client's request and first token, and the storage
stack's in-process restore. The server module's spans, and the window phases both share,
are the mechanisms' (``bsrkv.trace.spans``)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bsrctl.trace.collect import COLLECTOR
from bsrctl.trace.timeline import CLIENT_REQUEST, CLIENT_TTFT
from bsrkv.restore.types import RestoreOutcome
from bsrkv.trace.spans import Stopwatch, tracer_records, window_spans


def new_request_id() -> str:
    """The id the client sends as ``X-Request-Id`` (``timeline.REQUEST_ID`` finds it)."""
    return f"bsrq-{secrets.token_hex(8)}"


@contextmanager
def client_request(request_id: str) -> Iterator[tuple[dict[str, str], Any]]:
    """The client's span around one request: yields the headers to send (the request id,
    and ``traceparent`` when traced: vLLM's span joins this trace) and the span."""
    tracer = COLLECTOR.tracer("bsrctl.client")
    headers = {"X-Request-Id": request_id}
    with tracer.start_as_current_span(
        CLIENT_REQUEST, attributes={"request_id": request_id}
    ) as span:
        if span.is_recording():
            TraceContextTextMapPropagator().inject(headers)
        yield headers, span


def first_token(span: Any, request_id: str, sent_ns: int, at_ns: int) -> None:
    """The client's TTFT as a child span: send to the first streamed token."""
    if not span.is_recording():
        return
    tracer = COLLECTOR.tracer("bsrctl.client")
    ctx = trace.set_span_in_context(span)
    tracer.start_span(
        CLIENT_TTFT, context=ctx, start_time=sent_ns, attributes={"request_id": request_id}
    ).end(end_time=at_ns)


def trace_local_restore(
    tracer: Any,
    request_id: str,
    probe_start_ns: int,
    anchor: Stopwatch,
    outcome: RestoreOutcome,
    end_ns: int,
) -> None:
    """An in-process restore (the storage stack): ``bsr.probe`` from ``probe_start_ns`` to
    the restore's start, ``bsr.restore`` from ``anchor`` to ``end_ns`` and its windows'
    phases, on ``tracer`` (the collector's; a no-op one when nothing collects)."""
    if not tracer_records(tracer):
        return
    base = {"request_id": request_id}
    tracer.start_span("bsr.probe", start_time=probe_start_ns, attributes=base).end(
        end_time=max(probe_start_ns, anchor.unix_t0_ns)
    )
    attrs = {**base, "ok": outcome.ok, "windows_done": outcome.windows_done,
             "failure": outcome.failure.name}  # fmt: skip
    tracer.start_span("bsr.restore", start_time=anchor.unix_t0_ns, attributes=attrs).end(
        end_time=end_ns
    )
    window_spans(tracer, request_id, anchor, outcome.timings)
