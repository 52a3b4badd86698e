"""The receiver decodes real OTLP exports from the SDK's exporters over loopback (HTTP) and
a Unix socket (gRPC), forwards them unchanged, and the collector writes the run's files."""

from __future__ import annotations

import json
import threading

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from bsrctl.trace.collect import Collector
from bsrctl.trace.receiver import OtlpReceiver
from bsrctl.trace.spec import TraceSpec


def _export(exporter, service: str = "svc") -> None:
    provider = TracerProvider(
        resource=Resource.create({"service.name": service, "process.pid": 42})
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("outer", attributes={"request_id": "bsrq-0123456789abcdef"}):
        tracer.start_span("inner", start_time=1_000, attributes={"n": 3, "ok": True}).end(
            end_time=2_500
        )
    provider.shutdown()


def _receiver() -> tuple[OtlpReceiver, list, list]:
    got: list = []
    raw: list = []
    rx = OtlpReceiver(lambda spans, body: (got.extend(spans), raw.append(body))).start()
    return rx, got, raw


def test_http_export_decoded() -> None:
    rx, got, _ = _receiver()
    try:
        _export(Http(endpoint=rx.http_endpoint, timeout=5))
    finally:
        rx.stop()
    inner, outer = got
    assert (inner["name"], inner["start_ns"], inner["end_ns"]) == ("inner", 1_000, 2_500)
    assert inner["attributes"] == {"n": 3, "ok": True}
    assert inner["parent_span_id"] == outer["span_id"] and inner["trace_id"] == outer["trace_id"]
    assert (outer["service"], outer["pid"], outer["parent_span_id"]) == ("svc", 42, "")
    assert outer["attributes"] == {"request_id": "bsrq-0123456789abcdef"}


def test_grpc_export_over_the_unix_socket_decoded() -> None:
    rx, got, _ = _receiver()
    try:
        assert rx.grpc_endpoint.startswith("unix:///")
        _export(Grpc(endpoint=rx.grpc_endpoint, insecure=True, timeout=5), "lmcache")
    finally:
        rx.stop()
    assert [(s["name"], s["service"]) for s in got] == [("inner", "lmcache"), ("outer", "lmcache")]


def test_collector_writes_spans_and_timeline_forwards_and_stops(tmp_path) -> None:
    second, fwd_got, _ = _receiver()  # the "user's collector", on loopback
    before = {t.name for t in threading.enumerate()}
    col = Collector()
    try:
        ends = col.acquire(TraceSpec(forward_endpoint=second.http_endpoint))
        assert ends is not None and ends.http.startswith("http://127.0.0.1:")
        with col.collecting(tmp_path):
            with col.tracer().start_as_current_span("client.request"):
                pass
            _export(Grpc(endpoint=ends.grpc, insecure=True, timeout=5), "vllm")
            col.release()  # the stack went down inside the run: the receiver waits for it
        assert col._receiver is None  # stopped once the run ended
    finally:
        second.stop()
    names = sorted(
        json.loads(x)["name"] for x in (tmp_path / "spans.jsonl").read_text().splitlines()
    )
    assert names == ["client.request", "inner", "outer"]
    doc = json.loads((tmp_path / "timeline.json").read_text())
    assert sorted(e["name"] for e in doc["traceEvents"] if e["ph"] == "X") == names
    assert sorted(s["name"] for s in fwd_got) == names  # the same spans, forwarded
    left = {t.name for t in threading.enumerate()} - before
    assert not {n for n in left if n.startswith(("otlp", "OtelBatch"))}, left


def test_tracing_off_costs_nothing(tmp_path) -> None:
    col = Collector()
    assert col.acquire(TraceSpec(enabled=False)) is None
    with col.collecting(tmp_path):
        with col.tracer().start_as_current_span("x") as span:
            assert not span.is_recording()
    assert list(tmp_path.iterdir()) == [] and col._receiver is None
