"""The sim cross-check of a serving run: calibration read exactly from the trace and the
evidence, the spec it gives the simulation, and a simulated row per policy."""

from __future__ import annotations

import pytest

from bsrctl.tempokv.experiments.crosscheck import (
    calibrate,
    fit_steps,
    orderings,
    serving_rows,
    sim_spec,
    simulate_like_serving,
)
from bsrctl.tempokv.spec import TempoKVSpec
from tests.bsrctl.tempokv.rows import pooled

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
                "policies": {"demand": pooled([2.0], [0.5], model_c_mib_s_per_req=0.2).to_json(),
                             "immediate": pooled([1.0], [0.3],
                                                 model_c_mib_s_per_req=0.4).to_json()}},
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
    assert s.engine.release == "transfer_end"  # the server releases after the retrieve
    assert s.device.fast_tier_gib == 64 / 1024 and s.device.budget_fraction == 2.0 / 64
    assert s.device.staging_gib_s == (4 << 20) / (1 << 30)
    # the adapter's retrieval rate and the deployment's chunk, from the run's spec
    assert (s.device.retrieval_gib_s, s.engine.chunk_tokens) == (1e9 / (1 << 30), 256)
    other = SPEC.model_copy(update={"serving": SPEC.serving.model_validate(
        {**SPEC.serving.model_dump(exclude={"stack"}), "retrieval_bytes_s": 2e9,
         "stack": {"lmcache": {"chunk_size": 128}}})})  # fmt: skip
    s = sim_spec(other, calibrate(EVIDENCE, TRACE))
    assert (s.device.retrieval_gib_s, s.engine.chunk_tokens) == (2e9 / (1 << 30), 128)
    assert (s.device.fast_tier_gib, s.engine.max_seqs) == (64 / 1024, 1)


def test_simulated_rows_and_orderings() -> None:
    cal = calibrate(EVIDENCE, TRACE)
    sim = simulate_like_serving(SPEC, cal, ["demand", "immediate", "oracle"])
    assert set(sim) == {"demand", "immediate", "oracle"}
    assert all(v["p95"] > 0 and v["c"] >= 0 for v in sim.values())
    agree = orderings(serving_rows(EVIDENCE), sim)
    assert set(agree) == {"c", "c_reserved", "p95"}
    assert agree["c"].left == ("immediate", "demand")  # serving, lowest first (pins)
    assert agree["c_reserved"].left == ("demand", "immediate")  # reserved from commit


LOOP_TRACE = [
    {"kind": "step_time", "tokens": 100, "s": 0.010, "done_s": 1.000, "busy": False},
    {"kind": "step_time", "tokens": 1, "s": 0.002, "done_s": 1.005, "busy": True},
    {"kind": "step_time", "tokens": 1, "s": 0.002, "done_s": 1.010, "busy": True},
    {"kind": "step_time", "tokens": 0, "s": 0.001, "done_s": 1.500, "busy": False},  # idle
    {"kind": "step_time", "tokens": 201, "s": 0.020, "done_s": 2.000, "busy": False},
    {"kind": "step_time", "tokens": 201, "s": 0.020, "done_s": 2.025, "busy": True},
]


def test_the_loop_cost_comes_from_busy_output_gaps() -> None:
    from bsrctl.tempokv.experiments.crosscheck import loop_points

    # only steps sharing a request with the previous one: the loop did not idle before them
    pts = loop_points(LOOP_TRACE)
    assert [(x, round(y, 6)) for x, y in pts] == [(1, 0.005), (1, 0.005), (201, 0.025)]
    cal = calibrate(EVIDENCE, LOOP_TRACE)
    assert cal.loop_steps == 3
    assert (cal.loop_base_s, cal.loop_token_s) == (pytest.approx(0.0049), pytest.approx(1e-4))
    assert cal.cost().step_base_s == cal.loop_base_s  # the sim runs on the loop's cost
    old = calibrate(EVIDENCE, TRACE)  # a trace without output times: the steps' own time
    assert old.loop_steps == 0 and old.cost().step_base_s == old.step_base_s


def _on(stack: dict) -> TempoKVSpec:
    serving = {**SPEC.serving.model_dump(exclude={"stack"}), "stack": stack}
    return SPEC.model_copy(update={"serving": SPEC.serving.model_validate(serving)})


def test_the_kv_pool_is_the_deployments() -> None:
    from bsrctl.tempokv.experiments.cells import engine_limits
    from bsrctl.tempokv.experiments.crosscheck import CrossCheckUnknown, KvPool, kv_pool
    from bsrctl.tempokv.sim.models import ModelProfile

    cal = calibrate(EVIDENCE, TRACE)
    assert cal.engine_kv_tokens == 0  # no engine record in this trace
    # CPU: VLLM_CPU_KVCACHE_SPACE per rank, from the spec (the shipped specs: 1 GiB, TP 1)
    assert kv_pool(SPEC.serving.stack, cal) == KvPool(
        1.0, "stack.vllm.kvcache_space_gib × TP 1 (VLLM_CPU_KVCACHE_SPACE)")  # fmt: skip
    assert sim_spec(SPEC, cal).engine.gpu_kv_gib == 1.0
    big = _on({"vllm": {"kvcache_space_gib": 3, "tensor_parallel_size": 2}})
    assert sim_spec(big, cal).engine.gpu_kv_gib == 6.0
    # CUDA: vLLM sizes it at startup; the engine's record in the trace says what it has
    cuda = _on({"device": "cuda"})
    engine = {"kind": "engine", "num_gpu_blocks": 3000, "block_size": 16, "kv_tokens": 48000}
    seen = calibrate(EVIDENCE, [*TRACE, {**engine, "kv_tokens": 1}, engine])  # the last start
    assert seen.engine_kv_tokens == 48000
    pool = kv_pool(cuda.serving.stack, seen)
    assert pool == KvPool(48000 * 4096 / (1 << 30), "the engine's KV pool, 48000 tokens (trace)")
    s = sim_spec(cuda, seen)
    model = ModelProfile("m", 4096, seen.cost(), gpu_kv_gib=pool.gib)
    assert engine_limits(s, model).gpu_kv_tokens == 48000  # exactly the engine's tokens
    assert set(simulate_like_serving(cuda, seen, ["demand"])) == {"demand"}
    with pytest.raises(CrossCheckUnknown) as err:  # unknown, never a guessed 1 GiB
        simulate_like_serving(cuda, cal, ["demand"])
    assert str(err.value) == (
        "stack.device cuda: vLLM sizes its KV pool at startup from gpu_memory_utilization "
        "and the adapter trace has no engine record of it"
    )
