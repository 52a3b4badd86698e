"""TempoKV's controller and provider over LMCache's real StorageManager: a shaped FS L2
(O_DIRECT where allowed), the `retain` prefetch policy, LOCK prefetches as commitment,
read locks as pins. Checked: commitment stages and pins exactly the claim's bytes; the
budget refuses what does not fit and that claim takes the ordinary path at retrieval;
coalescing stages a shared object once; release drops every pin while the objects stay
in L1 for the stock lookup; protected bytes sampled never exceed the budget; every causal
policy runs; the oracle is refused with the reason."""

from __future__ import annotations

import time
from pathlib import Path

import lmcext_kv as kv
import pytest
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.config import (
    EvictionConfig,
    L1ManagerConfig,
    L1MemoryManagerConfig,
    StorageManagerConfig,
)
from lmcache.v1.distributed.l2_adapters.config import L2AdaptersConfig
from lmcache.v1.distributed.storage_manager import StorageManager

from bsrctl.stack.launch.extensions import odirect_allowed
from bsrkv.clock import VirtualClock
from bsrkv.lmcache_ext.bsr.storage import LMCacheRestoreStorage
from bsrkv.lmcache_ext.faults.adapter import BsrFaultL2AdapterConfig
from bsrkv.lmcache_ext.tempokv.device import LiveObject
from bsrkv.lmcache_ext.tempokv.live import LiveConfig, LiveTempo
from bsrkv.restore.types import RowId
from bsrkv.tempokv.claims import ClaimState
from bsrkv.tempokv.controller import RetrievalGrant
from bsrkv.tempokv.policies import CAUSAL_POLICIES

CHUNK = 64 * 1024
L1 = 16 * 1024 * 1024
ROW = RowId(rank=0, group=0)


@pytest.fixture
def sm(tmp_path: Path):
    base = tmp_path / "l2"
    inner = {"type": "bsr_fs", "base_path": str(base), "use_odirect": odirect_allowed(base)}
    shape = {"bandwidth_bytes_s": 64 * CHUNK, "latency_s": 0.005}  # 64 chunks/s
    cfg = BsrFaultL2AdapterConfig.from_dict(
        {"type": "bsr_fault", "name": f"tk-{tmp_path.name}", "inner": inner, "shape": shape}
    )
    manager = StorageManager(
        StorageManagerConfig(
            l1_manager_config=L1ManagerConfig(
                L1MemoryManagerConfig(size_in_bytes=L1, use_lazy=False)
            ),
            eviction_config=EvictionConfig("LRU"),
            l2_adapter_config=L2AdaptersConfig([cfg]),
            prefetch_policy="retain",
        )
    )
    yield manager
    manager.close()


def in_l2(sm: StorageManager, n: int, tag: str) -> list[ObjectKey]:
    """`n` chunk keys stored (through L1 into L2) and forgotten from L1: an L2-only hit."""
    keys = kv.make_keys(n, tag)
    kv.store(sm, keys, CHUNK)
    kv.forget(sm, keys)
    return keys


def objects(keys: list[ObjectKey]) -> list[LiveObject]:
    return [LiveObject(k.chunk_hash.hex(), ((ROW, k, CHUNK),)) for k in keys]


def live(sm: StorageManager, policy: str, budget_chunks: int) -> LiveTempo:
    storage = LMCacheRestoreStorage(sm, {0: kv.layout(CHUNK)})
    cfg = LiveConfig(
        policy=policy,
        capacity_bytes=L1,
        budget_bytes=budget_chunks * CHUNK,
        prior_bytes_s=64 * CHUNK,
        tick_s=0.02,
    )
    return LiveTempo(storage, cfg)


def until(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def stepped(sm: StorageManager, policy: str, budget_chunks: int) -> LiveTempo:
    """As `live`, on a virtual clock and with no loop thread: the test takes every loop
    pass (``step``) and moves the time, so nothing happens between its statements (the
    shaped L2's reads still take real time: a pass sees them done once they are)."""
    storage = LMCacheRestoreStorage(sm, {0: kv.layout(CHUNK)})
    cfg = LiveConfig(policy=policy, capacity_bytes=L1, budget_bytes=budget_chunks * CHUNK,
                     prior_bytes_s=64 * CHUNK, tick_s=0.02)  # fmt: skip
    return LiveTempo(storage, cfg, clock=VirtualClock(0.0), loop=False)


def step_until(t: LiveTempo, cond, timeout_s: float = 10.0) -> int:
    """Loop passes until `cond` holds (bounded in real time); how many it took."""
    deadline, passes = time.monotonic() + timeout_s, 0
    while True:
        t.step()
        passes += 1
        if cond():
            return passes
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def state(t: LiveTempo, cid: str) -> ClaimState:
    with t.lock:
        return t.controller.claims[cid].state


def test_commit_stage_pin_release_budget_and_fallback(sm) -> None:
    a, b, c = in_l2(sm, 4, "a"), in_l2(sm, 4, "b"), in_l2(sm, 2, "c")
    shared = a[:2]  # claim "ab" shares a's first two chunks
    t = live(sm, "immediate", budget_chunks=8)
    try:
        t.report("A", objects(a))
        t.report("AB", objects(shared + b[:2]))  # 2 new chunks: 6 protected in all
        until(lambda: state(t, "A") is ClaimState.STAGEREADY)
        until(lambda: state(t, "AB") is ClaimState.STAGEREADY)
        with t.lock:
            assert t.device.locked_bytes() == 6 * CHUNK  # shared chunks staged and pinned once
            staged = sum(r.size_bytes for r in t.device.stages)
        assert staged == 6 * CHUNK
        t.report("B", objects(b))  # 2 more unprotected chunks: 8 > budget? no: 6 + 2 = 8
        until(lambda: state(t, "B") is ClaimState.STAGEREADY)
        t.report("C", objects(c))  # 8 + 2 > 8: refused for lack of budget, stays PLANNED
        with t.lock:
            claim_c = t.controller.claims["C"]
        until(lambda: claim_c.capacity_refusals >= 3)  # re-evaluated (ticks): still refused
        assert state(t, "C") is ClaimState.PLANNED
        assert t.begin_retrieval("C") is RetrievalGrant.ORDINARY  # the ordinary path
        assert t.begin_retrieval("A") is RetrievalGrant.READY
        t.end_retrieval("A")
        with t.lock:
            assert t.device.locked_bytes() == 6 * CHUNK  # a[:2] still protected by AB
        for cid in ("AB", "B"):
            assert t.begin_retrieval(cid) is RetrievalGrant.READY
            t.end_retrieval(cid)
        with t.lock:
            assert t.device.locked_bytes() == 0  # every pin dropped
        # unpinned, the staged objects stay in L1 (retain): the stock lookup finds them
        got = kv.prefetch(sm, a + b, CHUNK)
        assert got.l1_hits == list(range(8)) and got.exact == list(range(8))
        report = t.report_json()
    finally:
        t.close()
    assert report["peak_locked_bytes"] <= 8 * CHUNK  # protected bytes sampled ≤ budget
    assert report["peak_reserved_bytes"] <= 8 * CHUNK
    assert report["deferred_claims"] == 1
    assert report["retrievals"] == {"C": "ORDINARY", "A": "READY", "AB": "READY", "B": "READY"}
    assert report["c_byte_s"] > 0
    assert {r["claim"] for r in report["ttr"]} == {"A", "AB", "B"}
    assert all(r["stage_ready_s"] is not None for r in report["ttr"])


@pytest.mark.parametrize("policy", CAUSAL_POLICIES)
def test_every_causal_policy_commits_on_the_real_store(sm, policy: str) -> None:
    keys = in_l2(sm, 3, f"p-{policy}")
    t = stepped(sm, policy, budget_chunks=4)
    try:
        t.report("R", objects(keys))
        # the runtime says: head of the queue, use in 0 s (timed policies commit at L ≤ 0)
        t.update(["R"], {"R": 0.0})
        committed = "demand" != policy  # Demand commits at the retrieval
        assert state(t, "R") is (ClaimState.STAGING if committed else ClaimState.PLANNED)
        # no loop pass yet, so no prefetch seen done: committed and staging, it waits
        assert t.begin_retrieval("R") is RetrievalGrant.WAIT
        assert state(t, "R") is ClaimState.STAGING and not t.wait_ready("R", 0.0)
        step_until(t, lambda: t.wait_ready("R", 0.0))
        assert state(t, "R") is ClaimState.STAGEREADY
        with t.lock:
            assert t.device.locked_bytes() == 3 * CHUNK
        t.end_retrieval("R")
        with t.lock:
            assert t.device.locked_bytes() == 0
    finally:
        t.close()


def test_oracle_is_refused_live() -> None:
    with pytest.raises(ValueError, match="config.policy: 'oracle'.*simulation only"):
        LiveConfig.from_json({"policy": "oracle"})
    with pytest.raises(ValueError, match=r"unknown fields \['budget'\]"):
        LiveConfig.from_json({"budget": 1})


def test_ttu_at_commit_and_time_to_retrieval_are_reported(sm) -> None:
    """Each commitment records the claim's TTU then (None when the runtime sent none, as
    for Immediate) and when retrieval was later demanded: the TTU error in the evidence."""
    r_keys, s_keys = in_l2(sm, 2, "ttu-r"), in_l2(sm, 2, "ttu-s")
    t = stepped(sm, "tempokv", budget_chunks=4)
    try:
        t.report("R", objects(r_keys))
        t.update(["R"], {"R": 0.0})  # use now: TTU 0 ≤ TTR, committed at once
        assert state(t, "R") is ClaimState.STAGING
        with t.lock:
            t.clock.advance(0.25)  # retrieval demanded 0.25 s (virtual) after the commit
        assert t.begin_retrieval("R") is RetrievalGrant.WAIT  # no pass saw its prefetch
        with t.lock:
            t_commit, _est, ttu = t.provider.ttr_at_commit["R"]
            used = t.retrieval_at["R"]
        report = t.report_json()
    finally:
        t.close()
    imm = stepped(sm, "immediate", budget_chunks=4)
    try:
        imm.report("S", objects(s_keys))
        assert state(imm, "S") is ClaimState.STAGING
        no_ttu = imm.report_json()["ttr"]
    finally:
        imm.close()
    (row,) = report["ttr"]
    assert (t_commit, ttu, used) == (0.0, 0.0, 0.25)  # committed at the update, TTU 0 then
    assert (row["ttu_est_s"], row["retrieval_s"]) == (0.0, 0.25)
    assert [(r["claim"], r["ttu_est_s"], r["retrieval_s"]) for r in no_ttu] == [("S", None, None)]
