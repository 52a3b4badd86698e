"""The adapter's transport: an arrival's claim waits (bounded) for the server's reply, so
it is on the server before the lookup vLLM's next schedule() sends; other sends never
wait. The futures are LMCache's own; the client answers from a thread."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from lmcache.v1.multiprocess.futures import MessagingFuture
from lmcache.v1.multiprocess.protocols.server_module import (
    ServerModuleCallRequest,
    ServerModuleCallResponse,
)

from bsrctl.vllm_ext.scheduler import TempoKVAdapter, _StepTrace
from bsrctl.vllm_ext.transport import RecordTransport, ServerModuleTransport


class DelayedClient:
    """Answers each call ``delay_s`` later with the request's payload echoed."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.calls: list[ServerModuleCallRequest] = []

    def server_module_call(self, req: ServerModuleCallRequest) -> MessagingFuture:
        self.calls.append(req)
        fut: MessagingFuture = MessagingFuture()

        def answer() -> None:
            time.sleep(self.delay_s)
            fut.set_result(ServerModuleCallResponse(success=True, payload=req.payload, error=""))

        threading.Thread(target=answer, daemon=True).start()
        return fut


def test_a_waited_send_returns_once_its_reply_is_back() -> None:
    client = DelayedClient(0.05)
    t = ServerModuleTransport([client], ServerModuleCallRequest)
    t0 = time.monotonic()
    assert t.send("tempokv.update", {"report": ["a"]}, wait_s=2.0) is True
    assert 0.05 <= time.monotonic() - t0 < 2.0
    # the reply is still delivered to the adapter's next collection, exactly once
    assert t.replies() == [("tempokv.update", {"report": ["a"]})]
    assert t.replies() == []
    assert [json.loads(c.payload) for c in client.calls] == [{"report": ["a"]}]


def test_a_waited_send_gives_up_at_its_bound_and_says_so() -> None:
    t = ServerModuleTransport([DelayedClient(0.5)], ServerModuleCallRequest)
    t0 = time.monotonic()
    assert t.send("tempokv.update", {"report": ["a"]}, wait_s=0.05) is False
    assert time.monotonic() - t0 < 0.4
    assert t.replies() == []  # not back yet; collected later
    time.sleep(0.6)
    assert t.replies() == [("tempokv.update", {"report": ["a"]})]


def test_plain_sends_do_not_wait() -> None:
    t = ServerModuleTransport([DelayedClient(0.5)], ServerModuleCallRequest)
    t0 = time.monotonic()
    assert t.send("tempokv.update", {"order": []}) is True
    assert time.monotonic() - t0 < 0.4
    r = RecordTransport()
    assert r.send("tempokv.update", {"order": ["a"]}, wait_s=1.0) is True
    assert r.sent == [("tempokv.update", {"order": ["a"]})]


def _adapter(client: DelayedClient, trace: Path) -> TempoKVAdapter:
    """The adapter's send path alone (no vLLM scheduler under it)."""
    a = TempoKVAdapter.__new__(TempoKVAdapter)
    a._tk_transport = ServerModuleTransport([client], ServerModuleCallRequest)
    a._bk_trace = _StepTrace(trace)
    return a


def test_the_trace_records_how_long_an_arrival_held_the_engine_loop(tmp_path: Path) -> None:
    trace = tmp_path / "adapter-trace.jsonl"
    _adapter(DelayedClient(0.05), trace)._tk_send({"report": ["a"]}, arrival=True, wait_s=2.0)
    _adapter(DelayedClient(0.5), trace)._tk_send({"report": ["b"]}, arrival=True, wait_s=0.05)
    _adapter(DelayedClient(0.5), trace)._tk_send({"order": ["a"]})  # not an arrival: no wait
    recs = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [(r["kind"], r.get("arrival"), r.get("acked")) for r in recs] == [
        ("update", True, True), ("update", True, False), ("update", None, None)
    ]  # fmt: skip
    assert 0.05 <= recs[0]["ack_wait_s"] < 2.0  # acked: the reply's delay
    assert 0.05 <= recs[1]["ack_wait_s"] < 0.4  # gave up at its bound
    assert "ack_wait_s" not in recs[2]
