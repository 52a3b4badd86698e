"""bsrctl's own spans (``bsrctl.trace.spans``): the client's request carries its id, and
``traceparent`` only when traced; the storage stack's in-process restore becomes
``bsr.probe``, ``bsr.restore`` and each window's phases at their given times."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bsrctl.trace import spans
from bsrctl.trace.timeline import REQUEST_ID
from bsrkv.restore.types import FailureKind, RestoreOutcome, RestoreState, WindowTiming
from bsrkv.trace.spans import Stopwatch


def _recording(monkeypatch) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(spans.COLLECTOR, "tracer", lambda name="bsrctl": provider.get_tracer(name))
    return exporter


def test_an_untraced_request_sends_its_id_alone() -> None:
    rid = spans.new_request_id()
    assert REQUEST_ID.fullmatch(rid)
    with spans.client_request(rid) as (headers, span):  # nothing collects: a no-op tracer
        assert headers == {"X-Request-Id": rid}
        spans.first_token(span, rid, 1, 2)


def test_a_traced_request_sends_traceparent_and_its_ttft_is_a_child(monkeypatch) -> None:
    exporter = _recording(monkeypatch)
    with spans.client_request("bsrq-00000000000000aa") as (headers, span):
        assert sorted(headers) == ["X-Request-Id", "traceparent"]
        spans.first_token(span, "bsrq-00000000000000aa", 1_000, 5_000)
    ttft, req = exporter.get_finished_spans()
    assert (req.name, ttft.name) == ("client.request", "client.ttft")
    assert ttft.parent.span_id == req.context.span_id
    assert (ttft.start_time, ttft.end_time) == (1_000, 5_000)
    assert headers["traceparent"].split("-")[2] == f"{req.context.span_id:016x}"


def test_an_in_process_restore_is_its_probe_restore_and_window_phases(monkeypatch) -> None:
    exporter = _recording(monkeypatch)
    monkeypatch.setattr("bsrkv.trace.spans.time.time_ns", lambda: 2_000_000_000_000)
    anchor = Stopwatch()  # restore start at 2000 s
    timing = WindowTiming(index=0, admit_wait_s=0.0, staged_at_s=0.001, ready_at_s=0.003,
                          installed_at_s=0.008, released_at_s=0.009, wait_s=0.002,
                          install_s=0.004, sync_s=0.001)  # fmt: skip
    outcome = RestoreOutcome(request_id="r", state=RestoreState.COMMITTED,
                             failure=FailureKind.NONE, detail="", cached_chunks=4,
                             chunk_tokens=256, bytes_restored=1, windows_done=1,
                             window_chunks=4, budget_chunks=4, peak_staged_bytes_by_rank={},
                             events=(), timings=(timing,))  # fmt: skip
    tracer = spans.COLLECTOR.tracer()
    spans.trace_local_restore(tracer, "r", 1_999_000_000_000, anchor, outcome, 2_000_010_000_000)
    got = [(s.name, s.start_time, s.end_time) for s in exporter.get_finished_spans()]
    ms = 1_000_000
    t0 = 2_000_000_000_000
    assert got == [
        ("bsr.probe", 1_999_000_000_000, t0),
        ("bsr.restore", t0, 2_000_010_000_000),
        ("bsr.fetch", t0 + 1 * ms, t0 + 3 * ms),
        ("bsr.install", t0 + 3 * ms, t0 + 7 * ms),
        ("bsr.sync", t0 + 7 * ms, t0 + 8 * ms),
        ("bsr.release", t0 + 8 * ms, t0 + 9 * ms),
    ]
