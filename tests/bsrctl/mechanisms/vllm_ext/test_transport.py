"""The adapter's transport: a send never waits; an arrival's claim is waited for (bounded)
before a schedule() that may look its request up, so it is on the server before that
lookup, and not while vLLM's running slots are full (no lookup can come). The futures are
LMCache's own; the test answers them itself (the adapter's clock is the test's, and the
client advances it by the reply's delay). The adapter reads its settings (BSRKV_TEMPOKV)
and the controller's replies through the TempoKV wire: a renamed key is refused, naming
it."""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from lmcache.v1.multiprocess.futures import MessagingFuture
from lmcache.v1.multiprocess.protocols.server_module import (
    ServerModuleCallRequest,
    ServerModuleCallResponse,
)

from bsrctl.stack.launch.extensions import TempoKVLaunch
from bsrkv.hostguard import Guard
from bsrkv.tempokv import wire
from bsrkv.tempokv.live import AdapterSettings, LiveAdapterCore
from bsrkv.vllm_ext import recorder, scheduler
from bsrkv.vllm_ext.scheduler import TempoKVAdapter
from bsrkv.vllm_ext.step_trace import StepTrace
from bsrkv.vllm_ext.transport import RecordTransport, ServerModuleTransport

UPDATE = wire.UpdateRequest(0.0, ("a",), (), ("a",), {}, {})


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Client:
    """Answers each call with ``reply`` (the request's payload echoed when None): at once
    (``delay_s`` then passes on ``clock``), from a thread of its own (``threaded``), or only
    when the test calls ``answer()`` (``held``)."""

    def __init__(self, reply: dict | None = None, held: bool = False, threaded: bool = False,
                 clock: Clock | None = None, delay_s: float = 0.0) -> None:  # fmt: skip
        self.reply, self.held, self.threaded = reply, held, threaded
        self.clock, self.delay_s = clock, delay_s
        self.calls: list[ServerModuleCallRequest] = []
        self.pending: list[tuple[MessagingFuture, bytes]] = []

    def server_module_call(self, req: ServerModuleCallRequest) -> MessagingFuture:
        self.calls.append(req)
        fut: MessagingFuture = MessagingFuture()
        body = req.payload if self.reply is None else json.dumps(self.reply).encode()
        self.pending.append((fut, body))
        if self.threaded:
            threading.Thread(target=self.answer, daemon=True).start()
        elif not self.held:
            self.answer()
        return fut

    def answer(self) -> None:
        if self.clock is not None:
            self.clock.t += self.delay_s
        while self.pending:
            fut, body = self.pending.pop(0)
            fut.set_result(ServerModuleCallResponse(success=True, payload=body, error=""))


def test_a_waited_send_returns_once_its_reply_is_back() -> None:
    client = Client(threaded=True)  # answered from the client's thread, whenever it runs
    t = ServerModuleTransport([client], ServerModuleCallRequest)
    assert t.send("tempokv.update", {"report": ["a"]}).wait(600.0) is True
    # back when send returned: delivered to the adapter's next collection, exactly once
    assert t.replies() == [("tempokv.update", {"report": ["a"]})]
    assert t.replies() == []
    assert [json.loads(c.payload) for c in client.calls] == [{"report": ["a"]}]


def test_a_waited_send_gives_up_at_its_bound_and_says_so() -> None:
    client = Client(held=True)
    t = ServerModuleTransport([client], ServerModuleCallRequest)
    assert t.send("tempokv.update", {"report": ["a"]}).wait(0.05) is False
    assert t.replies() == []  # not back yet; collected later
    client.answer()
    assert t.replies() == [("tempokv.update", {"report": ["a"]})]
    assert t.replies() == []


def test_plain_sends_do_not_wait() -> None:
    client = Client(held=True)  # never answers unless told: a wait would not return
    t = ServerModuleTransport([client], ServerModuleCallRequest)
    pending = t.send("tempokv.update", {"order": []})
    assert not client.pending[0][0].query()  # returned with its reply still out
    assert pending.wait(0.0) is False
    r = RecordTransport()
    assert r.send("tempokv.update", {"order": ["a"]}).wait(0.0) is True  # nothing to wait for
    assert r.sent == [("tempokv.update", {"order": ["a"]})]


def _adapter(
    client: Client, trace: Path, clock: Clock | None = None, cls: type = TempoKVAdapter
) -> TempoKVAdapter:
    """The adapter's send and collect paths alone (no vLLM scheduler under it)."""
    a = cls.__new__(cls)
    if clock is not None:
        a._tk_clock = clock  # type: ignore[method-assign]
    a._tk_transport = ServerModuleTransport([client], ServerModuleCallRequest)
    a._bk_guard = Guard("test", on_failure=a._tk_fail)
    a._bk_trace = StepTrace(trace, a._bk_guard)
    a._tk = LiveAdapterCore(AdapterSettings(k=2))
    a._tk_on = True
    return a


def sent(a: TempoKVAdapter, update: wire.UpdateRequest, **kw: Any) -> None:
    """``a`` sends ``update``; its trace then written (the engine idle)."""
    a._tk_send(update, **kw)
    a._bk_trace.flush()


class _Slots:
    """vLLM's scheduler as the arrival wait reads it (one running slot) and returns; its
    schedule() notes how many arrival claims were still unsettled when it ran."""

    max_num_running_reqs = max_num_active_reqs = 1
    num_waiting_for_streaming_input = 0
    running: list[str] = []
    unsettled_at_schedule = -1
    _tk_unacked: deque[Any]

    def schedule(self) -> SimpleNamespace:
        self.unsettled_at_schedule = len(self._tk_unacked)
        return SimpleNamespace(num_scheduled_tokens={}, scheduled_new_reqs=[],
                               finished_req_ids=set())  # fmt: skip


class _SlotHooked(TempoKVAdapter, _Slots):
    pass


def _arrived(client: Client, trace: Path, clock: Clock, running: list[str]) -> Any:
    """An adapter over ``_Slots`` that has just sent one arrival's claim."""
    a: Any = _adapter(client, trace, clock, cls=_SlotHooked)
    a._tk_scheduled, a._tk_unacked, a.running = deque(), deque(), running
    a._tk_step = lambda out: None  # the pass after schedule() is not this test's
    a._tk_unacked.append((a._tk_send(UPDATE, arrival=True), clock()))
    return a


def test_an_arrivals_claim_is_waited_for_only_before_a_schedule_that_may_look_it_up(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "adapter-trace.jsonl"
    clock = Clock()
    client = Client(held=True, clock=clock, delay_s=0.05)  # answers when told, 0.05 s later
    full = _arrived(client, trace, clock, running=["r"])  # the one slot taken: no lookup
    full.schedule()
    assert (full.unsettled_at_schedule, len(full._tk_unacked)) == (1, 1)  # nothing waited
    client.answer()
    full.schedule()  # back now: done with, held the loop for nothing
    assert (full.unsettled_at_schedule, len(full._tk_unacked)) == (0, 0)
    slow = Client(held=True, clock=clock, delay_s=0.25)
    free = _arrived(slow, trace, clock, running=[])  # a slot free: vLLM may look it up
    free._tk.s = replace(free._tk.s, arrival_ack_s=600.0)  # its reply comes well within
    threading.Timer(0.5, slow.answer).start()
    free.schedule()  # waits for the reply before vLLM's own schedule()
    assert (free.unsettled_at_schedule, len(free._tk_unacked)) == (0, 0)
    never = _arrived(Client(held=True), trace, clock, running=[])
    never.schedule()  # gives up at arrival_ack_s (the test's clock stands still)
    assert (never.unsettled_at_schedule, len(never._tk_unacked)) == (0, 0)
    for a in (full, free, never):
        a._bk_trace.flush()
    recs = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [(r["kind"], r.get("arrival")) for r in recs if r["kind"] == "update"] == [
        ("update", True)
    ] * 3
    assert {k: recs[0][k] for k in UPDATE.to_json()} == UPDATE.to_json()  # the record as sent
    assert [{k: v for k, v in r.items() if k != "kind"} for r in recs
            if r["kind"] == "arrival_ack"] == [
        {"acked": True, "ack_wait_s": 0.0, "after_s": 0.05},  # back before a lookup could be
        {"acked": True, "ack_wait_s": 0.25, "after_s": 0.25},  # the loop held for its reply
        {"acked": False, "ack_wait_s": 0.0, "after_s": 0.0},  # given up at the bound
    ]  # fmt: skip
    assert full._tk_errors == free._tk_errors == never._tk_errors == 0


def test_the_adapter_reads_the_controllers_reply_through_the_wire(tmp_path: Path) -> None:
    reply = wire.UpdateReply({"a": 512}, {"a": 0.25}, False, False, None)
    a = _adapter(Client(reply.to_json()), tmp_path / "t.jsonl")
    a._tk.claimed["a"] = 0
    a._tk_send(UPDATE)
    a._tk_collect()
    assert (a._tk.claimed, a._tk.eta_s) == ({"a": 512}, {"a": 0.25})
    assert (a._tk.s.needs_ttu, a._tk.s.ttu_quantile) == (False, None)  # the policy's
    off = _adapter(Client(wire.UpdateReply.turned_off().to_json()), tmp_path / "o.jsonl")
    off._tk_send(UPDATE)
    off._tk_collect()
    assert off._tk.s == AdapterSettings(k=2)  # TempoKV off: nothing the policy says


class _Scheduled:
    """What vLLM's scheduler returns, as far as the recorder reads it."""

    def schedule(self) -> SimpleNamespace:
        return SimpleNamespace(num_scheduled_tokens={}, scheduled_new_reqs=[],
                               finished_req_ids=set())  # fmt: skip


class _Hooked(TempoKVAdapter, _Scheduled):
    pass


def test_a_reply_with_a_renamed_key_is_an_adapter_error_naming_it(tmp_path: Path) -> None:
    raw = wire.UpdateReply({"a": 512}, {}, False, True, None).to_json()
    raw["hit_token"] = raw.pop("hit_tokens")
    trace = tmp_path / "t.jsonl"
    a = _adapter(Client(raw), trace, cls=_Hooked)
    a._tk_scheduled = deque()
    a._tk.claimed["a"] = 0
    a._tk_send(UPDATE)
    out = a.schedule()  # the hook collects the reply: refused, counted, scheduling goes on
    a._bk_trace.flush()
    assert out.num_scheduled_tokens == {}
    assert a._tk.claimed == {"a": 0}  # nothing read as 0 or absent
    (err,) = [json.loads(x) for x in trace.read_text().splitlines() if '"adapter_error"' in x]
    assert err["where"] == "schedule"
    assert "missing keys ['hit_tokens'], unexpected keys ['hit_token']" in err["error"]
    assert a._tk_errors == 1


def test_the_adapter_settings_travel_as_the_launch_wrote_them(monkeypatch) -> None:
    settings = AdapterSettings(k=12, chunk_tokens=128, retrieval_bytes_s=2e9,
                               kv_bytes_per_token=1024)  # fmt: skip
    launch = TempoKVLaunch(settings, trace_path="/tmp/t.jsonl", transport="record")
    monkeypatch.setenv(scheduler.ENV, launch.vllm_env()[scheduler.ENV])
    assert recorder.adapter_env() == wire.AdapterEnv(settings, "record", "/tmp/t.jsonl")
    raw = json.loads(launch.vllm_env()[scheduler.ENV])
    raw["adapter"]["chunk_token"] = raw["adapter"].pop("chunk_tokens")
    monkeypatch.setenv(scheduler.ENV, json.dumps(raw))
    with pytest.raises(wire.WireError) as err:
        recorder.adapter_env()
    assert str(err.value) == (
        "BSRKV_TEMPOKV.adapter: missing keys ['chunk_tokens'], unexpected keys ['chunk_token']"
    )
    monkeypatch.delenv(scheduler.ENV)
    assert recorder.adapter_env() == wire.AdapterEnv(None, "record", None)  # the recorder alone


def test_a_mutating_send_carries_the_control_token(monkeypatch) -> None:
    """tempokv.update is mutating: it carries the token a launched stack gives vLLM in
    $BSRKV_CONTROL_TOKEN; a read-only method carries none."""
    monkeypatch.setenv("BSRKV_CONTROL_TOKEN", "tok")
    client = Client()
    t = ServerModuleTransport([client], ServerModuleCallRequest)
    t.send("tempokv.update", {"order": []})
    t.send("tempokv.status", {})
    assert [json.loads(c.payload) for c in client.calls] == [
        {"order": [], "control_token": "tok"},
        {},
    ]
    monkeypatch.delenv("BSRKV_CONTROL_TOKEN")
    bare = Client()
    ServerModuleTransport([bare], ServerModuleCallRequest).send("tempokv.update", {"order": []})
    assert [json.loads(c.payload) for c in bare.calls] == [{"order": []}]


def test_the_trace_keeps_each_hits_token_count_and_the_server_gets_the_ids(
    tmp_path: Path,
) -> None:
    hit = wire.Hit(tuple(range(512)), "salt", "tiny", 1)
    update = wire.UpdateRequest(0.5, ("a",), (), ("a",), {"a": 1.0}, {"a": hit})
    client = Client()
    trace = tmp_path / "t.jsonl"
    sent(_adapter(client, trace), update)
    recs = [json.loads(x) for x in trace.read_text().splitlines()]
    (rec,) = [r for r in recs if r["kind"] != "guards"]  # the engine's guard failures
    assert rec["hits"] == {"a": {"tokens": 512, "cache_salt": "salt", "model_name": "tiny",
                                 "world_size": 1}}  # fmt: skip
    assert [json.loads(c.payload)["hits"]["a"]["token_ids"] for c in client.calls] == [
        list(range(512))
    ]
