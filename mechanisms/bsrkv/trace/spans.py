"""The spans bsrkv's own code emits inside the hosts, through the OpenTelemetry API: the
server module's probe and retrieve, each restore window's phases, TempoKV's staging; and
the exporter that ships them.

In the LMCache server the tracer is a provider of the module's own exporting over OTLP/gRPC
to the endpoint named by ``BSRKV_OTLP_ENDPOINT`` (set by whoever launches the server),
never LMCache's global one; its batch delay is the SDK's ``OTEL_BSP_SCHEDULE_DELAY``.
Without an endpoint the tracer is the API's no-op one.

A span never decides anything: a tracer that cannot be made (its exporter fails to load),
started or ended only loses its spans (``server_span``, ``server_tracer``: counted on
``GUARD``, logged once); the block's own exceptions pass through untouched."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace

from bsrkv.hostguard import Guard
from bsrkv.restore.types import RestoreOutcome, WindowTiming

ENDPOINT_ENV = "BSRKV_OTLP_ENDPOINT"  # OTLP/gRPC target of the launched processes
_lock = threading.Lock()
_remote: dict[str, Any] = {}
GUARD = Guard("bsrkv.trace.spans", logging.getLogger("bsrkv.trace"))  # the server's spans


def server_tracer() -> Any:
    """The server module's tracer (in the LMCache process): its own provider exporting
    over OTLP/gRPC to ``$BSRKV_OTLP_ENDPOINT``; no-op when none is set, or when the
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

    res = Resource.create({"service.name": "bsrkv.server", "process.pid": os.getpid()})
    provider = TracerProvider(resource=res)
    # the batch delay: $OTEL_BSP_SCHEDULE_DELAY (the SDK reads it), as LMCache's exporter
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True))
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


def tracer_records(tracer: Any) -> bool:
    return not isinstance(tracer, trace.NoOpTracer)
