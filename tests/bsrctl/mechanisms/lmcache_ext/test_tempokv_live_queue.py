"""TempoKV's provider over LMCache's real StorageManager, the stock lookup's own L2 reads:
an unclaimed stock read is in the queue view and lengthens TTR, one never reported done
is removed at end_session, a claim that joined it is staged by the device, a stock read
pins in the model but holds no lock of TempoKV; the device progress is the shaped L2's
FIFO schedule."""

from __future__ import annotations

import lmcext_kv as kv
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lmcache.v1.distributed.storage_manager import StorageManager

from bsrkv.clock import VirtualClock
from bsrkv.lmcache_ext.bsr.storage import LMCacheRestoreStorage
from bsrkv.lmcache_ext.tempokv.live import LiveConfig, LiveTempo
from bsrkv.tempokv.claims import ClaimState
from bsrkv.tempokv.controller import RetrievalGrant
from bsrkv.tempokv.kv import Manifest
from bsrkv.tempokv.ttr import OpView, project_finish_s
from tests.bsrctl.mechanisms.lmcache_ext import test_tempokv_live as commit
from tests.bsrctl.mechanisms.lmcache_ext.test_tempokv_live import (
    CHUNK,
    L1,
    in_l2,
    live,
    objects,
    state,
    step_until,
    stepped,
    until,
)

sm = commit.sm  # its fixture


# ---- the stock lookup's own L2 reads, observed by the provider ----------------------------


def virtual(sm: StorageManager, policy: str, budget_chunks: int) -> LiveTempo:
    """As `live`, on a virtual clock that never moves: an observed op's remaining bytes are
    its size, so the TTR estimates are exact."""
    storage = LMCacheRestoreStorage(sm, {0: kv.layout(CHUNK)})
    cfg = LiveConfig(policy=policy, capacity_bytes=L1, budget_bytes=budget_chunks * CHUNK,
                     prior_bytes_s=64 * CHUNK, tick_s=0.02)  # fmt: skip
    return LiveTempo(storage, cfg, clock=VirtualClock(0.0))


def queue(t: LiveTempo) -> tuple[OpView, ...]:
    with t.lock:
        return t.provider.ttr_query(Manifest(())).ops


def test_an_unclaimed_stock_read_is_in_the_queue_view_and_lengthens_ttr(sm) -> None:
    a, b = in_l2(sm, 4, "sv-a"), in_l2(sm, 3, "sv-b")
    t = stepped(sm, "demand", budget_chunks=8)
    try:
        sr = t.observe_stock("s1", objects(b))
        assert sr is not None and (sr.read_id, sr.claimed, sr.objects) == ("stock:s1", False, 3)
        # exactly one ordinary op of the lookup's 3 chunks; the device does not read it
        assert queue(t) == (OpView(3 * CHUNK, running=True, staging=False),)
        with t.lock:
            assert t.provider.queue_bytes() == t.provider.tier.inflight_bytes == 3 * CHUNK
        for _ in range(10):
            t.step()  # loop passes: the device does not read an observed op
        assert t.device.stages == [] and t.device.locked_bytes() == 0
        t.report("A", objects(a))
        assert state(t, "A") is ClaimState.PLANNED  # Demand: commits at retrieval only
        assert t.begin_retrieval("A") is RetrievalGrant.WAIT
        est = t.provider.ttr_at_commit["A"][1]
        rate = t.provider.rate.aggregate_bytes_s
        with_read = project_finish_s(
            (OpView(3 * CHUNK, True, False), OpView(4 * CHUNK, False)), 1, rate
        )[1]
        alone = project_finish_s((OpView(4 * CHUNK, False),), 1, rate)[0]
        assert est == with_read  # A shares the device with the stock read while it runs
        assert alone == 4 * CHUNK / (64 * CHUNK)
        assert est - alone == pytest.approx(3 * CHUNK / (64 * CHUNK), abs=1e-12)  # its share
        step_until(t, lambda: t.wait_ready("A", 0.0))
        # the lookup's prefetch reported done: the op completes, its objects are resident
        t.stock_done("s1", 3)
        assert queue(t) == ()
        with t.lock:
            assert all(t.provider.tier.is_resident(o.object_id) for o in objects(b))
            assert t.provider.tier.inflight_bytes == 0
        # a later claim on the same document counts them resident: ready at commit, TTR 0
        t.report("B", objects(b))
        assert t.begin_retrieval("B") is RetrievalGrant.READY
        assert t.provider.ttr_at_commit["B"][1] == 0.0
        with t.lock:  # the read pins what it read until its retrieve
            assert t.provider.tier.pins == {o.object_id: 1 for o in objects(b)}
        t.end_retrieval("s1", 0)  # its retrieve: the read ends, and its pins
        with t.lock:
            assert t.provider.tier.pins == {}
        seen = t.stock_json()
    finally:
        t.close()
    assert (seen["count"], seen["bytes"], seen["outcomes"]) == (1, 3 * CHUNK, {"done": 1})
    (r,) = seen["reads"]
    assert (r["request"], r["ops"], r["objects"], r["chunks_found"]) == ("s1", [0], 3, 3)
    assert r["start_s"] == r["done_s"] == r["end_s"] == 0.0  # the virtual clock's


def test_a_stock_read_never_reported_done_is_removed_at_end_session(sm) -> None:
    c = in_l2(sm, 2, "sv-c")
    t = virtual(sm, "demand", budget_chunks=8)
    try:
        t.observe_stock("s2", objects(c))
        assert queue(t) == (OpView(2 * CHUNK, True, False),)
        t.end_session("s2")
        assert queue(t) == ()
        with t.lock:
            assert t.provider.tier.inflight_bytes == 0
            assert not any(t.provider.tier.is_resident(o.object_id) for o in objects(c))
        t.stock_done("s2", 2)  # a late report changes nothing
        assert queue(t) == ()
        seen = t.stock_json()
    finally:
        t.close()
    assert seen["outcomes"] == {"dropped": 1} and seen["reads"][0]["done_s"] is None


def test_a_commitment_that_joined_an_abandoned_stock_read_is_staged_by_the_device(sm) -> None:
    c = in_l2(sm, 2, "sv-j")
    t = live(sm, "immediate", budget_chunks=8)
    try:
        with t.lock:  # the read first, then the claim: it joins the read's op
            t.observe_stock("s3", objects(c))
            t.report("J", objects(c))
            assert state(t, "J") is ClaimState.STAGING
            assert len(queue(t)) == 1
        t.end_session("s3")  # no done came: the device reads it for J
        until(lambda: state(t, "J") is ClaimState.STAGEREADY)
        with t.lock:
            assert t.device.locked_bytes() == 2 * CHUNK
            assert [s.size_bytes for s in t.device.stages] == [2 * CHUNK]
        assert t.stock_json()["outcomes"] == {"adopted": 1}
    finally:
        t.close()


def test_a_claim_granted_ordinary_reads_as_itself(sm) -> None:
    d = in_l2(sm, 4, "sv-d")
    t = virtual(sm, "demand", budget_chunks=2)  # 4 chunks never fit: ORDINARY
    try:
        t.report("D", objects(d))
        assert t.begin_retrieval("D") is RetrievalGrant.ORDINARY
        sr = t.observe_stock("D", objects(d))
        assert sr is not None and (sr.read_id, sr.claimed, sr.size_bytes) == ("D", True, 4 * CHUNK)
        assert queue(t) == (OpView(4 * CHUNK, True, False),)
        t.stock_done("D", 4)
        t.end_retrieval("D", 0)
        assert queue(t) == ()
        assert state(t, "D") is ClaimState.ORDINARY
        assert t.stock_json()["outcomes"] == {"done": 1}
    finally:
        t.close()


def test_a_claim_tempokv_serves_is_not_observed(sm) -> None:
    e = in_l2(sm, 2, "sv-e")
    t = live(sm, "immediate", budget_chunks=8)
    try:
        t.report("E", objects(e))
        until(lambda: state(t, "E") is ClaimState.STAGEREADY)
        assert t.begin_retrieval("E") is RetrievalGrant.READY
        assert t.observe_stock("E", objects(e)) is None
        assert t.stock_json()["count"] == 0
    finally:
        t.close()


def test_tp2_release_waits_for_every_rank(sm) -> None:
    keys = in_l2(sm, 3, "sv-tp")
    t = live(sm, "immediate", budget_chunks=4)
    try:
        t.report("T", objects(keys), world_size=2)
        until(lambda: state(t, "T") is ClaimState.STAGEREADY)
        assert t.begin_retrieval("T") is RetrievalGrant.READY
        t.end_retrieval("T", 0)  # rank 0 read its part; rank 1 still reads the pinned objects
        t.end_retrieval("T", 0)  # the same rank again does not count twice
        assert state(t, "T") is ClaimState.STAGEREADY
        with t.lock:
            assert t.device.locked_bytes() == 3 * CHUNK
        t.end_retrieval("T", 1)
        assert state(t, "T") is ClaimState.RELEASED
        with t.lock:
            assert t.device.locked_bytes() == 0
    finally:
        t.close()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["observe", "done", "end"]),
            st.integers(0, 3),  # request
            st.frozensets(st.integers(0, 5), min_size=1),  # its chunks of a shared pool
        ),
        max_size=14,
    )
)
def test_queue_view_is_the_outstanding_stock_reads(sm, steps) -> None:
    """Whatever lookups, done reports and session ends come, the queue view holds each
    outstanding observed op once, by its bytes; what completed is resident; nothing stays."""
    pool = objects(kv.make_keys(6, "sv-h"))  # metadata only: the device never reads them
    t = virtual(sm, "demand", budget_chunks=8)
    try:
        for what, req, chunks in steps:
            rid = f"q{req}"
            if what == "observe":
                t.observe_stock(rid, [pool[i] for i in sorted(chunks)])
            elif what == "done":
                t.stock_done(rid, len(chunks))
            else:
                t.end_session(rid)
            with t.lock:
                open_ops = {
                    op for r in t._stock.values() for op in t.provider.read_pending(r.read_id)
                }  # fmt: skip
                assert open_ops == t.device.observed_ops()  # no op outlives every read on it
                sizes = [t.provider.op_bytes(op) for op in sorted(open_ops)]
                assert [v.remaining_bytes for v in queue(t)] == sizes
                assert t.provider.tier.inflight_bytes == sum(sizes)
                in_flight = [o.object_id for op in open_ops for o in t.provider.op_objects(op)]
                assert len(in_flight) == len(set(in_flight))  # each object read once
                resident = {o.object_id for o in pool if t.provider.tier.is_resident(o.object_id)}
                assert not resident & set(in_flight)
        for req in range(4):
            t.end_session(f"q{req}")
        assert queue(t) == ()
        with t.lock:
            assert t.provider.tier.inflight_bytes == 0
    finally:
        t.close()


def test_a_stock_read_pins_in_the_model_but_holds_no_lock_of_tempokv(sm) -> None:
    """A stock lookup of objects a claim staged reads them from L1 under its own locks:
    once the claim is released TempoKV's locks go (C counts protection only), while the
    provider's tier keeps them pinned for the read until its retrieve."""
    keys = in_l2(sm, 2, "sv-pin")
    t = live(sm, "immediate", budget_chunks=4)
    try:
        t.report("Y", objects(keys))
        until(lambda: state(t, "Y") is ClaimState.STAGEREADY)
        sr = t.observe_stock("Z", objects(keys))  # resident: nothing to read, pinned
        assert sr is not None and sr.ops == () and queue(t) == ()
        assert t.begin_retrieval("Y") is RetrievalGrant.READY
        t.end_retrieval("Y", 0)
        with t.lock:
            assert t.provider.tier.pins == {o.object_id: 1 for o in objects(keys)}
            assert t.device.locked_bytes() == 0
        t.end_session("Z")
        with t.lock:
            assert t.provider.tier.pins == {}
    finally:
        t.close()


def test_device_progress_is_the_shaped_l2s_fifo_schedule() -> None:
    """Loads in flight on the one shaped device (``tempokv.schedule``, one slot): an op is
    served from when the one before it ended, really or on the schedule, never two at once
    (crediting each op its own elapsed time counted the overlap twice); an open op the
    schedule has done has 1 byte left. 64 B/s and eighths of a second: exact bytes."""
    from bsrkv.lmcache_ext.tempokv.device import LmcStagingDevice
    from bsrkv.tempokv.provider import OpKind

    now = [0.0]
    dev = LmcStagingDevice(storage=None, now=lambda: now[0], est_bytes_s=64.0)
    dev.kind_of = lambda op_id: OpKind.ORDINARY  # observed: no storage needed
    done: list[int] = []
    dev.start(1, 32, done.append)
    now[0] = 0.25
    dev.start(2, 64, done.append)
    now[0] = 0.375  # op 1 since 0.0: 24 B of its 32; op 2 waits behind it
    assert (dev.remaining_bytes(1), dev.remaining_bytes(2)) == (8, 64)
    now[0] = 0.75  # op 1 done on the schedule at 0.5, op 2 served since: 16 B
    assert (dev.remaining_bytes(1), dev.remaining_bytes(2)) == (1, 48)  # 1: never "done"
    assert dev.finish_observed(1) and done == [1]  # op 1 really ends; op 2 keeps its place
    assert dev.remaining_bytes(2) == 48
    now[0] = 0.875
    dev.start(3, 32, done.append)
    now[0] = 1.0  # op 2 since 0.5: 32 B of its 64; op 3 waits behind it (FIFO)
    assert (dev.remaining_bytes(2), dev.remaining_bytes(3)) == (32, 32)
    dev.drop_observed(2)  # op 2 abandoned at 1.0: op 3 served from then
    now[0] = 1.125
    assert (dev.remaining_bytes(2), dev.remaining_bytes(3)) == (0, 24)
    assert dev.remaining_bytes(99) == 0


def test_device_progress_pays_the_shaped_l2s_latency_per_op() -> None:
    """Each op pays the shaped L2's per-op latency before its bytes move (the estimate left
    it out): 32 B at 64 B/s after 0.125 s is done at 0.625, the next op's bytes move from
    0.75."""
    from bsrkv.lmcache_ext.tempokv.device import LmcStagingDevice
    from bsrkv.tempokv.provider import OpKind

    now = [0.0]
    dev = LmcStagingDevice(storage=None, now=lambda: now[0], est_bytes_s=64.0, latency_s=0.125)
    dev.kind_of = lambda op_id: OpKind.ORDINARY
    dev.start(1, 32, print)
    dev.start(2, 32, print)
    now[0] = 0.0625  # op 1 in its latency
    assert (dev.remaining_bytes(1), dev.remaining_bytes(2)) == (32, 32)
    now[0] = 0.375
    assert (dev.remaining_bytes(1), dev.remaining_bytes(2)) == (16, 32)
    now[0] = 0.6875  # op 1 done at 0.625; op 2 in its latency until 0.75
    assert (dev.remaining_bytes(1), dev.remaining_bytes(2)) == (1, 32)
    now[0] = 1.0
    assert dev.remaining_bytes(2) == 16
