"""Server-side spans made after the fact: a committed staging op becomes ``tempokv.stage``
with its device-clock times mapped onto Unix time exactly (the device's clock is
monotonic); a restore's spans, made after its retrieve answered, keep the restore's times."""

from __future__ import annotations

import pytest

pytest.importorskip("lmcache")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from bsrkv.lmcache_ext.tempokv import device as tempokv_device  # noqa: E402
from bsrkv.trace import spans  # noqa: E402


def test_a_staging_op_is_a_span_ending_now_and_starting_its_duration_before(monkeypatch) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(spans, "server_tracer", lambda: provider.get_tracer("t"))
    monkeypatch.setattr(tempokv_device.time, "time_ns", lambda: 5_000_000_000_000)
    rec = tempokv_device.StageRecord(
        7, 3 * 262_144, start_s=100.25, done_s=100.75, missed_objects=1
    )
    tempokv_device._trace_stage(rec, now_s=101.0)  # the device's clock now: 0.25 s after done
    (span,) = exporter.get_finished_spans()
    assert span.name == "tempokv.stage"
    assert (span.start_time, span.end_time) == (5_000_000_000_000 - 750_000_000,
                                                5_000_000_000_000 - 250_000_000)  # fmt: skip
    assert dict(span.attributes) == {"op": 7, "bytes": 786_432, "missed_objects": 1}


def test_a_restore_made_later_keeps_its_own_times(monkeypatch) -> None:
    """bsr.restore's spans are made on another thread after the retrieve answered: the
    restore span ends at the given time and each window's at its offsets, none at 'now'."""
    from bsrkv.restore.types import FailureKind, RestoreOutcome, RestoreState, WindowTiming

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(spans, "server_tracer", lambda: provider.get_tracer("t"))
    monkeypatch.setattr(spans.time, "time_ns", lambda: 1_000_000_000_000)
    anchor = spans.Stopwatch()  # restore start at 1000 s
    monkeypatch.setattr(spans.time, "time_ns", lambda: 9_000_000_000_000)  # "now": much later
    timing = WindowTiming(index=0, admit_wait_s=0.0, staged_at_s=0.001, ready_at_s=0.003,
                          installed_at_s=0.008, released_at_s=0.009, wait_s=0.002,
                          install_s=0.004, sync_s=0.001)  # fmt: skip
    outcome = RestoreOutcome(request_id="r", state=RestoreState.COMMITTED,
                             failure=FailureKind.NONE, detail="", cached_chunks=4,
                             chunk_tokens=256, bytes_restored=1, windows_done=1,
                             window_chunks=4, budget_chunks=4, peak_staged_bytes_by_rank={},
                             events=(), timings=(timing,))  # fmt: skip
    spans.trace_restore("r", 0, anchor, outcome, end_ns=1_000_010_000_000)
    got = {s.name: (s.start_time, s.end_time) for s in exporter.get_finished_spans()}
    assert got["bsr.restore"] == (1_000_000_000_000, 1_000_010_000_000)
    assert max(end for _start, end in got.values()) == 1_000_010_000_000


def test_the_server_exporter_batches_at_the_delay_its_environment_names(monkeypatch) -> None:
    """The delay has one home, the harness's collector: the server module's exporter reads
    it from OTEL_BSP_SCHEDULE_DELAY, which the harness sets for every launched process."""
    monkeypatch.setenv(spans.ENDPOINT_ENV, "unix:///nowhere")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    spans.shutdown_server_tracer()
    try:
        assert spans.tracer_records(spans.server_tracer())
        (bsp,) = spans._remote["provider"]._active_span_processor._span_processors
        assert bsp._batch_processor._schedule_delay_millis == 100
    finally:
        spans.shutdown_server_tracer()
