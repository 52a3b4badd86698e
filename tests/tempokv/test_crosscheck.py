"""The sim cross-check of a serving run: calibration read exactly from the trace and the
evidence, the spec it gives the simulation, and a simulated row per policy."""

from __future__ import annotations

import pytest

from bsrctl.experiments.tempokv.crosscheck import (
    calibrate,
    fit_steps,
    orderings,
    serving_rows,
    sim_spec,
    simulate_like_serving,
)
from bsrctl.tempokv.spec import TempoKVSpec

SPEC = TempoKVSpec.model_validate(
    {
        "models": [{"name": "llama-3.1-8b"}],
        "serving": {"documents_tokens": [1024, 768], "num_requests": 3, "interval_s": 0.1,
                    "max_tokens": 8, "budget_mib": 2.0, "l1_mib": 64, "max_num_seqs": 1},
        "experiment": {"kind": "policies", "cache_ratios": [1.0]},
    }
)  # fmt: skip
TRACE = [
    {"kind": "step", "scheduled": {}},
    {"kind": "step_time", "tokens": 1, "s": 0.012},
    {"kind": "step_time", "tokens": 101, "s": 0.032},
    {"kind": "step_time", "tokens": 201, "s": 0.052},
    {"kind": "step_time", "tokens": 0, "s": 0.5},  # an empty step is no cost sample
]
EVIDENCE = {
    "summary": {"stack": {"kv_bytes_per_token": 4096},
                "policies": {"demand": {"c_mib_s_per_req": 0.5, "p95_ttft_s": 2.0},
                             "immediate": {"c_mib_s_per_req": 0.3, "p95_ttft_s": 1.0}}},
    "points": [
        {"params": {"policy": "demand"}, "measures": {"c_mib_s_per_req": 0.5, "p95_ttft_s": 2.0},
         "extra": {"stages": [{"bytes": 1 << 20, "start_s": 1.0, "done_s": 1.25}]}},
        {"params": {"policy": "immediate"},
         "measures": {"c_mib_s_per_req": 0.3, "p95_ttft_s": 1.0},
         "extra": {"stages": [{"bytes": 3 << 20, "start_s": 0.0, "done_s": 0.75},
                              {"bytes": 1 << 20, "start_s": 0.0, "done_s": None}]}},
    ],
}  # fmt: skip


def test_calibration_is_read_exactly() -> None:
    a, b, n, biggest = fit_steps(TRACE)
    assert (a, b, n, biggest) == (pytest.approx(0.0118), pytest.approx(2e-4), 3, 201)
    cal = calibrate(EVIDENCE, TRACE)
    assert cal.staging_bytes_s == (4 << 20) / 1.0  # 4 MiB over 1 s of finished ops
    assert cal.staged_bytes == 4 << 20 and cal.kv_bytes_per_token == 4096


def test_sim_spec_is_the_serving_run() -> None:
    s = sim_spec(SPEC, calibrate(EVIDENCE, TRACE))
    assert s.workload.documents_tokens == [1024, 768, 1024]  # requests cycle the documents
    assert s.workload.arrivals.kind == "fixed" and s.workload.arrivals.interval_s == 0.1
    assert (s.workload.output.max_tokens, s.workload.output.eos_fraction) == (8, 0.0)
    assert (s.engine.max_seqs, s.engine.loads, s.engine.max_batched_tokens) == (1, "queued", 201)
    assert s.device.fast_tier_gib == 64 / 1024 and s.device.budget_fraction == 2.0 / 64
    assert s.device.staging_gib_s == (4 << 20) / (1 << 30)


def test_simulated_rows_and_orderings() -> None:
    cal = calibrate(EVIDENCE, TRACE)
    sim = simulate_like_serving(SPEC, cal, ["demand", "immediate", "oracle"])
    assert set(sim) == {"demand", "immediate", "oracle"}
    assert all(v["p95"] > 0 and v["c"] >= 0 for v in sim.values())
    agree = orderings(serving_rows(EVIDENCE), sim)
    assert set(agree) == {"c", "p95"}
    assert agree["c"].left == ("immediate", "demand")  # serving, lowest first
