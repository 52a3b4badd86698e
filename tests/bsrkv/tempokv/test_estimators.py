import pytest

from bsrkv.tempokv.ttr import (
    OpView,
    QueueProjectionTtr,
    RateMeter,
    StaticTtr,
    TtrQuery,
    project_finish_s,
)
from bsrkv.tempokv.ttu import (
    CostModel,
    EngineLimits,
    EngineSnapshot,
    OutputPredictor,
    QueuedSeq,
    RunningSeq,
    project_ttus,
)


def test_overlapping_transfers_share_the_rate_not_sum():
    ops = (OpView(4, True), OpView(4, True))
    assert project_finish_s(ops, 2, 8.0) == [1.0, 1.0]  # each gets 4 B/s


def test_issue_order_and_concurrency():
    ops = (OpView(8, True), OpView(8, False))
    assert project_finish_s(ops, 1, 8.0) == [1.0, 2.0]


def test_ttr_is_the_last_required_object_not_a_sum():
    rate = RateMeter(8.0)
    ttr = QueueProjectionTtr(rate)
    queue = (OpView(8, True), OpView(8, False))
    only_dep = TtrQuery(queue, frozenset({0}), 0, 8, 1)
    assert ttr.ttr_s(only_dep) == 1.0  # no new reads, still waits on shared staging
    with_new = TtrQuery(queue, frozenset({0}), 4, 12, 1)
    assert ttr.ttr_s(with_new) == 2.5
    assert ttr.ttr_s(TtrQuery((), frozenset(), 0, 0, 1)) == 0.0  # resident: protect only
    assert StaticTtr(8.0).ttr_s(with_new) == 1.5  # isolated, fixed rate


def test_rate_meter_pools_completed_ops_per_load_level_with_the_prior():
    meter = RateMeter(10.0, prior_s=1.0)
    assert meter.aggregate_bytes_s(3) == 10.0  # nothing observed: the prior, flat
    meter.observe_op(20.0, 4.0, 4.0)  # alone for 4 s: 5 B/s at load 1
    assert meter.aggregate_bytes_s(1) == (10.0 + 20.0) / 5.0


def test_output_predictor_conditions_on_progress():
    pred = OutputPredictor(128, (10, 50, 128, 128))
    assert pred.remaining_tokens(0) == (10 + 50 + 128 + 128) / 4
    assert pred.remaining_tokens(60) == 128 - 60  # only N > n count
    assert pred.remaining_tokens(127) == 1.0  # only the two 128s are longer
    assert pred.remaining_tokens(128) == 0.0  # at the limit: this token was its last


COST = CostModel(step_base_s=0.01, token_s=0.0, attn_pair_s=0.0, decode_ctx_token_s=0.0)


def test_ttu_waits_for_a_slot_on_the_shared_timeline():
    pred = OutputPredictor(100, (100,))
    snap = EngineSnapshot(
        0.0,
        0.0,
        (RunningSeq(0, 10, 40), RunningSeq(0, 10, 90)),
        (QueuedSeq("a", 11, 10, 0.5), QueuedSeq("b", 11, 10, 0.5)),
    )
    ttus = project_ttus(snap, COST, EngineLimits(max_seqs=2), pred)
    # 10 decode steps of 10 ms free the second slot; "b" waits for it
    assert abs(ttus["a"] - 0.1) < 1e-12
    assert ttus["b"] > ttus["a"]
    assert project_ttus(snap, COST, EngineLimits(max_seqs=4), pred) == {"a": 0.0, "b": 0.0}


def test_ordinary_reads_share_the_device_but_not_the_staging_slots():
    # Provider: ordinary reads go out at once, outside the staging concurrency (§3.1: the
    # projection follows the provider's issue order and concurrency).
    ops = (OpView(8, True, staging=False), OpView(8, False))
    assert project_finish_s(ops, 1, 8.0) == [2.0, 2.0]  # both run, 4 B/s each


def test_rate_meter_is_load_aware():
    # §3.1 / [20]: the effective aggregate rate is learnt per load level, not averaged.
    meter = RateMeter(10.0, prior_s=1.0)
    meter.observe_op(12.0, 2.0, 8.0)  # 8 s sharing with 4 ops in all: 6 B/s aggregate at 4
    assert meter.aggregate_bytes_s(4) == (10.0 + 12.0) / 3.0
    assert meter.aggregate_bytes_s(1) == 10.0  # one op alone: still the prior
    assert meter.aggregate_bytes_s(8) == meter.aggregate_bytes_s(4)  # flat beyond
    mid = meter.aggregate_bytes_s(2)  # interpolated between levels 1 and 4
    assert abs(mid - (10.0 + (22.0 / 3.0 - 10.0) / 3.0)) < 1e-12


def test_queue_projection_uses_the_load_aware_rate():
    queue = (OpView(8, True), OpView(8, True))
    flat = project_finish_s(queue, 2, 8.0)
    slower = project_finish_s(queue, 2, lambda n: 8.0 if n == 1 else 4.0)
    assert flat == [2.0, 2.0] and slower == [4.0, 4.0]


def test_ttu_accounts_for_predecessors_known_retrieval_dependencies():
    pred = OutputPredictor(100, (100,))
    free = EngineSnapshot(0.0, 0.0, (), (QueuedSeq("a", 11, 10, 0.5), QueuedSeq("b", 11, 10, 0.5)))
    one = EngineLimits(max_seqs=1)
    base = project_ttus(free, COST, one, pred)["b"]
    # "a" is committed but its staging ends 2 s from now: it holds the slot longer
    staged = EngineSnapshot(
        0.0, 0.0, (), (QueuedSeq("a", 11, 10, 0.5, 2.0), QueuedSeq("b", 11, 10, 0.5))
    )
    assert abs(project_ttus(staged, COST, one, pred)["b"] - (base + 2.0)) < 1e-9
    # a slot holder still loading joins only when its load ends
    loading = EngineSnapshot(0.0, 0.0, (RunningSeq(1, 10, 0, 2.5),), (QueuedSeq("b", 11, 10, 0.5),))
    now = EngineSnapshot(0.0, 0.0, (RunningSeq(1, 10, 0),), (QueuedSeq("b", 11, 10, 0.5),))
    assert (
        abs(
            project_ttus(loading, COST, one, pred)["b"]
            - project_ttus(now, COST, one, pred)["b"]
            - 2.5
        )
        < 1e-9
    )


def test_sync_projection_stalls_the_batch_for_a_pending_load():
    # One decoding sequence (60 tokens left) and one holding the second slot, loading for
    # 0.5 s; "b" needs a slot. Async: the decoder steps on, the loader joins at 0.5 (one
    # prefill step), the decoder exits at 0.6. Sync: the step waits for the load first.
    pred = OutputPredictor(100, (100,))
    snap = EngineSnapshot(
        0.0,
        0.0,
        (RunningSeq(0, 10, 40), RunningSeq(1, 10, 0, 0.5)),
        (QueuedSeq("b", 11, 10, 0.5),),
    )
    async_ = project_ttus(snap, COST, EngineLimits(max_seqs=2, sync_loads=False), pred)
    sync = project_ttus(snap, COST, EngineLimits(max_seqs=2, sync_loads=True), pred)
    assert async_["b"] == pytest.approx(0.6)
    assert sync["b"] == pytest.approx(0.5 + 0.01 + 59 * 0.01)


def test_projection_grants_no_slot_while_the_budget_is_spent():
    # 40 prefill tokens under a 16-token budget: chunks 16, 16, 8; the free slot is granted at
    # the pass after the second chunk (budget left over), not at the sequence's exit.
    pred = OutputPredictor(100, (100,))
    snap = EngineSnapshot(0.0, 0.0, (RunningSeq(40, 0, 0),), (QueuedSeq("b", 11, 10, 0.5),))
    limits = EngineLimits(max_seqs=2, max_batched_tokens=16)
    assert project_ttus(snap, COST, limits, pred)["b"] == pytest.approx(0.02)
    wide = EngineLimits(max_seqs=2, max_batched_tokens=8192)
    assert project_ttus(snap, COST, wide, pred)["b"] == 0.0


def test_a_sequence_at_the_limit_leaves_with_the_step_in_progress():
    # 4 ms of a decode step left; the snapshot counts that step, so one sequence already
    # holds all 100 tokens: its slot is free at the next pass, 4 ms on (not a step later).
    pred = OutputPredictor(100, (100,))
    snap = EngineSnapshot(
        0.0, 0.004, (RunningSeq(0, 10, 100), RunningSeq(0, 10, 50)), (QueuedSeq("b", 11, 10, 0.5),)
    )
    assert project_ttus(snap, COST, EngineLimits(max_seqs=2), pred)["b"] == 0.004


def test_projection_starts_after_the_step_in_progress():
    # 4 ms into a 10 ms prefill step (busy_s = −0.004): the next pass is at its end, 6 ms on,
    # never in the past.
    pred = OutputPredictor(100, (100,))
    snap = EngineSnapshot(0.0, -0.004, (RunningSeq(8, 0, 0),), (QueuedSeq("b", 11, 10, 0.5),))
    assert project_ttus(snap, COST, EngineLimits(max_seqs=2), pred)["b"] == pytest.approx(0.006)


QUEUED = EngineLimits(max_seqs=1, sync_loads=False, queued_loads=True)


def test_queued_projection_starts_every_waiting_load_at_the_first_free_pass():
    # One slot, taken by a decoder with 60 tokens left (exit 0.6); a request whose KV is
    # loading (ready at 0.3) heads the queue. The pass at 0.6 admits it (the slot is full
    # again until its 100 tokens end at 1.6); the pass at 1.6 finds the slot free and starts
    # both waiting loads.
    pred = OutputPredictor(100, (100,))
    snap = EngineSnapshot(
        0.0,
        0.0,
        (RunningSeq(0, 10, 40),),
        (QueuedSeq("a", 11, 10, 0.5), QueuedSeq("b", 11, 10, 0.5)),
        (RunningSeq(1, 10, 0, 0.3),),
    )
    ttus = project_ttus(snap, COST, QUEUED, pred)
    assert ttus == {"a": pytest.approx(1.6), "b": pytest.approx(1.6)}


def test_queued_projection_waits_for_room_in_the_gpu_kv():
    # Two slots, one free: "a" starts at once; "b" would overflow 2,500 tokens of KV, so it
    # starts only at the pass after the decoder (60 tokens left) exits. On the way, the
    # decode stretch is cut when "a"'s load ends (0.5) so the next pass admits it.
    pred = OutputPredictor(100, (100,))
    snap = EngineSnapshot(
        0.0,
        0.0,
        (RunningSeq(0, 1000, 40),),
        (QueuedSeq("a", 1001, 1000, 0.5), QueuedSeq("b", 1001, 1000, 0.5)),
    )
    two = EngineLimits(max_seqs=2, sync_loads=False, queued_loads=True)
    assert project_ttus(snap, COST, two, pred) == {"a": 0.0, "b": 0.0}
    tight = EngineLimits(max_seqs=2, sync_loads=False, queued_loads=True, gpu_kv_tokens=2500)
    ttus = project_ttus(snap, COST, tight, pred)
    # 50 decode steps to 0.5, a's prefill step (the decoder's 51st token), 9 more: it exits
    assert ttus == {"a": 0.0, "b": pytest.approx(0.5 + 0.01 + 0.09)}


def test_queued_and_sync_loads_cannot_be_combined():
    with pytest.raises(ValueError, match="queued loads are asynchronous"):
        EngineLimits(queued_loads=True)
