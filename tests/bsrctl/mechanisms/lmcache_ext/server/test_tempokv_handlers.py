"""The tempokv.* methods and retrieval hooks of the real server module (in process, real
StorageManager, stock path W = 0): a claim reported by the runtime adapter's message is
found by this server's own keys and probe; Immediate stages and pins it, the lookup finds
it in L1 (READY), the retrieve ends its protection; under Demand the lookup is held
(status "not yet") until the staging committed at retrieval is ready; end_session cancels
an open claim; TempoKV off answers without claims. Every payload is a record of the
TempoKV wire, and the handlers read theirs with from_json (a renamed key is refused).
Waits on the server's own threads poll with a bound and fail naming what they waited for."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from bsr_inprocess import C_BYTES, CHUNK, MODEL, TOKEN
from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey

from bsrctl.prompts import prompt_ids
from bsrkv.control_token import sealed
from bsrkv.lmcache_ext.bsr.protocol import FailedReply
from bsrkv.lmcache_ext.server.hooks import NO_TEMPOKV
from bsrkv.lmcache_ext.tempokv.component import TempoKVComponent
from bsrkv.tempokv import wire
from bsrkv.tempokv.kv import Manifest

N_CHUNKS = 4


def call(server, method: str, payload: dict) -> dict:
    handler = {
        "tempokv.configure": server.module.tempokv_configure,
        "tempokv.update": server.module.tempokv_update,
        "tempokv.status": server.module.tempokv_status,
    }[method]
    return json.loads(handler(json.dumps(sealed(method, payload, TOKEN)).encode()))


def hit(tokens: list[int]) -> wire.Hit:
    return wire.Hit(tuple(tokens), "", MODEL, 1)


def update(server, report=(), hits=None, order=(), cancel=()) -> wire.UpdateReply:
    req = wire.UpdateRequest(0.0, tuple(report), tuple(cancel), tuple(order), {}, hits or {})
    return wire.UpdateReply.from_json(call(server, "tempokv.update", req.to_json()))


def status(server) -> wire.StatusReply:
    got = wire.status_from_json(call(server, "tempokv.status", {}))
    assert got is not None, "tempokv is off"
    return got


def until(what: str, cond: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    """Poll ``cond`` until it returns a true value (returned), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (got := cond()):
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.005)
    return got


def states(server) -> dict[str, str]:
    return {cid: trace[-1][1] for cid, trace in status(server).claims.items()}


def config(policy: str, chunk_tokens: int = CHUNK, tier: str = "l2") -> wire.TempoConfig:
    return wire.TempoConfig(policy, 64 * C_BYTES, 8 * C_BYTES, 1, 1000.0 * C_BYTES, 0.0, None,
                            0.02, chunk_tokens, tier)  # fmt: skip


def configure(server, cfg: wire.TempoConfig | None) -> wire.ConfigureReply:
    raw = call(server, "tempokv.configure", wire.ConfigureRequest(cfg).to_json())
    return wire.ConfigureReply.from_json(raw)


def turn_on(server, policy: str) -> None:
    got = configure(server, config(policy))
    assert got == wire.ConfigureReply(True, config(policy), None), got


def test_immediate_claim_staged_found_by_lookup_and_released(bsr_sm_server) -> None:
    server = bsr_sm_server(64 * C_BYTES, window_chunks=0)
    tokens = prompt_ids("tk-imm", N_CHUNKS * CHUNK, 1000)
    server.seed(tokens)
    turn_on(server, "immediate")
    try:
        reply = update(server, ["r1"], {"r1": hit(tokens)}, ["r1"])
        assert reply == wire.UpdateReply({"r1": N_CHUNKS * CHUNK}, {"r1": reply.eta_s["r1"]},
                                         False, False, None)  # fmt: skip
        until("r1 stage-ready", lambda: states(server).get("r1") == "STAGEREADY")
        st = status(server)
        assert st.locked_bytes_now == N_CHUNKS * C_BYTES  # pinned in L1
        assert server.l1_used() >= N_CHUNKS * C_BYTES
        assert server.lookup(tokens, "r1") == N_CHUNKS  # the stock lookup finds it
        server.module.tempokv.retrieved("r1", None)  # what retrieve() calls after the transfer
        # protection ends on TempoKV's loop, after the retrieve's reply (woken at once)
        until("r1 released", lambda: states(server).get("r1") == "RELEASED")
        st = status(server)
        assert st.retrievals == {"r1": "READY"}
        assert st.locked_bytes_now == 0
        assert st.peak_locked_bytes <= st.budget_bytes
        assert [r.claim for r in st.ttr] == ["r1"]
        assert st.observed_stock_reads.count == 0  # READY: TempoKV's objects
        server.module.end_session("r1")
    finally:
        configure(server, None)


def test_demand_holds_the_lookup_until_stage_ready(bsr_sm_server) -> None:
    server = bsr_sm_server(64 * C_BYTES, window_chunks=0)
    tokens = prompt_ids("tk-dem", N_CHUNKS * CHUNK, 1000)
    server.seed(tokens)
    turn_on(server, "demand")
    try:
        update(server, ["r2"], {"r2": hit(tokens)}, ["r2"])
        tempo = server.module.tempokv.live
        reported = tempo.clock.now()
        # the loop has run the controller's ticks (0.02 s) for 0.1 s after the report: it
        # sampled (one pass: events due run first) at least that long after
        until("five ticks after the report", lambda: tempo.samples.at_s[-1] >= reported + 0.1)
        assert states(server)["r2"] == "PLANNED"  # Demand never commits ahead
        server.module.lookup(key(tokens, "r2"), 1)  # retrieval demanded: commits now, lookup held
        got = until("r2's held lookup answered", lambda: server.module.query_prefetch_status("r2"))
        assert got == N_CHUNKS
        st = status(server)
        assert st.retrievals == {"r2": "WAIT"}
        trace = [s for _, s in st.claims["r2"]]
        assert trace == ["PLANNED", "STAGING", "STAGEREADY"]
        server.module.end_session("r2")  # no retrieve came: the claim is cancelled
        st = status(server)
        assert st.claims["r2"][-1][1] == "CANCELLED"
        assert st.locked_bytes_now == 0
    finally:
        configure(server, None)


def test_off_and_bad_config(bsr_sm_server) -> None:
    server = bsr_sm_server(16 * C_BYTES, window_chunks=0)
    assert update(server, ["x"], {}, ["x"]) == wire.UpdateReply.turned_off()
    assert call(server, "tempokv.status", {}) == wire.OFF_STATUS
    bad = configure(server, config("oracle"))
    assert (bad.ok, bad.config) == (False, None) and "simulation only" in (bad.error or "")
    assert server.module.tempokv.live is None


def test_the_factory_composes_tempokv_a_module_without_it_answers_off(
    bsr_sm_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = bsr_sm_server(64 * C_BYTES, window_chunks=0)
    assert type(server.module.tempokv) is TempoKVComponent
    monkeypatch.setattr(server.module, "tempokv", NO_TEMPOKV)  # as BsrServerModule(ctx) holds
    assert call(server, "tempokv.status", {}) == wire.OFF_STATUS
    assert update(server, ["x"], {}, ["x"]) == wire.UpdateReply.turned_off()
    got = configure(server, config("immediate"))
    assert got == wire.ConfigureReply(
        False, None, "TempoKV is not composed into this server module"
    )
    tokens = prompt_ids("tk-none", N_CHUNKS * CHUNK, 1000)
    server.seed(tokens)
    assert server.lookup(tokens, "r") == N_CHUNKS  # the stock lookup, nothing held


def test_a_config_for_another_chunk_size_is_refused_naming_both(bsr_sm_server) -> None:
    server = bsr_sm_server(16 * C_BYTES, window_chunks=0)
    got = configure(server, config("immediate", chunk_tokens=4 * CHUNK))
    assert got == wire.ConfigureReply(
        False, None,
        f"config.chunk_tokens {4 * CHUNK} is not this server's chunk size {CHUNK} "
        "(--chunk-size): the claims' objects would be the wrong chunks",
    )  # fmt: skip
    assert server.module.tempokv.live is None


@pytest.mark.parametrize(
    ("method", "payload", "key"),
    [
        ("tempokv.update", wire.UpdateRequest(0.0, (), (), ("x",), {}, {}).to_json(), "order"),
        ("tempokv.configure", wire.ConfigureRequest(None).to_json(), "config"),
    ],
)
def test_the_handlers_refuse_a_renamed_key_naming_it(bsr_sm_server, method, payload, key):
    server = bsr_sm_server(16 * C_BYTES, window_chunks=0)
    payload = {**payload, f"{key}_renamed": payload[key]}
    del payload[key]
    want = f"{method}: missing keys ['{key}'], unexpected keys ['{key}_renamed']"
    if method == "tempokv.update":  # a failure reply (vLLM's adapter counts an error), counted
        got = FailedReply.from_json(call(server, method, payload))
        assert got == FailedReply(False, method, "handler", f"WireError: {want}")
        assert server.module._guard.counts() == {method: 1}
    else:
        assert configure_raw(server, payload) == wire.ConfigureReply(False, None, want)


def configure_raw(server, payload: dict) -> wire.ConfigureReply:
    return wire.ConfigureReply.from_json(call(server, "tempokv.configure", payload))


def test_status_goes_out_through_the_record(bsr_sm_server) -> None:
    server = bsr_sm_server(64 * C_BYTES, window_chunks=0)
    turn_on(server, "immediate")
    try:
        raw = call(server, "tempokv.status", {})
        st = wire.StatusReply.from_json(raw)
        assert st.to_json() == raw and list(raw) == sorted(raw)  # every key, sorted as sent
        assert (st.policy, st.timed, st.budget_bytes, st.claims, st.reports_dropped) == (
            "immediate", False, 8 * C_BYTES, {}, {})  # fmt: skip
    finally:
        configure(server, None)


def test_an_unclaimed_stock_lookup_is_observed_until_its_prefetch_is_done(bsr_sm_server) -> None:
    server = bsr_sm_server(64 * C_BYTES, window_chunks=0)
    tokens = prompt_ids("tk-stock", N_CHUNKS * CHUNK, 1000)
    server.seed(tokens)
    turn_on(server, "demand")
    try:
        tempo = server.module.tempokv.live
        with tempo.lock:  # the lookup registers its read; no prefetch status asked yet
            server.module.lookup(key(tokens, "u1"), 1)
            (view,) = tempo.provider.ttr_query(Manifest(())).ops
            assert (view.running, view.staging) == (True, False)
            assert tempo.provider.queue_bytes() == N_CHUNKS * C_BYTES
        assert server.module.wait_prefetch_status("u1", 10.0) == N_CHUNKS  # the stock read
        seen = status(server).observed_stock_reads
        assert (seen.count, seen.bytes, seen.outcomes) == (1, N_CHUNKS * C_BYTES, {"done": 1})
        (r,) = seen.reads
        assert (r.request, r.read, r.claimed, r.objects, r.chunks_found) == (
            "u1", "stock:u1", False, N_CHUNKS, N_CHUNKS)  # fmt: skip
        assert r.done_s is not None and r.start_s <= r.done_s and r.end_s is None
        with tempo.lock:
            assert tempo.provider.queue_bytes() == 0
            resident = [tempo.provider.tier.is_resident(o) for o in tempo.device.objects]
        assert resident == [True] * N_CHUNKS  # in L1 now: the provider's tier knows
        server.module.end_session("u1")
        seen = status(server).observed_stock_reads
        assert seen.outcomes == {"done": 1} and seen.reads[0].end_s is not None
    finally:
        configure(server, None)


def test_a_stock_lookup_ended_before_its_prefetch_leaves_nothing_queued(bsr_sm_server) -> None:
    server = bsr_sm_server(64 * C_BYTES, window_chunks=0)
    tokens = prompt_ids("tk-stock-end", N_CHUNKS * CHUNK, 1000)
    server.seed(tokens)
    turn_on(server, "demand")
    try:
        tempo = server.module.tempokv.live
        with tempo.lock:
            server.module.lookup(key(tokens, "u2"), 1)
            server.module.end_session("u2")  # torn down before any status was asked
            assert tempo.provider.queue_bytes() == 0
            assert tempo.provider.tier.inflight_bytes == 0
        seen = status(server).observed_stock_reads
        assert (seen.count, seen.outcomes) == (1, {"dropped": 1})
    finally:
        configure(server, None)


def key(tokens: list[int], rid: str) -> IPCCacheServerKey:
    return IPCCacheServerKey(MODEL, 1, None, tuple(tokens), 0, len(tokens), rid,
                             num_kv_readers=1)  # fmt: skip


def test_on_the_flash_tier_a_held_lookups_lmcache_lookup_runs_at_once(bsr_sm_server) -> None:
    """With L1 a Device-DAX arena (every document an L1 hit), LMCache's own lookup of a held
    request runs when the hold begins, beside its staging (it reads no byte): while the
    staging runs the status stays "not yet", and the release has only the answer to give."""
    import threading

    server = bsr_sm_server(64 * C_BYTES, devdax=True, window_chunks=0)
    tokens = prompt_ids("tk-dax", N_CHUNKS * CHUNK, 1000)
    server.store(tokens)  # the documents live in the arena
    got = configure(server, config("demand", tier="dax"))
    assert got.ok, got
    try:
        device = server.module.tempokv.live.device
        staged, load = threading.Event(), device._load

        def held_load(op):  # the staging thread waits for the test before its mlocks
            assert staged.wait(20.0)
            return load(op)

        device._load = held_load
        update(server, ["d1"], {"d1": hit(tokens)}, ["d1"])
        server.module.lookup(key(tokens, "d1"), 1)  # retrieval demanded: commits, holds
        assert server.module._counters["lookups_stock"] == 1  # LMCache's lookup already ran
        assert server.module.query_prefetch_status("d1") is None  # held: "not yet"
        assert states(server)["d1"] == "STAGING"
        staged.set()
        got = until("d1's held lookup answered", lambda: server.module.query_prefetch_status("d1"))
        assert got == N_CHUNKS
        assert server.module._counters["lookups_stock"] == 1  # the release looked up nothing
        st = status(server)
        assert st.retrievals == {"d1": "WAIT"}
        assert [s for _, s in st.claims["d1"]] == ["PLANNED", "STAGING", "STAGEREADY"]
        assert st.locked_bytes_now == N_CHUNKS * C_BYTES  # mlocked in the arena until its retrieve
        server.module.tempokv.retrieved("d1", 0)
        until("d1 released", lambda: states(server).get("d1") == "RELEASED")
        assert status(server).locked_bytes_now == 0
        server.module.end_session("d1")
    finally:
        configure(server, None)
