"""TempoKV-U: TTU as the q-quantile of a distribution over remaining output lengths (the
empirical distribution of completed outputs, conditioned on what each sequence has
produced), commitment when that quantile reaches TTR, and a wakeup at the predicted
crossing. Round numbers as in test_engine: every step 10 ms, 1 GiB per 256-token chunk."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bsrctl.tempokv.sim.device import DeviceConfig
from bsrctl.tempokv.sim.models import ModelProfile
from bsrctl.tempokv.sim.run import ControlConfig, simulate
from bsrctl.tempokv.sim.workload import Request
from bsrctl.tempokv.spec import TTU_QUANTILE, TempoKVSpec
from bsrkv.tempokv.kv import GIB, prefix_manifest
from bsrkv.tempokv.ttu import (
    CostModel,
    EngineLimits,
    EngineSnapshot,
    OutputPredictor,
    QueuedSeq,
    RunningSeq,
    project_with_outputs,
)
from bsrkv.tempokv.ttu_quantile import SCENARIOS, project_ttu_quantiles, scenario_levels

STEP = CostModel(step_base_s=0.01, token_s=0.0, attn_pair_s=0.0, decode_ctx_token_s=0.0)
MODEL = ModelProfile("flat", GIB // 256, STEP)


def test_the_quantile_picks_the_early_or_the_late_end():
    # One running sequence that has produced nothing yet, completions of 2 and 10 tokens:
    # half the scenarios end it after 2 decode steps, half after 10. The head waiter's TTU
    # at q = 0.5 (rank 8 of 16) is the early end; just above 0.5 (rank 9), the late one.
    predictor = OutputPredictor(16, (2, 10))
    snap = EngineSnapshot(0.0, 0.0, (RunningSeq(0, 512, 0),), (QueuedSeq("w", 520, 256, 0.0625),))
    limits = EngineLimits(max_seqs=1)

    def point(tokens: float) -> float:
        return project_with_outputs(snap, [tokens], [], [16.0], STEP, limits)["w"]

    assert point(2.0) == pytest.approx(0.02) and point(10.0) == pytest.approx(0.10)
    assert project_ttu_quantiles(snap, STEP, limits, predictor, 0.5) == {"w": point(2.0)}
    assert project_ttu_quantiles(snap, STEP, limits, predictor, 0.51) == {"w": point(10.0)}
    # the conditional mean TempoKV uses sits between: 6 tokens
    assert predictor.remaining_tokens(0) == 6.0


def _req(i: int, t: float, chunks: int, uncached: int, output: int) -> Request:
    doc, cached = f"d{i % 3}", 256 * chunks
    manifest = prefix_manifest(doc, cached, 256, GIB // 256)
    return Request(f"r{i}", t, t, doc, cached + uncached, cached, output, manifest)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 0.5), st.integers(1, 4), st.integers(1, 64)),
        min_size=1,
        max_size=8,
    ),
    st.integers(2, 12),
    st.sampled_from(["sync", "async", "queued"]),
    st.booleans(),
    st.integers(1, 4),
    st.sampled_from([0.0, 0.05]),
    st.floats(0.01, 1.0),
    st.integers(2, 8),
)
def test_with_every_output_at_the_limit_tempokv_u_commits_as_tempokv_with_crossing_wakeups(
    shape, limit, loads, release, max_seqs, tick_s, q, budget_gib
):
    # A degenerate output-length distribution (every output, and every calibration
    # sample, hits the limit): every scenario is TempoKV's projection, so for any q the
    # commitments are TempoKV's with control.crossing_wakeup, instant for instant.
    t, reqs = 0.0, []
    for i, (gap, chunks, uncached) in enumerate(shape):
        t += gap
        reqs.append(_req(i, t, chunks, uncached, limit))
    limits = EngineLimits(
        max_seqs,
        sync_loads=loads == "sync",
        release_at_first_step=release,
        queued_loads=loads == "queued",
    )
    device = DeviceConfig(
        8 * GIB, 0.173, 1, 16 * GIB, 2 * budget_gib * GIB, budget_bytes=budget_gib * GIB
    )
    control = ControlConfig(tick_s, 1.0, limit, (limit,) * 8, True, q)
    u = simulate(reqs, MODEL, device, limits, control, "tempokv-u")
    t_kv = simulate(reqs, MODEL, device, limits, control, "tempokv")
    assert u.claim_traces == t_kv.claim_traces
    assert [lg.retrieval_s for lg in u.logs] == [lg.retrieval_s for lg in t_kv.logs]
    assert u.byte_time_byte_s == t_kv.byte_time_byte_s


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 300), st.integers(0, 15)), min_size=0, max_size=4),
    st.lists(st.tuples(st.integers(1, 600), st.integers(0, 512)), min_size=1, max_size=5),
    st.lists(st.integers(1, 16), min_size=0, max_size=40),
    st.floats(0.01, 1.0),
    st.integers(1, 4),
    st.sampled_from([64, 8192]),
)
def test_the_quantile_is_over_every_scenario_drawn_independently(
    running, waiting, completions, q, max_seqs, budget
):
    # Reference: scenario by scenario, each sequence's remaining output drawn at its own
    # level from the conditional empirical distribution, projected, then the lower
    # q-quantile of the 16 TTUs.
    snap = EngineSnapshot(
        0.0,
        0.0,
        tuple(RunningSeq(p, 256 + p, g) for p, g in running),
        tuple(QueuedSeq(f"w{i}", c + u, c, c / (16 * 256)) for i, (u, c) in enumerate(waiting)),
    )
    limits = EngineLimits(max_seqs=max_seqs, max_batched_tokens=budget)
    predictor = OutputPredictor(16, tuple(completions))
    n_run = len(snap.running)
    per: dict[str, list[float]] = {}
    for k in range(SCENARIOS):
        run_left = [
            predictor.remaining_quantile(r.generated_tokens, scenario_levels(i)[k])
            for i, r in enumerate(snap.running)
        ]
        outputs = [
            predictor.remaining_quantile(0, scenario_levels(n_run + j)[k])
            for j in range(len(snap.waiting))
        ]
        for rid, t in project_with_outputs(snap, run_left, [], outputs, STEP, limits).items():
            per.setdefault(rid, []).append(t)
    reference = {rid: sorted(ts)[math.ceil(q * SCENARIOS - 1e-9) - 1] for rid, ts in per.items()}
    assert project_ttu_quantiles(snap, STEP, limits, predictor, q) == reference


def test_a_longer_output_can_make_a_ttu_earlier():
    # Why every distinct scenario is projected (no bound prunes any): found by hypothesis.
    # Five one-token prompts, the fourth with a one-token cached prefix to load (sync);
    # three slots, a 64-token budget. With outputs 1, 2, 2, 1, 1 tokens, w4 is granted at
    # 20.24 ms; with w0 producing 2 tokens instead of 1, at 20 ms: w3's load lands in a
    # different step.
    snap = EngineSnapshot(
        0.0,
        0.0,
        (),
        tuple(QueuedSeq(f"w{i}", 1 + c, c, c / (16 * 256)) for i, c in enumerate([0, 0, 0, 1, 0])),
    )
    limits = EngineLimits(max_seqs=3, max_batched_tokens=64)

    def ttu(outputs: list[float]) -> float:
        return project_with_outputs(snap, [], [], outputs, STEP, limits)["w4"]

    short, long = ttu([1.0, 2.0, 2.0, 1.0, 1.0]), ttu([2.0, 2.0, 2.0, 1.0, 1.0])
    assert (short, long) == (pytest.approx(0.020244140625), pytest.approx(0.02))


def test_q_is_one_value_from_the_spec_for_every_figure():
    spec = TempoKVSpec.model_validate(
        {
            "models": [{"name": "llama-3.1-8b"}],
            "experiment": {"kind": "policies", "cache_ratios": [1]},
        }
    )
    assert spec.control.ttu_quantile == TTU_QUANTILE == 0.05
    assert SCENARIOS == 16  # q = 0.05 is the lowest of 16 scenarios
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="ttu_quantile"):
            TempoKVSpec.model_validate(
                {
                    "models": [{"name": "llama-3.1-8b"}],
                    "control": {"ttu_quantile": bad},
                    "experiment": {"kind": "policies", "cache_ratios": [1]},
                }
            )
