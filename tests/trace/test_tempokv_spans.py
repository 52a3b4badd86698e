"""TempoKV's server-side spans: a committed staging op becomes ``tempokv.stage`` with its
device-clock times mapped onto Unix time exactly (the device's clock is monotonic)."""

from __future__ import annotations

import pytest

pytest.importorskip("lmcache")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from bsrctl.lmcache_ext import tempokv_device  # noqa: E402
from bsrctl.trace import spans  # noqa: E402


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
