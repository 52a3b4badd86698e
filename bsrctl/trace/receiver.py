"""bsrctl's OTLP receiver: spans from every process of a run, decoded with
``opentelemetry-proto``.

Two listeners feed one callback: OTLP/HTTP protobuf (``POST /v1/traces``) on 127.0.0.1, port
0 (bsrctl's own process, and anyone on loopback), and OTLP/gRPC on a Unix socket for the
processes bsrctl launches. LMCache's tracing exports over gRPC only (its
``init_otel_tracing`` builds the grpc ``OTLPSpanExporter``:
lmcache/v1/mp_observability/otel_init.py:213-220), and a Unix socket is reached from inside
the stack's network namespace too (a path, not an address on some namespace's loopback).
``Forwarder`` re-posts what arrives, unchanged, to the user's collector."""

from __future__ import annotations

import gzip
import logging
import os
import queue
import shutil
import tempfile
import threading
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb

log = logging.getLogger(__name__)
SpanRecord = dict[str, Any]
OnExport = Callable[[list[SpanRecord], bytes], None]
MAX_BODY = 64 << 20  # one export; the SDK batches 512 spans at most


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def decode(body: bytes) -> list[SpanRecord]:
    """An ExportTraceServiceRequest's spans, one flat record each (the resource's
    ``service.name`` and process id on every span)."""
    req = pb.ExportTraceServiceRequest()
    req.ParseFromString(body)
    out: list[SpanRecord] = []
    for rs in req.resource_spans:
        res = _attrs(rs.resource.attributes)
        pid = res.get("process.pid", res.get("vllm.process_id"))
        service = str(res.get("service.name", "unknown_service"))
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    {
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "name": s.name,
                        "service": service,
                        "pid": int(pid) if pid is not None and str(pid).isdigit() else None,
                        "scope": ss.scope.name,
                        "start_ns": int(s.start_time_unix_nano),
                        "end_ns": int(s.end_time_unix_nano),
                        "attributes": _attrs(s.attributes),
                    }
                )
    return out


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.rstrip("/") != "/v1/traces":
            self.send_error(404, "OTLP traces only: POST /v1/traces")
            return
        n = int(self.headers.get("Content-Length") or 0)
        if not 0 < n <= MAX_BODY:
            self.send_error(413 if n else 411)
            return
        body = self.rfile.read(n)
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        try:
            spans = decode(body)
        except Exception as exc:  # a malformed export is the sender's problem, not the run's
            self.send_error(400, f"not an ExportTraceServiceRequest: {exc}")
            return
        self.server.on_export(spans, body)
        reply = pb.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return  # one line per export would drown the run's log


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, on_export: OnExport) -> None:
        self.on_export = on_export
        super().__init__(("127.0.0.1", 0), _Handler)


class OtlpReceiver:
    """Started by ``start``, stopped by ``stop`` (bounded: a hung sender cannot hold it)."""

    def __init__(self, on_export: OnExport) -> None:
        self._on_export = on_export
        self._http: _HttpServer | None = None
        self._thread: threading.Thread | None = None
        self._grpc: Any = None
        self._sock_dir: Path | None = None

    @property
    def http_endpoint(self) -> str:
        """OTLP/HTTP traces URL (``http://127.0.0.1:PORT/v1/traces``)."""
        assert self._http is not None, "receiver not started"
        return f"http://127.0.0.1:{self._http.server_address[1]}/v1/traces"

    @property
    def grpc_endpoint(self) -> str:
        """OTLP/gRPC target on the Unix socket (``unix:///…/otlp.sock``)."""
        assert self._sock_dir is not None, "receiver not started"
        return f"unix://{self._sock_dir / 'otlp.sock'}"

    def start(self, grpc: bool = True) -> OtlpReceiver:
        self._http = _HttpServer(self._on_export)
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
            name="otlp-http",
        )  # fmt: skip
        self._thread.start()
        if grpc:
            self._start_grpc()
        return self

    def _start_grpc(self) -> None:
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as pbg

        on_export = self._on_export

        class Servicer(pbg.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (OTLP's name)
                on_export(decode(request.SerializeToString()), request.SerializeToString())
                return pb.ExportTraceServiceResponse()

        # short: AF_UNIX paths are limited to 108 bytes, run folders can be longer
        self._sock_dir = Path(tempfile.mkdtemp(prefix="bsrctl-otlp-"))
        server = grpc.server(ThreadPoolExecutor(max_workers=2, thread_name_prefix="otlp-grpc"))
        pbg.add_TraceServiceServicer_to_server(Servicer(), server)
        server.add_insecure_port(self.grpc_endpoint.replace("unix://", "unix:", 1))
        server.start()
        self._grpc = server

    def stop(self, timeout_s: float = 2.0) -> None:
        if self._grpc is not None:
            self._grpc.stop(grace=timeout_s / 2).wait(timeout_s)
            self._grpc = None
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self._sock_dir is not None:
            shutil.rmtree(self._sock_dir, ignore_errors=True)
            self._sock_dir = None


class Forwarder:
    """Posts each export, as received, to an OTLP/HTTP endpoint from one thread; a full
    queue or a failed post drops that export (counted), never slows the run."""

    def __init__(self, endpoint: str, timeout_s: float = 2.0, depth: int = 256) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.sent = 0
        self.dropped = 0
        self._q: queue.Queue[bytes | None] = queue.Queue(depth)
        self._thread = threading.Thread(target=self._run, daemon=True, name="otlp-forward")
        self._thread.start()

    def put(self, body: bytes) -> None:
        try:
            self._q.put_nowait(body)
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        while (body := self._q.get()) is not None:
            req = urllib.request.Request(self.endpoint, data=body, method="POST")
            req.add_header("Content-Type", "application/x-protobuf")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    resp.read()
                self.sent += 1
            except OSError as exc:
                self.dropped += 1
                log.warning("forwarding spans to %s failed: %s", self.endpoint, exc)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (bounded by ``timeout_s``), then end the thread."""
        try:
            self._q.put(None, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(timeout_s)


def pid_attr() -> dict[str, Any]:
    return {"process.pid": os.getpid()}
