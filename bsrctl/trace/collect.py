"""One collector per bsrctl process: the OTLP receiver, the run folder its spans go to, the
forwarder to the user's collector, and bsrctl's own tracer provider.

A deployment ``acquire``\\s it when it starts (the receiver starts with the first) and
``release``\\s it when it stops; the run lifecycle brackets each run with ``collecting``:
spans that arrive meanwhile go to that run's ``spans.jsonl``, and when the run ends its
``timeline.json`` is written from them. A kept deployment outlives runs: each run gets the
spans that arrived during it. Tracing off (no deployment acquired it) costs nothing: no
receiver, no thread, a no-op tracer, no file."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from opentelemetry import trace

from bsrctl.trace.spec import TraceSpec

SpanRecord = dict[str, Any]

SPANS = "spans.jsonl"
TIMELINE = "timeline.json"
# What the launched processes' batch span processors wait before exporting (SDK default
# 5000 ms; OTEL_BSP_SCHEDULE_DELAY in their environment, the server module's included):
# spans reach the run folder while it is open, not after the stack is gone.
BSP_DELAY_MS = 100
QUIET_S = 3 * BSP_DELAY_MS / 1000  # the run's last spans have arrived once this is quiet
SETTLE_MAX_S = 3.0  # ... or after this, whatever is still in flight


@dataclass(frozen=True)
class Endpoints:
    """Where a launched process exports: OTLP/gRPC (Unix socket) and OTLP/HTTP (loopback)."""

    grpc: str
    http: str


class Collector:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._receiver: Any = None  # receiver.OtlpReceiver once a deployment acquired it
        self._forwarder: Any = None  # receiver.Forwarder when the spec forwards
        self._provider: Any = None
        self._users = 0
        self._runs: list[tuple[Path, IO[str]]] = []
        self._last_export = 0.0
        self.received = 0

    # ---- deployments ------------------------------------------------------------------------

    def acquire(self, spec: TraceSpec | None) -> Endpoints | None:
        """Start (or share) the receiver for a deployment; None when its spec turns tracing
        off. Pair every non-None answer with ``release``."""
        if spec is None or not spec.enabled:
            return None
        from bsrctl.trace.receiver import Forwarder, OtlpReceiver

        with self._lock:
            if self._receiver is None:
                self._receiver = OtlpReceiver(self._on_export).start()
                self._provider = _own_provider(self._receiver.http_endpoint)
            if spec.forward_endpoint and self._forwarder is None:
                self._forwarder = Forwarder(spec.forward_endpoint)
            self._users += 1
            return Endpoints(self._receiver.grpc_endpoint, self._receiver.http_endpoint)

    @contextmanager
    def holding(self, spec: TraceSpec | None) -> Iterator[None]:
        """``acquire`` for the block, ``release`` after it."""
        held = self.acquire(spec) is not None
        try:
            yield
        finally:
            if held:
                self.release()

    def release(self) -> None:
        with self._lock:
            self._users = max(0, self._users - 1)
            idle = self._users == 0 and not self._runs
        if idle:
            self._stop()

    def _stop(self) -> None:
        """Flush bsrctl's own spans, then stop forwarder and receiver (bounded waits)."""
        with self._lock:
            receiver, provider, fwd = self._receiver, self._provider, self._forwarder
            self._receiver = self._provider = self._forwarder = None
        if provider is not None:
            provider.shutdown()  # exports what is batched, through the receiver still up
        if fwd is not None:
            fwd.stop()
        if receiver is not None:
            receiver.stop()

    # ---- runs -------------------------------------------------------------------------------

    def _on_export(self, spans: list[SpanRecord], raw: bytes) -> None:
        with self._lock:
            self._last_export = time.monotonic()
            self.received += len(spans)
            if self._runs:
                out = self._runs[-1][1]
                for s in spans:
                    out.write(json.dumps(s, sort_keys=True) + "\n")
                out.flush()
            fwd = self._forwarder
        if fwd is not None:
            fwd.put(raw)

    @contextmanager
    def collecting(self, run_dir: Path) -> Iterator[None]:
        """Spans arriving while the run lasts go to its spans.jsonl; at its end (after the
        stack's teardown) the stragglers settle and timeline.json is written."""
        path = Path(run_dir) / SPANS
        with self._lock:
            self._runs.append((path, _LazyFile(path)))  # type: ignore[arg-type]
        try:
            yield
        finally:
            self._settle()
            with self._lock:
                entry = next(e for e in reversed(self._runs) if e[0] == path)
                self._runs.remove(entry)
                entry[1].close()
                idle = self._users == 0 and not self._runs
            if idle:
                self._stop()
            write_timeline(Path(run_dir))

    def _settle(self) -> None:
        if self._provider is not None:
            self._provider.force_flush(int(SETTLE_MAX_S * 1000))
        if self._receiver is None:
            return
        deadline = time.monotonic() + SETTLE_MAX_S
        while time.monotonic() < deadline and time.monotonic() - self._last_export < QUIET_S:
            time.sleep(QUIET_S / 3)

    def tracer(self, name: str = "bsrctl") -> Any:
        """bsrctl's own tracer (client, storage stack); a no-op one when nothing collects."""
        provider = self._provider
        return trace.NoOpTracer() if provider is None else provider.get_tracer(name)


class _LazyFile:
    """spans.jsonl, created at the first span: a run nothing traced has no file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: IO[str] | None = None

    def write(self, text: str) -> None:
        if self._f is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = self.path.open("a")
        self._f.write(text)

    def flush(self) -> None:
        if self._f is not None:
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def _own_provider(http_endpoint: str) -> Any:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from bsrctl.trace.receiver import pid_attr

    provider = TracerProvider(resource=Resource.create({"service.name": "bsrctl", **pid_attr()}))
    exporter = OTLPSpanExporter(endpoint=http_endpoint, timeout=5)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=BSP_DELAY_MS))
    return provider


def read_spans(run_dir: Path) -> list[SpanRecord]:
    path = Path(run_dir) / SPANS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_timeline(run_dir: Path) -> Path | None:
    """timeline.json (Chrome trace events) from the run's spans.jsonl; None without spans."""
    from bsrctl.trace.timeline import chrome_trace

    spans = read_spans(run_dir)
    if not spans:
        return None
    out = Path(run_dir) / TIMELINE
    out.write_text(json.dumps(chrome_trace(spans), indent=None, sort_keys=True) + "\n")
    return out


COLLECTOR = Collector()
