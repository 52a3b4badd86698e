"""The tempokv.* methods and retrieval hooks of the real server module (in process, real
StorageManager, stock path W = 0): a claim reported by the runtime adapter's message is
found by this server's own keys and probe; Immediate stages and pins it, the lookup finds
it in L1 (READY), the retrieve ends its protection; under Demand the lookup is held
(status "not yet") until the staging committed at retrieval is ready; end_session cancels
an open claim; TempoKV off answers without claims."""

from __future__ import annotations

import json
import time

from bsr_inprocess import C_BYTES, CHUNK, MODEL
from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey

from bsrctl.prompts import prompt_ids
from bsrctl.tempokv.kv import Manifest

N_CHUNKS = 4


def call(server, method: str, payload: dict) -> dict:
    handler = {
        "tempokv.configure": server.module.tempokv_configure,
        "tempokv.update": server.module.tempokv_update,
        "tempokv.status": server.module.tempokv_status,
    }[method]
    return json.loads(handler(json.dumps(payload).encode()))


def hit(tokens: list[int]) -> dict:
    return {"token_ids": tokens, "model_name": MODEL, "world_size": 1, "cache_salt": ""}


def until(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def states(server) -> dict[str, str]:
    claims = call(server, "tempokv.status", {})["claims"]
    return {cid: trace[-1][1] for cid, trace in claims.items()}


def configure(server, policy: str) -> None:
    got = call(server, "tempokv.configure", {
        "policy": policy, "capacity_bytes": 64 * C_BYTES, "budget_bytes": 8 * C_BYTES,
        "prior_bytes_s": 1000 * C_BYTES, "tick_s": 0.02, "chunk_tokens": CHUNK,
    })  # fmt: skip
    assert got["ok"], got


def test_immediate_claim_staged_found_by_lookup_and_released(bsr_sm_server) -> None:
    server = bsr_sm_server(64 * C_BYTES, window_chunks=0)
    tokens = prompt_ids("tk-imm", N_CHUNKS * CHUNK, 1000)
    server.seed(tokens)
    configure(server, "immediate")
    try:
        reply = call(server, "tempokv.update",
                     {"report": ["r1"], "hits": {"r1": hit(tokens)}, "order": ["r1"]})  # fmt: skip
        assert reply["hit_tokens"] == {"r1": N_CHUNKS * CHUNK}
        until(lambda: states(server).get("r1") == "STAGEREADY")
        status = call(server, "tempokv.status", {})
        assert status["locked_bytes_now"] == N_CHUNKS * C_BYTES  # pinned in L1
        assert server.l1_used() >= N_CHUNKS * C_BYTES
        assert server.lookup(tokens, "r1") == N_CHUNKS  # the stock lookup finds it
        server.module._tempo_retrieved("r1")  # what retrieve() calls after the transfer
        status = call(server, "tempokv.status", {})
        assert status["claims"]["r1"][-1][1] == "RELEASED"
        assert status["retrievals"] == {"r1": "READY"}
        assert status["locked_bytes_now"] == 0
        assert status["peak_locked_bytes"] <= status["budget_bytes"]
        assert [r["claim"] for r in status["ttr"]] == ["r1"]
        assert status["observed_stock_reads"]["count"] == 0  # READY: TempoKV's objects
        server.module.end_session("r1")
    finally:
        call(server, "tempokv.configure", {"policy": None})


def test_demand_holds_the_lookup_until_stage_ready(bsr_sm_server) -> None:
    server = bsr_sm_server(64 * C_BYTES, window_chunks=0)
    tokens = prompt_ids("tk-dem", N_CHUNKS * CHUNK, 1000)
    server.seed(tokens)
    configure(server, "demand")
    try:
        call(server, "tempokv.update",
             {"report": ["r2"], "hits": {"r2": hit(tokens)}, "order": ["r2"]})  # fmt: skip
        time.sleep(0.1)
        assert states(server)["r2"] == "PLANNED"  # Demand never commits ahead
        server.module.lookup(key(tokens, "r2"), 1)  # retrieval demanded: commits now, lookup held
        got = None
        deadline = time.monotonic() + 10
        while got is None and time.monotonic() < deadline:
            got = server.module.query_prefetch_status("r2")
            time.sleep(0.01)
        assert got == N_CHUNKS
        status = call(server, "tempokv.status", {})
        assert status["retrievals"] == {"r2": "WAIT"}
        trace = [s for _, s in status["claims"]["r2"]]
        assert trace == ["PLANNED", "STAGING", "STAGEREADY"]
        server.module.end_session("r2")  # no retrieve came: the claim is cancelled
        status = call(server, "tempokv.status", {})
        assert status["claims"]["r2"][-1][1] == "CANCELLED"
        assert status["locked_bytes_now"] == 0
    finally:
        call(server, "tempokv.configure", {"policy": None})


def test_off_and_bad_config(bsr_sm_server) -> None:
    server = bsr_sm_server(16 * C_BYTES, window_chunks=0)
    assert call(server, "tempokv.update", {"report": ["x"], "order": ["x"]})["off"] is True
    bad = call(server, "tempokv.configure", {"policy": "oracle"})
    assert bad["ok"] is False and "simulation only" in bad["error"]


def test_an_unclaimed_stock_lookup_is_observed_until_its_prefetch_is_done(bsr_sm_server) -> None:
    server = bsr_sm_server(64 * C_BYTES, window_chunks=0)
    tokens = prompt_ids("tk-stock", N_CHUNKS * CHUNK, 1000)
    server.seed(tokens)
    configure(server, "demand")
    try:
        tempo = server.module._tempo
        with tempo.lock:  # the lookup registers its read; no prefetch status asked yet
            server.module.lookup(key(tokens, "u1"), 1)
            (view,) = tempo.provider.ttr_query(Manifest(())).ops
            assert (view.running, view.staging) == (True, False)
            assert tempo.provider.queue_bytes() == N_CHUNKS * C_BYTES
        assert server.module.wait_prefetch_status("u1", 10.0) == N_CHUNKS  # the stock read
        seen = call(server, "tempokv.status", {})["observed_stock_reads"]
        assert (seen["count"], seen["bytes"], seen["outcomes"]) == (1, N_CHUNKS * C_BYTES,
                                                                    {"done": 1})  # fmt: skip
        (r,) = seen["reads"]
        assert (r["request"], r["read"], r["claimed"], r["objects"], r["chunks_found"]) == (
            "u1", "stock:u1", False, N_CHUNKS, N_CHUNKS)  # fmt: skip
        assert r["start_s"] <= r["done_s"] and r["end_s"] is None
        with tempo.lock:
            assert tempo.provider.queue_bytes() == 0
            resident = [tempo.provider.tier.is_resident(o) for o in tempo.device.objects]
        assert resident == [True] * N_CHUNKS  # in L1 now: the provider's tier knows
        server.module.end_session("u1")
        seen = call(server, "tempokv.status", {})["observed_stock_reads"]
        assert seen["outcomes"] == {"done": 1} and seen["reads"][0]["end_s"] is not None
    finally:
        call(server, "tempokv.configure", {"policy": None})


def test_a_stock_lookup_ended_before_its_prefetch_leaves_nothing_queued(bsr_sm_server) -> None:
    server = bsr_sm_server(64 * C_BYTES, window_chunks=0)
    tokens = prompt_ids("tk-stock-end", N_CHUNKS * CHUNK, 1000)
    server.seed(tokens)
    configure(server, "demand")
    try:
        tempo = server.module._tempo
        with tempo.lock:
            server.module.lookup(key(tokens, "u2"), 1)
            server.module.end_session("u2")  # torn down before any status was asked
            assert tempo.provider.queue_bytes() == 0
            assert tempo.provider.tier.inflight_bytes == 0
        seen = call(server, "tempokv.status", {})["observed_stock_reads"]
        assert (seen["count"], seen["outcomes"]) == (1, {"dropped": 1})
    finally:
        call(server, "tempokv.configure", {"policy": None})


def key(tokens: list[int], rid: str) -> IPCCacheServerKey:
    return IPCCacheServerKey(MODEL, 1, None, tuple(tokens), 0, len(tokens), rid,
                             num_kv_readers=1)  # fmt: skip
