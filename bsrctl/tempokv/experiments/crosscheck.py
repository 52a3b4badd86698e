"""The sim cross-check: the serving run's spec under the simulation, calibrated from what the
serving run measured, and the two runs' per-policy orderings by C and by p95 TTFT.

Calibration (nothing tuned toward an ordering; every input is a measurement or the spec):
- step cost: a least-squares line, base + per-token · tokens, through what each busy step
  cost vLLM's engine loop (``step_time`` records: the gap from the previous step's output
  to this one's, where the two steps share a request so the loop did not idle); a trace
  without output times falls back to the steps' own compute time (scheduled to output);
- staging rate: the provider's staging ops in the evidence (bytes over start→done, all
  policies together): what staging really took on the shaped, shared L2;
- the engine as served: max_num_seqs slots, queued loads (LMCache's MP connector), the
  largest step vLLM scheduled as its token budget; protection released at transfer end (the
  server module releases a claim after its retrieve); the served model's KV bytes per token
  (its registration); the engine's KV pool (``kv_pool``: on CPU the spec's
  ``kvcache_space_gib`` per rank; on CUDA vLLM sizes it at startup from
  ``gpu_memory_utilization``, so it is read from the engine's own record in the adapter
  trace, and without one the cross-check is UNKNOWN, saying so);
- the fast tier and budget as the spec's L1 and budget; every output runs to max_tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bsrctl.specs import StackSpec
from bsrctl.tempokv.experiments.cells import simulate_policy
from bsrctl.tempokv.experiments.compare import OrderingAgreement, compare
from bsrctl.tempokv.measures import policy_rows
from bsrctl.tempokv.sim.models import ModelProfile
from bsrctl.tempokv.spec import FixedArrivals, TempoKVSpec
from bsrkv.tempokv.kv import GIB
from bsrkv.tempokv.ttu import CostModel

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Calibration:
    step_base_s: float
    token_s: float
    steps: int
    max_step_tokens: int
    staging_bytes_s: float
    staged_bytes: int
    kv_bytes_per_token: int
    loop_base_s: float = 0.0  # the same line through busy steps' output-to-output gaps
    loop_token_s: float = 0.0
    loop_steps: int = 0  # 0: the trace has no output times (the sim uses the step fit)
    engine_kv_tokens: int = 0  # the engine's KV pool in tokens (0: no engine record)

    def cost(self) -> CostModel:
        """The step cost the simulation runs on: the engine loop's, where measured."""
        if self.loop_steps:
            return CostModel(self.loop_base_s, self.loop_token_s, 0.0, 0.0)
        return CostModel(self.step_base_s, self.token_s, 0.0, 0.0)


def fit_steps(records: Iterable[Mapping[str, Any]]) -> tuple[float, float, int, int]:
    """Least squares s = a + b·tokens over the trace's measured steps (a, b ≥ 0)."""
    pts = [(int(r["tokens"]), float(r["s"])) for r in records if r.get("kind") == "step_time"]
    pts = [(x, y) for x, y in pts if x > 0]
    if not pts:
        raise ValueError("the adapter trace has no measured steps (step_time records)")
    return _fit(pts)


def loop_points(records: Iterable[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """(tokens, seconds from the previous step's output to this one's) for every busy step:
    one that shares a request with the step before it, so the engine loop did not idle
    between them and the gap is one step's whole cost on the loop (scheduling, the
    adapter, arrivals handled, output processing), not only its compute."""
    steps = [r for r in records if r.get("kind") == "step_time" and "done_s" in r]
    return [
        (int(b["tokens"]), float(b["done_s"]) - float(a["done_s"]))
        for a, b in zip(steps, steps[1:], strict=False)
        if b.get("busy") and int(b["tokens"]) > 0
    ]


def _fit(pts: list[tuple[int, float]]) -> tuple[float, float, int, int]:
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    b = max(0.0, sum((x - mx) * (y - my) for x, y in pts) / sxx) if sxx > 0 else 0.0
    a = max(0.0, my - b * mx)
    return a, b, n, max(x for x, _ in pts)


def staging_rate(evidence: Mapping[str, Any]) -> tuple[float, int]:
    total_b, total_s = 0, 0.0
    for p in evidence["points"]:
        for st in p.get("extra", {}).get("stages", []):
            if st.get("done_s") is not None:
                total_b += int(st["bytes"])
                total_s += float(st["done_s"]) - float(st["start_s"])
    if total_s <= 0:
        raise ValueError("the evidence has no finished staging op to measure a rate from")
    return total_b / total_s, total_b


def calibrate(evidence: Mapping[str, Any], trace: Iterable[Mapping[str, Any]]) -> Calibration:
    records = list(trace)
    a, b, n, biggest = fit_steps(records)
    loops = loop_points(records)
    la, lb, ln, _ = _fit(loops) if loops else (0.0, 0.0, 0, 0)
    rate, staged = staging_rate(evidence)
    kv = int(evidence["summary"]["stack"]["kv_bytes_per_token"])
    engines = [r for r in records if r.get("kind") == "engine"]
    pool = int(engines[-1]["kv_tokens"]) if engines else 0  # the last start's, if restarted
    return Calibration(a, b, n, biggest, rate, staged, kv, la, lb, ln, pool)


class CrossCheckUnknown(Exception):
    """The simulation cannot be set up like the serving run: the reason (an UNKNOWN)."""


@dataclass(frozen=True, slots=True)
class KvPool:
    gib: float  # all ranks' KV, in the model's bytes per token (the sim's gpu_kv_gib)
    source: str  # where it came from


def kv_pool(stack: StackSpec, cal: Calibration) -> KvPool:
    """The serving engine's KV pool. CPU: VLLM_CPU_KVCACHE_SPACE GiB per rank (each worker
    allocates it, vllm/platforms/cpu.py:323-327, vllm/v1/worker/cpu_worker.py:213-228).
    CUDA: vLLM sizes it at startup from gpu_memory_utilization and what the weights and
    activations left, not knowable before launch: the engine's record in the trace
    (num_gpu_blocks × block_size tokens, each token's KV over every rank). Neither:
    CrossCheckUnknown naming why."""
    if stack.device == "cpu":
        tp = stack.vllm.tensor_parallel_size
        gib = float(stack.vllm.kvcache_space_gib * tp)
        return KvPool(gib, f"stack.vllm.kvcache_space_gib × TP {tp} (VLLM_CPU_KVCACHE_SPACE)")
    if cal.engine_kv_tokens > 0:
        gib = cal.engine_kv_tokens * cal.kv_bytes_per_token / GIB
        return KvPool(gib, f"the engine's KV pool, {cal.engine_kv_tokens} tokens (trace)")
    raise CrossCheckUnknown(
        f"stack.device {stack.device}: vLLM sizes its KV pool at startup from "
        "gpu_memory_utilization and the adapter trace has no engine record of it"
    )


def sim_spec(spec: TempoKVSpec, cal: Calibration) -> TempoKVSpec:
    run = spec.serving
    if run.arrivals.process != "fixed" or run.turns > 1:
        raise CrossCheckUnknown(
            f"serving.arrivals.process {run.arrivals.process}, serving.turns {run.turns}: the "
            "simulation replays fixed arrivals of one-turn requests only"
        )
    pool = kv_pool(run.stack, cal)
    l1_mib = run.stack.lmcache.l1_size_bytes / (1 << 20)
    docs = [run.documents_tokens[i % len(run.documents_tokens)] for i in range(run.num_requests)]
    return spec.model_copy(
        update={
            "device": spec.device.model_copy(
                update={
                    "staging_gib_s": cal.staging_bytes_s / GIB,
                    "contention": 0.0,  # the shaped L2 is one FIFO device
                    "concurrency": 1,
                    "retrieval_gib_s": run.retrieval_bytes_s / GIB,  # the adapter's assumption
                    "fast_tier_gib": l1_mib / 1024,
                    "budget_fraction": run.budget_mib / l1_mib,
                }
            ),
            "engine": spec.engine.model_copy(
                update={
                    "max_seqs": run.stack.vllm.max_num_seqs,
                    "max_batched_tokens": cal.max_step_tokens,
                    "loads": "queued",
                    # the server module releases a claim after its retrieve: the transfer
                    "release": "transfer_end",
                    "gpu_kv_gib": pool.gib,
                    "chunk_tokens": run.stack.lmcache.chunk_size,
                }
            ),
            "workload": spec.workload.model_copy(
                update={
                    "documents_tokens": docs,
                    "question_tokens": run.question_tokens,
                    "arrivals": FixedArrivals(interval_s=run.interval_s),
                    "output": spec.workload.output.model_copy(
                        update={
                            "max_tokens": run.max_tokens,
                            "eos_fraction": 0.0,
                            "min_tokens": 1,
                        }  # fmt: skip
                    ),
                }
            ),
        }
    )


def simulate_like_serving(
    spec: TempoKVSpec, cal: Calibration, policies: list[str]
) -> dict[str, dict[str, float]]:
    """Each policy's C and p95 in the simulation set up like the serving run
    (CrossCheckUnknown when it cannot be)."""
    s = sim_spec(spec, cal)
    stack = spec.serving.stack
    name = "tiny" if stack.vllm.model == "tiny" else Path(stack.vllm.model).name
    model = ModelProfile(
        f"{name}-{stack.device}",
        cal.kv_bytes_per_token,
        cal.cost(),
        gpu_kv_gib=kv_pool(stack, cal).gib,
    )
    out = {}
    for policy in policies:
        m = simulate_policy(s, model, 1.0, s.device.fast_tier_gib, policy, keep_trace=False)
        meas = m.measures()
        c = meas.c_gib_s_per_req * 1024  # reserved from commit: the model's byte-time
        out[policy] = {"c": c, "c_reserved": c, "p95": meas.p95_ttft_s}
    return out


def serving_rows(evidence: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Each policy's pooled C and p95 (over every repeat) from the run's summary. `c` is
    the serving C, from the sampled pins (objects locked once staged); `c_reserved` the
    provider's byte-time of capacity reserved from commitment (staging in flight and
    queued included), which is what the simulation's C integrates."""
    return {
        policy: {"c": m.c_mib_s_per_req, "c_reserved": m.model_c_mib_s_per_req, "p95": m.p95_ttft_s}
        for policy, m in policy_rows(evidence["summary"]).items()
    }


def orderings(
    serving: Mapping[str, Mapping[str, float]], sim: Mapping[str, Mapping[str, float]]
) -> dict[str, OrderingAgreement]:
    return {m: compare(serving, sim, m) for m in ("c", "c_reserved", "p95")}
