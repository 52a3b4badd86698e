import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bsrctl.tempokv.sim.device import DeviceConfig, SimStagingDevice
from bsrkv.tempokv.kv import GIB, Manifest
from bsrkv.tempokv.provider import CommitRefusal, OpKind, StagingProvider
from bsrkv.tempokv.ttr import RateMeter

from .conftest import RATE, make_provider, objs


def test_commit_protects_stages_and_becomes_ready(clock):
    p = make_provider(clock)
    m = objs("a", 4)
    p.store(m.objects)
    ready = []
    p.on_ready = ready.append
    d = p.commit("c1", m)
    assert (d.ok, d.extra_reserved_bytes, d.read_bytes, d.ready) == (True, 4 * GIB, 4 * GIB, False)
    assert p.tier.reserved_bytes == 4 * GIB  # reservation counts before the bytes arrive
    clock.run()
    assert ready == ["c1"] and clock.now() == 4 * GIB / RATE
    assert p.is_ready("c1")


def test_shared_objects_are_reserved_and_read_once(clock):
    p = make_provider(clock)
    a, b = objs("doc", 4), Manifest(objs("doc", 6).objects[2:])  # b shares doc/2, doc/3
    p.store(objs("doc", 6).objects)
    d1 = p.commit("c1", a)
    d2 = p.commit("c2", b)
    assert d1.extra_reserved_bytes == 4 * GIB
    assert (d2.extra_reserved_bytes, d2.read_bytes) == (2 * GIB, 2 * GIB)
    assert p.tier.reserved_bytes == 6 * GIB
    clock.run()
    assert p.read_bytes_total == 6 * GIB


def test_release_frees_only_bytes_no_other_claim_protects(clock):
    p = make_provider(clock)
    p.store(objs("doc", 6).objects)
    p.commit("c1", objs("doc", 4))
    p.commit("c2", Manifest(objs("doc", 6).objects[2:]))
    clock.run()
    assert p.release("c1") == 2 * GIB  # doc/0, doc/1 only
    assert p.tier.reserved_bytes == 4 * GIB
    assert p.release("c2") == 4 * GIB
    assert p.tier.reserved_bytes == 0
    assert p.tier.resident_bytes == 6 * GIB  # released is not evicted: still cached


def test_budget_refusal_changes_nothing(clock):
    p = make_provider(clock, capacity_gib=10, budget_gib=5)
    p.store(objs("a", 4).objects + objs("b", 2).objects)
    assert p.commit("c1", objs("a", 4)).ok
    d = p.commit("c2", objs("b", 2))
    assert d.refusal is CommitRefusal.CAPACITY and "budget" in d.detail
    assert p.tier.reserved_bytes == 4 * GIB and p.outstanding() == 1


def test_unknown_objects_are_invalid(clock):
    p = make_provider(clock)
    assert p.commit("c1", objs("nowhere", 1)).refusal is CommitRefusal.INVALID


def test_resident_unprotected_objects_need_protection_not_reads(clock):
    p = make_provider(clock)
    m = objs("a", 2)
    p.store(m.objects)
    p.commit("c1", m)
    clock.run()
    p.release("c1")
    d = p.commit("c2", m)
    assert (d.ready, d.read_bytes, d.extra_reserved_bytes) == (True, 0, 2 * GIB)


def test_ordinary_read_reserves_nothing(clock):
    p = make_provider(clock)
    m = objs("a", 2)
    p.store(m.objects)
    done = []
    p.ordinary_read("c1", m, lambda: done.append(clock.now()))
    assert p.tier.reserved_bytes == 0
    clock.run()
    assert done == [2 * GIB / RATE] and p.meter.peak_bytes == 0


def test_lru_evicts_only_unprotected_oldest_first(clock):
    p = make_provider(clock, capacity_gib=4, budget_gib=3)
    for tag, n in (("a", 2), ("b", 1), ("c", 2)):
        p.store(objs(tag, n).objects)
    p.commit("a", objs("a", 2))
    clock.run()
    p.release("a")  # a/0, a/1 stay cached, evictable
    p.commit("b", objs("b", 1))
    clock.run()  # resident: a/0 a/1 b/0 (3 of 4 GiB), b/0 protected
    assert p.commit("c", objs("c", 2)).ok  # needs 2 GiB of room: evicts a/0 only
    clock.run()
    resident = list(p.tier.resident)
    assert resident == ["a/1", "b/0", "c/0", "c/1"] and p.tier.evictions == 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 9), st.integers(1, 6), st.booleans()), min_size=1, max_size=30
    )
)
def test_budget_never_exceeded_over_random_workloads(ops):
    from bsrkv.clock import VirtualClock

    clock = VirtualClock()
    p = make_provider(clock, capacity_gib=12, budget_gib=8)
    docs = {d: objs(f"d{d}", 6) for d in range(10)}
    for m in docs.values():
        p.store(m.objects)
    live: list[str] = []
    for i, (doc, n, release_one) in enumerate(ops):
        m = Manifest(docs[doc].objects[:n])
        if p.commit(f"c{i}", m).ok:
            live.append(f"c{i}")
        assert p.tier.reserved_bytes <= p.tier.budget_bytes
        clock.run(until_s=clock.now() + 0.1)
        if release_one and live:
            cid = live.pop(0)
            p.release(cid)
        assert p.tier.reserved_bytes <= p.tier.budget_bytes
        assert p.tier.resident_bytes + p.tier.inflight_bytes <= p.tier.capacity_bytes
    clock.run()
    for cid in live:
        p.release(cid)
    clock.run()
    assert p.tier.reserved_bytes == 0 and p.meter.peak_bytes <= 8 * GIB


def test_pending_eta_projects_the_claims_outstanding_staging(clock):
    p = make_provider(clock, concurrency=1)
    p.store(objs("a", 8).objects + objs("b", 4).objects)
    p.commit("c1", objs("a", 8))  # 1 s at 8 GiB/s
    p.commit("c2", objs("b", 4))  # queued behind it: ready at 1.5 s
    assert (p.pending_eta_s("c1"), p.pending_eta_s("c2")) == (1.0, 1.5)
    clock.run(until_s=0.5)
    assert p.pending_eta_s("c2") == 1.0
    clock.run()
    assert p.pending_eta_s("c2") == 0.0 and p.pending_eta_s("nobody") == 0.0


def test_rate_is_calibrated_per_load_from_completed_ops(clock):
    # §3.1 / [20]: each op's share of the device (∫ 1/n dt, from issue and completion times
    # only) turns its bytes into a sample of the aggregate at its load; under processor
    # sharing with contention the two-op level learns the slower aggregate.
    cfg = DeviceConfig(staging_bytes_s=RATE, contention=0.5, concurrency=2)
    p = StagingProvider(
        clock, SimStagingDevice(clock, cfg), 100 * GIB, 50 * GIB, 2, RateMeter(RATE, prior_s=1e-9)
    )
    p.store(objs("a", 4).objects + objs("b", 4).objects)
    p.commit("c1", objs("a", 4))
    p.commit("c2", objs("b", 4))  # both run together: 8 GiB/s / 1.5 shared, done at 1.5 s
    clock.run()
    assert clock.now() == 1.5
    assert abs(p.rate.aggregate_bytes_s(2) - RATE / 1.5) < 1e-3 * RATE
    assert abs(p.rate.aggregate_bytes_s(1) - RATE) < 1e-9  # never alone: the prior stands


def test_a_commit_does_not_join_a_demand_read_that_streams_through_uncached(clock):
    # Capacity 4 GiB, budget 3: x (2 GiB) protected by c0, y (2 GiB) pinned by the ordinary
    # read r1. r2's demand read of b/0 finds no room and streams through (caches nothing),
    # so c2, committed meanwhile, reads b/0 anew in its own op; that op waits for room (head
    # of line) until r1 ends and y/0 can be evicted. Joining r2's read instead left c2
    # protecting an object that arrived with nowhere to go.
    p = make_provider(clock, capacity_gib=4, budget_gib=3)
    p.store(objs("x", 2).objects + objs("y", 2).objects + objs("b", 1).objects)
    ready: list[tuple[str, float]] = []
    p.on_ready = lambda cid: ready.append((cid, clock.now()))
    assert p.commit("c0", objs("x", 2)).ok
    clock.run()
    p.ordinary_read("r1", objs("y", 2), lambda: None)
    clock.run()
    assert (clock.now(), p.tier.resident_bytes) == (0.5, 4 * GIB)
    done: list[float] = []
    p.ordinary_read("r2", objs("b", 1), lambda: done.append(clock.now()))
    d = p.commit("c2", objs("b", 1))
    assert (d.ok, d.read_bytes, d.ready) == (True, GIB, False)
    clock.run()
    assert done == [0.625] and ready == [("c0", 0.25)]  # c2's op still waits for room
    assert not p.tier.is_resident("b/0")
    p.end_ordinary("r1")
    clock.run()
    assert ready[-1] == ("c2", 0.75) and p.tier.is_resident("b/0")
    assert p.read_bytes_total == 6 * GIB  # b/0 read twice
    assert p.tier.reserved_bytes == 3 * GIB <= p.tier.budget_bytes


# ---- ops performed outside the provider (the live stack's observed stock reads) ---------
class _HeldDevice:
    """A device whose reads never finish by themselves (the live stack's observed ops)."""

    def __init__(self) -> None:
        self.started: list[tuple[int, int]] = []

    def start(self, op_id, size_bytes, on_done) -> None:
        self.started.append((op_id, size_bytes))

    def remaining_bytes(self, op_id: int) -> int:
        return 1


def _held_provider(clock) -> tuple[StagingProvider, _HeldDevice]:
    dev = _HeldDevice()
    return StagingProvider(clock, dev, 100 * GIB, 50 * GIB, 1, RateMeter(RATE)), dev


def test_ops_issued_their_waiters_and_the_queue_are_public(clock):
    p = make_provider(clock)
    p.store(objs("a", 3).objects)
    done = []
    ops = p.issued_by(lambda: p.ordinary_read("r1", objs("a", 2), lambda: done.append("r1")))
    assert ops == (0,)
    assert (p.op_kind(0), p.op_bytes(0)) == (OpKind.ORDINARY, 2 * GIB)
    assert [o.object_id for o in p.op_objects(0)] == ["a/0", "a/1"]
    assert p.read_pending("r1") == {0} and p.read_pending("nobody") == set()
    assert p.waiters(0) == (0, 1)
    # a commitment joins the demand read for a/0, a/1 and reads a/2 in a new staging op
    assert p.issued_by(lambda: p.commit("c1", objs("a", 3))) == (1,)
    assert (p.op_kind(1), p.op_bytes(1)) == (OpKind.STAGE, GIB)
    assert (p.waiters(0), p.waiters(1)) == ((1, 1), (1, 0))
    assert p.queue_bytes() == 3 * GIB
    clock.run()
    assert done == ["r1"] and p.is_ready("c1")
    assert (p.queue_bytes(), p.read_pending("r1"), p.waiters(0)) == (0, set(), (0, 0))


def test_drop_op_removes_an_unfinished_op_nobody_waits_on(clock):
    p, dev = _held_provider(clock)
    p.store(objs("a", 2).objects)
    p.ordinary_read("r1", objs("a", 2), lambda: None)
    assert dev.started == [(0, 2 * GIB)]
    assert (p.tier.inflight_bytes, p.queue_bytes()) == (2 * GIB, 2 * GIB)
    with pytest.raises(RuntimeError, match=r"^op 0: 0 commitments, 1 reads wait on it$"):
        p.drop_op(0)
    p.end_ordinary("r1")
    version, changes = p.version, []
    p.on_change = lambda: changes.append(p.version)
    p.drop_op(0)
    assert (p.tier.inflight_bytes, p.queue_bytes(), p.tier.resident_bytes) == (0, 0, 0)
    assert p.version > version and changes == [p.version]
    assert p.rate.aggregate_bytes_s(1) == RATE  # never timed: no rate sample
    # its objects are no longer covered: a new read issues a new op instead of joining it
    assert [o.object_id for o in p.unstaged_objects(objs("a", 2))] == ["a/0", "a/1"]
    assert p.issued_by(lambda: p.ordinary_read("r2", objs("a", 2), lambda: None)) == (1,)
    assert dev.started == [(0, 2 * GIB), (1, 2 * GIB)]
