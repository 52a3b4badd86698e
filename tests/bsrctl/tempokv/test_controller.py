"""Exact claim-state traces under the virtual clock."""

from bsrkv.tempokv.claims import ClaimState as S
from bsrkv.tempokv.claims import IllegalTransition
from bsrkv.tempokv.controller import Controller, RetrievalGrant
from bsrkv.tempokv.kv import GIB
from bsrkv.tempokv.policies import Demand, Immediate, QueueK, Timed
from bsrkv.tempokv.ttr import QueueProjectionTtr, StaticTtr

from .conftest import RATE, make_provider, objs


def trace(claim):
    return [(round(t.t_s, 9), t.state) for t in claim.trace]


def test_claim_holds_nothing_before_commitment(clock):
    p = make_provider(clock)
    ctl = Controller(clock, p, Demand())
    m = objs("a", 8)
    p.store(m.objects)
    ctl.report_hit("r1", m)
    ctl.update_runtime(["r1"], {"r1": 1.0}, 0.0)
    clock.run(until_s=10.0)
    assert p.tier.reserved_bytes == 0 and p.read_bytes_total == 0 and p.meter.peak_bytes == 0
    assert trace(ctl.claims["r1"]) == [(0.0, S.PLANNED)]


def test_commits_exactly_when_laxity_crosses_zero(clock):
    p = make_provider(clock)
    ctl = Controller(
        clock, p, Timed("tempokv", QueueProjectionTtr(p.rate)), tick_s=0.0, crossing_wakeup=True
    )
    m = objs("a", 8)  # 8 GiB at 8 GiB/s: TTR = 1 s
    p.store(m.objects)
    ctl.report_hit("r1", m)
    ctl.update_runtime(["r1"], {"r1": 3.0}, 0.0)  # TTU 3 s: L = 2 s, crosses 0 at t = 2
    clock.run(until_s=2.5)
    assert trace(ctl.claims["r1"]) == [(0.0, S.PLANNED), (2.0, S.STAGING)]
    clock.run()
    assert trace(ctl.claims["r1"]) == [(0.0, S.PLANNED), (2.0, S.STAGING), (3.0, S.STAGEREADY)]
    assert [a.laxity_s for a in ctl.attempts] == [0.0]


def test_periodic_tick_commits_on_the_first_tick_past_the_crossing(clock):
    p = make_provider(clock)
    ctl = Controller(clock, p, Timed("tempokv-static", StaticTtr(RATE)), tick_s=0.05)
    m = objs("a", 8)
    p.store(m.objects)
    ctl.report_hit("r1", m)
    ctl.update_runtime(["r1"], {"r1": 1.23}, 0.0)  # crossing at 0.23 s
    clock.run()
    assert trace(ctl.claims["r1"])[1] == (0.25, S.STAGING)


def test_full_lifecycle_and_release(clock):
    p = make_provider(clock)
    ctl = Controller(clock, p, Immediate())
    m = objs("a", 2)
    p.store(m.objects)
    ctl.report_hit("r1", m)
    clock.run()
    assert ctl.request_retrieval("r1", lambda: None) is RetrievalGrant.READY
    ctl.begin_transfer("r1")
    clock.run(until_s=1.0)
    ctl.end_transfer("r1")
    assert trace(ctl.claims["r1"]) == [
        (0.0, S.PLANNED),
        (0.0, S.STAGING),
        (0.25, S.STAGEREADY),
        (0.25, S.TRANSFERRING),
        (1.0, S.RELEASED),
    ]
    assert p.tier.reserved_bytes == 0 and p.meter.integral_byte_s == 2 * GIB * 1.0


def test_retrieval_without_capacity_goes_ordinary_and_never_commits(clock):
    p = make_provider(clock, capacity_gib=10, budget_gib=4)
    ctl = Controller(clock, p, Immediate())
    big, small = objs("big", 4), objs("small", 2)
    p.store(big.objects + small.objects)
    ctl.report_hit("r1", big)
    ctl.report_hit("r2", small)  # refused: budget full (deferred)
    assert ctl.claims["r2"].state is S.PLANNED and ctl.deferred_claims == 1
    assert ctl.request_retrieval("r2", lambda: None) is RetrievalGrant.ORDINARY
    clock.run()
    ctl.request_retrieval("r1", lambda: None)
    ctl.begin_transfer("r1")
    ctl.end_transfer("r1")  # capacity released: r2 must stay ORDINARY
    clock.run()
    assert [s for _, s in trace(ctl.claims["r2"])] == [S.PLANNED, S.ORDINARY]
    assert p.outstanding() == 0


def test_refused_claim_does_not_block_later_ones(clock):
    p = make_provider(clock, capacity_gib=10, budget_gib=4)
    ctl = Controller(clock, p, QueueK(4))
    a, b, c = objs("a", 3), objs("b", 2), objs("c", 1)
    p.store(a.objects + b.objects + c.objects)
    for cid, m in (("ra", a), ("rb", b), ("rc", c)):
        ctl.report_hit(cid, m)
    ctl.update_runtime(["ra", "rb", "rc"], None, 0.0)
    # ra (3 GiB) commits; rb (2 GiB) does not fit; rc (1 GiB) still commits after it
    assert [ctl.claims[x].state for x in ("ra", "rb", "rc")] == [S.STAGING, S.PLANNED, S.STAGING]


def test_committed_claims_are_never_revoked(clock):
    p = make_provider(clock)
    ctl = Controller(clock, p, QueueK(1))
    m = objs("a", 2)
    p.store(m.objects)
    ctl.report_hit("r1", m)
    ctl.update_runtime(["r1"], None, 0.0)
    ctl.update_runtime([], None, 0.0)  # rank lost: still committed
    clock.run()
    assert ctl.claims["r1"].state is S.STAGEREADY


def test_illegal_transition_raises(clock):
    p = make_provider(clock)
    ctl = Controller(clock, p, Demand())
    m = objs("a", 1)
    p.store(m.objects)
    claim = ctl.report_hit("r1", m)
    try:
        claim.move(S.RELEASED, 0.0)
    except IllegalTransition:
        return
    raise AssertionError("PLANNED -> RELEASED accepted")


def test_cancel_committed_keeps_protection_until_io_ends(clock):
    p = make_provider(clock)
    ctl = Controller(clock, p, Immediate())
    m = objs("a", 4)  # 0.5 s of staging
    p.store(m.objects)
    ctl.report_hit("r1", m)
    clock.run(until_s=0.1)
    ctl.cancel("r1")
    assert p.tier.reserved_bytes == 4 * GIB  # I/O outstanding: still protected
    clock.run()
    assert p.tier.reserved_bytes == 0 and clock.now() == 0.5


def test_queue_rank_counts_the_full_waiting_queue(clock):
    # §5: Queue-K commits when the request is among the first K of the runtime's *full*
    # waiting queue; a request ahead with no reusable KV still takes a rank.
    p = make_provider(clock)
    ctl = Controller(clock, p, QueueK(1))
    m = objs("a", 2)
    p.store(m.objects)
    ctl.report_hit("r1", m)
    ctl.update_runtime(["r0", "r1"], None, 0.0)  # r0: no hit, no claim
    assert ctl.claims["r1"].state is S.PLANNED
    clock.call_at(1.0, lambda: ctl.update_runtime(["r1"], None, clock.now()))
    clock.run()
    assert trace(ctl.claims["r1"])[:2] == [(0.0, S.PLANNED), (1.0, S.STAGING)]
