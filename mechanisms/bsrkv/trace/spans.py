"""bsrctl's own spans, through the OpenTelemetry API: the client's request and first token,
the server module's probe and retrieve, each restore window's phases.

In bsrctl's process the tracer is the collector's (``COLLECTOR.tracer``); in the LMCache
server, where the module runs, it is a provider of its own exporting to the receiver named
by ``BSRCTL_OTLP_ENDPOINT`` (set by bsrctl when it launches the server), never LMCache's
global one. Without either, the tracer is the API's no-op one.

In the server a span never decides anything: a tracer that cannot be made (its exporter
fails to load), started or ended only loses its spans (``server_span``, ``server_tracer``:
counted on ``GUARD``, logged once); the block's own exceptions pass through untouched."""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bsrkv.hostguard import Guard
from bsrkv.restore.types import RestoreOutcome, WindowTiming
from bsrkv.trace.collect import BSP_DELAY_MS, COLLECTOR
from bsrkv.trace.timeline import CLIENT_REQUEST, CLIENT_TTFT

ENDPOINT_ENV = "BSRCTL_OTLP_ENDPOINT"  # OTLP/gRPC target of the launched processes
_lock = threading.Lock()
_remote: dict[str, Any] = {}
GUARD = Guard("bsrkv.trace.spans", logging.getLogger("bsrctl.trace"))  # the server's spans


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


def server_tracer() -> Any:
    """The server module's tracer (in the LMCache process): its own provider exporting
    over OTLP/gRPC to ``$BSRCTL_OTLP_ENDPOINT``; no-op when bsrctl set none, or when the
    provider cannot be made (counted once: the no-op one stays)."""
    endpoint = os.environ.get(ENDPOINT_ENV)
    if not endpoint:
        return trace.NoOpTracer()
    with _lock:
        if "tracer" not in _remote:
            _remote["tracer"] = GUARD.run("tracer", trace.NoOpTracer(), _made_tracer, endpoint)
        return _remote["tracer"]


def _made_tracer(endpoint: str) -> Any:  # holds _lock
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    res = Resource.create({"service.name": "bsrctl.server", "process.pid": os.getpid()})
    provider = TracerProvider(resource=res)
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=endpoint, insecure=True),
            schedule_delay_millis=BSP_DELAY_MS,
        )
    )
    _remote["provider"] = provider
    return provider.get_tracer("bsrkv.lmcache_ext.server")


@contextmanager
def server_span(name: str, attributes: dict[str, Any]) -> Iterator[None]:
    """The server module's span around a block, current while it runs. The tracer's
    failures lose the span (``GUARD``); the block's exceptions pass through untouched."""
    cm = GUARD.call(
        "span", lambda: server_tracer().start_as_current_span(name, attributes=attributes)
    )
    entered = cm is not None and GUARD.run("span", False, lambda: cm.__enter__() or True)
    try:
        yield
    except BaseException as exc:
        if entered:
            GUARD.call("span", cm.__exit__, type(exc), exc, exc.__traceback__)
        raise
    if entered:
        GUARD.call("span", cm.__exit__, None, None, None)


def server_event_span(name: str, start_ns: int, attributes: dict[str, Any]) -> None:
    """A span of the server module from ``start_ns`` to now (lost, counted, if it fails)."""
    GUARD.call(
        "span",
        lambda: server_tracer().start_span(name, start_time=start_ns, attributes=attributes).end(),
    )


def shutdown_server_tracer() -> None:
    """Export what the module's provider still batches (the server is closing)."""
    with _lock:
        provider = _remote.pop("provider", None)
        _remote.pop("tracer", None)
    if provider is not None:
        GUARD.call("shutdown", provider.shutdown)


class Stopwatch:
    """The Unix time, taken just before a restore starts: ``ns(t)`` is when ``t`` seconds
    after it fell (the core runs on an injected clock and knows no OpenTelemetry: its
    ``WindowTiming``\\s, offsets from its start, become spans after the restore)."""

    def __init__(self) -> None:
        self.unix_t0_ns = time.time_ns()

    def ns(self, t_from_restore_start_s: float) -> int:
        return self.unix_t0_ns + round(t_from_restore_start_s * 1e9)


def window_spans(
    tracer: Any,
    request_id: str,
    anchor: Stopwatch,
    timings: Sequence[WindowTiming],
    attributes: dict[str, Any] | None = None,
) -> None:
    """Each installed window's admission wait, fetch, install, sync, read-back and release
    as spans (times from the window's ``WindowTiming``; offsets from restore start)."""
    if not tracer_records(tracer):
        return
    base = {"request_id": request_id, **(attributes or {})}
    for w in timings:
        sync_from = w.installed_at_s - w.sync_s
        install_from = sync_from - w.install_s
        after = w.installed_at_s + (w.readback_s or 0.0)
        phases = [
            ("bsr.admission_wait", w.staged_at_s - w.admit_wait_s, w.staged_at_s),
            ("bsr.fetch", w.staged_at_s, w.ready_at_s),
            ("bsr.install", install_from, sync_from),
            ("bsr.sync", sync_from, w.installed_at_s),
        ]
        if w.readback_s is not None:
            phases.append(("bsr.readback", w.installed_at_s, after))
        if w.released_at_s >= 0:
            phases.append(("bsr.release", after, w.released_at_s))
        for name, a, b in phases:
            if b <= a and name == "bsr.admission_wait":
                continue  # admitted at once
            tracer.start_span(
                name, start_time=anchor.ns(a), attributes={**base, "window": w.index}
            ).end(end_time=anchor.ns(max(a, b)))


def trace_restore(
    request_id: str, rank: int, anchor: Stopwatch, outcome: RestoreOutcome, end_ns: int
) -> None:
    """The server module's restore (``bsr.restore``, from ``anchor`` to ``end_ns``, Unix
    ns) and its windows' phases as spans; made after the retrieve answered, on another
    thread, so every time is given, none read."""
    tracer = server_tracer()
    if not tracer_records(tracer):
        return
    attrs = {"request_id": request_id, "rank": rank, "ok": outcome.ok,
             "windows_done": outcome.windows_done, "failure": outcome.failure.name}  # fmt: skip
    tracer.start_span("bsr.restore", start_time=anchor.unix_t0_ns, attributes=attrs).end(
        end_time=end_ns
    )
    window_spans(tracer, request_id, anchor, outcome.timings, {"rank": rank})


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
    phases, on bsrctl's own tracer (a no-op one when nothing collects)."""
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


def tracer_records(tracer: Any) -> bool:
    return not isinstance(tracer, trace.NoOpTracer)
