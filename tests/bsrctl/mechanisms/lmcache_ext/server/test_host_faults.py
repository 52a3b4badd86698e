"""The server module never takes LMCache down: a failure of bsrctl's own part of a handler
(TempoKV's gate, hold, observation and release, the stock path's accounting, markers,
spans, the trace thread, status) is counted on the module's guard and the handler answers
exactly what LMCache's own module answers for the same request; a control method that
raises answers a FailedReply; nothing raises out of a handler or out of close(). Real
StorageManager, real built-in lookup module, stock path (W = 0)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from bsr_inprocess import C_BYTES, CHUNK, TOKEN, authed

from bsrctl.evidence.guards import GuardDelta, extensions_healthy
from bsrctl.prompts import prompt_ids
from bsrctl.stack.contracts.guards import LMCACHE, lmcache_guards
from bsrkv.lmcache_ext.bsr.protocol import FailedReply, StatusReply
from bsrkv.tempokv import wire
from bsrkv.trace import spans
from tests.bsrctl.mechanisms.lmcache_ext.server.test_tempokv_handlers import (
    configure,
    hit,
    key,
    states,
    turn_on,
    until,
    update,
)

N_CHUNKS = 4


class Direct:
    """The harness's bsr.* client, as far as reading guard failures goes: the handler's
    own JSON, read back as the client reads it."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def status(self) -> StatusReply:
        return StatusReply.from_json(json.loads(self.module.bsr_status(b"")))


def judged(module: Any, before: Any) -> tuple[str, str]:
    """``extensions_healthy`` over what the server's guards counted since ``before``."""
    delta = GuardDelta.over(LMCACHE, before, lmcache_guards(Direct(module)))
    c = extensions_healthy([delta])
    return str(c.verdict), c.detail


def degraded(*named: str) -> tuple[str, str]:
    return "FAIL", "extension degraded to stock: " + "; ".join(f"{LMCACHE}: {n}" for n in named)


def boom(*_a: Any, **_k: Any) -> Any:
    raise RuntimeError("injected")


def stock_answer(server, tokens: list[int], rid: str) -> int:
    """What LMCache's own lookup module answers for this prompt, alone."""
    server.lookup_mod.lookup(key(tokens, rid), 1)
    got = server.lookup_mod.wait_prefetch_status(rid, 10.0)
    server.lookup_mod.free_lookup_locks(key(tokens, rid), 1)  # no retrieve follows
    server.lookup_mod.end_session(rid)
    return int(got)


def module_answer(server, tokens: list[int], rid: str) -> int:
    """What the server module answers (vLLM asks again while it answers None)."""
    server.module.lookup(key(tokens, rid), 1)
    (got,) = until(f"{rid} answered", lambda: [
        g for g in [server.module.wait_prefetch_status(rid, 0.1)] if g is not None])  # fmt: skip
    server.module.free_lookup_locks(key(tokens, rid), 1)
    server.module.end_session(rid)
    return int(got)


@pytest.fixture
def seeded(bsr_sm_server):
    server = bsr_sm_server(64 * C_BYTES, window_chunks=0)
    tokens = prompt_ids("host-faults", N_CHUNKS * CHUNK, 1000)
    server.seed(tokens)
    return server, tokens


@pytest.mark.parametrize(
    ("policy", "target", "site"),
    [
        ("immediate", "begin_retrieval", "tempokv_gate"),  # the claim's grant
        ("immediate", "observe_stock", "tempokv_observe"),  # the provider seeing the read
        ("immediate", "stock_done", "stock_accounting"),  # the prefetch reported done
        ("demand", "wait_ready", "tempokv_hold"),  # a held lookup's wait: it goes on
        ("immediate", "end_session", "tempokv_ended"),  # the request's teardown
    ],
)
def test_a_failing_tempokv_hook_leaves_lmcaches_own_answer(
    seeded, monkeypatch: pytest.MonkeyPatch, policy: str, target: str, site: str
) -> None:
    server, tokens = seeded
    want = stock_answer(server, tokens, "stock")
    assert want == N_CHUNKS
    turn_on(server, policy)
    try:
        # a claim (its grant is WAIT under Demand: the lookup is held), then its lookup
        update(server, ["r"], {"r": hit(tokens)}, ["r"])
        if policy == "immediate":  # its staging done (a lookup beside it races its prefetch)
            until("r stage-ready", lambda: states(server).get("r") == "STAGEREADY")
        tempo = server.module.tempokv.live
        fault = boom
        if target == "wait_ready":  # fails once the staging it waited for is done: LMCache's
            # lookup beside a prefetch of the same keys still in flight answers 0 (its race)
            real = tempo.wait_ready

            def fault(rid: str, timeout_s: float) -> bool:
                real(rid, timeout_s)
                raise RuntimeError("injected")

        monkeypatch.setattr(tempo, target, fault)
        before = lmcache_guards(Direct(server.module))
        if target == "observe_stock":  # only an unclaimed lookup reads L2 itself
            got = module_answer(server, tokens, "unclaimed")
        else:
            got = module_answer(server, tokens, "r")
        assert got == want
        assert server.module._guard.counts() == {site: 1}
        assert judged(server.module, before) == degraded(
            f"bsrkv.lmcache_ext.server [{site}] RuntimeError x1"
        )
    finally:
        configure(server, None)


def test_the_stock_retrieve_and_store_keep_lmcaches_answer(
    bsr_sm_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bsrctl's books after LMCache's transfer (its release, outcome, markers, TempoKV's
    release, the span) cannot turn its answer into a failure."""
    server = bsr_sm_server(16 * C_BYTES, window_chunks=0)
    mod = server.module

    class Transfer:  # LMCache's transfer module, as far as these handlers call it
        def retrieve(self, *_a: Any) -> tuple[bytes, bool]:
            return b"event", True

        def store(self, *_a: Any) -> tuple[bytes, bool]:
            return b"stored", True

    monkeypatch.setattr(mod, "_transfer_mod", Transfer())
    monkeypatch.setattr(mod.tempokv, "retrieved", boom)
    for name in ("_stock_release", "_record_outcome", "_clear_marker"):
        monkeypatch.setattr(mod, name, boom)
    monkeypatch.setenv(spans.ENDPOINT_ENV, "unix:///nowhere")
    monkeypatch.setitem(spans._remote, "tracer", Raising())
    k = key([1] * CHUNK, "rq")
    before = lmcache_guards(Direct(mod))
    assert mod.retrieve(k, 0, [[0]], b"", 0) == (b"event", True)
    assert mod.store(k, 0, [[0]], b"") == (b"stored", True)
    assert mod._guard.counts() == {"tempokv_retrieved": 1, "stock_release": 1,
                                   "stock_books": 1, "clear_marker": 1}  # fmt: skip
    # every site, sorted, and the spans' guard beside the module's (the retrieve's span)
    assert judged(mod, before) == degraded(
        "bsrkv.lmcache_ext.server [clear_marker] RuntimeError x1",
        "bsrkv.lmcache_ext.server [stock_books] RuntimeError x1",
        "bsrkv.lmcache_ext.server [stock_release] RuntimeError x1",
        "bsrkv.lmcache_ext.server [tempokv_retrieved] RuntimeError x1",
        "bsrkv.trace.spans [span] RuntimeError x1",
    )


class Raising:
    """A tracer whose every span fails to start."""

    def start_as_current_span(self, *_a: Any, **_k: Any) -> Any:
        raise RuntimeError("tracer down")

    def start_span(self, *_a: Any, **_k: Any) -> Any:
        raise RuntimeError("tracer down")


class FailingExporter:
    """A span exporter that raises at every export and at shutdown."""

    def export(self, _spans: Any) -> Any:
        raise ConnectionError("collector gone")

    def shutdown(self) -> None:
        raise ConnectionError("collector gone")

    def force_flush(self, timeout_millis: int = 0) -> bool:
        raise ConnectionError("collector gone")


@pytest.mark.parametrize("broken", ["exporter", "tracer"])
def test_spans_that_fail_change_no_answer(seeded, monkeypatch: pytest.MonkeyPatch, broken) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    server, tokens = seeded
    turn_on(server, "immediate")
    try:
        want = update(server, ["a"], {"a": hit(tokens)}, ["a"])  # untraced
        monkeypatch.setenv(spans.ENDPOINT_ENV, "unix:///nowhere")
        if broken == "exporter":
            provider = TracerProvider(shutdown_on_exit=False)  # its exporter raises at exit
            provider.add_span_processor(SimpleSpanProcessor(FailingExporter()))
            monkeypatch.setitem(spans._remote, "provider", provider)
            monkeypatch.setitem(spans._remote, "tracer", provider.get_tracer("t"))
        else:
            monkeypatch.setitem(spans._remote, "tracer", Raising())
        before = spans.GUARD.counts().get("span", 0)
        got = update(server, ["b"], {"b": hit(tokens)}, ["a", "b"])
        assert got.hit_tokens == {"b": N_CHUNKS * CHUNK}
        assert (got.off, got.needs_ttu) == (want.off, want.needs_ttu)
        # the SDK swallows an exporter's failure itself; a tracer that cannot start a span
        # is counted here, and the span is lost
        assert spans.GUARD.counts().get("span", 0) - before == (broken == "tracer")
    finally:
        configure(server, None)
    server.module.close()  # the exporter's shutdown raises: counted, not raised
    if broken == "exporter":
        assert spans.GUARD.counts().get("shutdown", 0) >= 1


def test_a_tracer_that_cannot_be_made_is_the_no_op_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import opentelemetry.exporter.otlp.proto.grpc.trace_exporter as grpc_exporter

    monkeypatch.setenv(spans.ENDPOINT_ENV, "unix:///nowhere")
    monkeypatch.setattr(spans, "_remote", {})
    monkeypatch.setattr(grpc_exporter, "OTLPSpanExporter", boom)
    before = spans.GUARD.counts().get("tracer", 0)
    assert not spans.tracer_records(spans.server_tracer())
    assert not spans.tracer_records(spans.server_tracer())  # made once: no retry per call
    assert spans.GUARD.counts().get("tracer", 0) - before == 1
    with spans.server_span("s", {}):  # a block under it runs, its exceptions pass through
        pass
    with pytest.raises(KeyError), spans.server_span("s", {}):
        raise KeyError("the block's own")


def test_status_before_anything_registered_and_a_status_that_raises(
    bsr_sm_server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    server = bsr_sm_server(16 * C_BYTES, window_chunks=0)
    mod = server.module
    # nothing registered with the transfer module, no lookup yet, TempoKV never configured
    assert json.loads(mod.bsr_registration(b"")) == {"registrations": []}
    st = StatusReply.from_json(json.loads(mod.bsr_status(b"")))
    assert (st.last_probe, st.recent_outcomes, st.tracked_requests) == (None, (), 0)
    assert json.loads(mod.tempokv_status(b"")) == wire.OFF_STATUS
    counters = mod.report_status()["bsr"]["counters"]
    assert {k: n for k, n in counters.items() if not k.startswith("guard_trace_")} == {}
    # a status that raises: a FailedReply (and /status's page still answers), logged once
    monkeypatch.setattr(mod.gauge, "peak_bytes", boom)
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            got = FailedReply.from_json(json.loads(mod.bsr_status(b"")))
            assert got == FailedReply(False, "bsr.status", "handler", "RuntimeError: injected")
        assert mod.report_status() == {
            "bsr": {"error": "bsr.status failed (counted: guard_report_status)"}
        }
    tracebacks = [r for r in caplog.records if r.exc_info and "bsr.status" in r.getMessage()]
    assert len(tracebacks) == 1
    assert mod._guard.counts() == {"bsr.status": 3, "report_status": 1}
    # a mutating method that raises after admission answers the same way
    monkeypatch.setattr(mod.gauge, "reset", boom)
    got = FailedReply.from_json(json.loads(mod.bsr_reset_peak(authed(token=TOKEN))))
    assert got.method == "bsr.reset_peak"


def test_a_controller_that_raises_answers_turned_off(seeded, monkeypatch) -> None:
    server, tokens = seeded
    turn_on(server, "immediate")
    try:
        monkeypatch.setattr(server.module.tempokv.live, "update", boom)
        assert update(server, ["a"], {"a": hit(tokens)}, ["a"]) == wire.UpdateReply.turned_off()
        assert server.module._guard.counts() == {"tempokv_update": 1}
    finally:
        configure(server, None)


def test_close_never_raises(bsr_sm_server, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = bsr_sm_server(16 * C_BYTES, window_chunks=0).module
    monkeypatch.setattr(mod._stall, "stop", boom)
    mod.close()
    assert mod._guard.counts() == {"close_stall": 1}
    assert mod._probe_pool._shutdown and mod._trace_pool._shutdown  # the others still ran
