"""From a TempoKV spec to the simulation's inputs, and one cell of it run: the device,
engine limits, controller settings and request trace a spec describes (also the benches'
entry point), and the invariants every simulated point is checked against."""

from __future__ import annotations

import random

from bsrctl.errors import BadInput
from bsrctl.evidence.verdict import Check, check
from bsrctl.tempokv.sim.device import DeviceConfig
from bsrctl.tempokv.sim.models import ModelProfile
from bsrctl.tempokv.sim.oracle import simulate_oracle
from bsrctl.tempokv.sim.run import ControlConfig, SimResult, simulate
from bsrctl.tempokv.sim.workload import OutputLengths, Request, fixed_interval, poisson, replay
from bsrctl.tempokv.spec import TempoKVSpec
from bsrkv.tempokv.claims import TERMINAL, ClaimState
from bsrkv.tempokv.kv import GIB
from bsrkv.tempokv.ttu import EngineLimits


def device_config(spec: TempoKVSpec, fast_tier_gib: float | None = None) -> DeviceConfig:
    d = spec.device
    capacity_gib = fast_tier_gib if fast_tier_gib is not None else d.fast_tier_gib
    return DeviceConfig(
        staging_bytes_s=d.staging_gib_s * GIB,
        contention=d.contention,
        concurrency=d.concurrency,
        retrieval_bytes_s=d.retrieval_gib_s * GIB,
        capacity_bytes=int(capacity_gib * GIB),
        budget_bytes=int(capacity_gib * d.budget_fraction * GIB),
    )


def output_lengths(spec: TempoKVSpec) -> OutputLengths:
    o = spec.workload.output
    return OutputLengths(o.max_tokens, o.eos_fraction, o.min_tokens)


def control_config(spec: TempoKVSpec) -> ControlConfig:
    outputs = output_lengths(spec)
    rng = random.Random(f"calibration-{spec.seed}")  # not the trace's stream
    prior = tuple(outputs.draw(rng) for _ in range(spec.control.output_prior_samples))
    c = spec.control
    return ControlConfig(
        c.tick_s, c.rate_prior_s, outputs.max_tokens, prior, c.crossing_wakeup, c.ttu_quantile
    )


def requests_for(spec: TempoKVSpec, model: ModelProfile, ratio: float) -> list[Request]:
    w, chunk = spec.workload, spec.engine.chunk_tokens
    a = w.arrivals
    kv = model.kv_bytes_per_token
    if a.kind == "fixed":
        return fixed_interval(
            w.documents_tokens,
            a.interval_s,
            ratio,
            w.question_tokens,
            output_lengths(spec),
            spec.seed,
            chunk,
            kv,
        )
    if a.kind == "poisson":
        return poisson(
            w.documents_tokens,
            a.rate_rps,
            a.num_requests,
            ratio,
            w.question_tokens,
            output_lengths(spec),
            spec.seed,
            chunk,
            kv,
        )
    if not a.path.is_file():
        raise BadInput(f"workload.arrivals.path: {a.path} does not exist; give a JSON-lines trace")
    return replay(a.path, ratio, output_lengths(spec), spec.seed, chunk, kv)


def simulate_policy(
    spec: TempoKVSpec,
    model: ModelProfile,
    ratio: float,
    fast_tier_gib: float,
    policy: str,
    keep_trace: bool = True,
) -> SimResult:
    """One (model, cache ratio, fast tier, policy) cell of a spec, as `bsrctl tempokv` runs
    it (also the benches' entry point). The oracle runs to its fixed point."""
    requests = requests_for(spec, model, ratio)
    device = device_config(spec, fast_tier_gib)
    limits = engine_limits(spec, model)
    longest = max((r.prompt_tokens for r in requests), default=0)
    if limits.queued_loads and limits.gpu_kv_tokens and longest > limits.gpu_kv_tokens:
        raise BadInput(
            f"engine.gpu_kv_gib: {model.name} holds {limits.gpu_kv_tokens} tokens of KV, below "
            f"the longest prompt ({longest} tokens); raise engine.gpu_kv_gib or shorten the "
            "documents"
        )
    control = control_config(spec)
    if policy == "oracle":
        return simulate_oracle(requests, model, device, limits, control, keep_trace)
    return simulate(requests, model, device, limits, control, policy, keep_trace)


def engine_limits(spec: TempoKVSpec, model: ModelProfile) -> EngineLimits:
    e = spec.engine
    kv_gib = e.gpu_kv_gib if e.gpu_kv_gib is not None else model.gpu_kv_gib
    return EngineLimits(
        max_seqs=e.max_seqs,
        max_batched_tokens=e.max_batched_tokens,
        sync_loads=e.loads == "sync",
        release_at_first_step=e.release == "first_step",
        queued_loads=e.loads == "queued",
        gpu_kv_tokens=int(kv_gib * GIB) // model.kv_bytes_per_token,
    )


def invariants(res: SimResult) -> tuple[Check, ...]:
    m = res.measures()
    unfinished = [
        cid for cid, tr in res.claim_traces.items() if ClaimState[tr[-1][1]] not in TERMINAL
    ]
    return (
        check(
            "budget_respected",
            res.peak_reserved_bytes <= res.budget_bytes,
            f"peak reserved {res.peak_reserved_bytes / GIB:.2f} GiB, "
            f"budget {res.budget_bytes / GIB:.2f} GiB",
        ),
        check("all_completed", m.completed == m.requests, f"{m.completed}/{m.requests}"),
        check(
            "reservations_released",
            not res.p_trace or res.p_trace[-1][1] == 0,
            f"P at end {res.p_trace[-1][1] if res.p_trace else 0} B",
        ),
        check("claims_terminal", not unfinished, f"unfinished: {unfinished[:5]}"),
    )
