"""Figure 6's regime in virtual time: when can timing staging beat a baseline whose flash
reads start only when vLLM asks for a request's KV? The flash-tier spec (its documents,
fast tier, budget, flash rate and engine, scaled back to the paper's sizes) under the
simulation's H100 Llama-3.1-8B (`bsrctl/tempokv/sim/models.py`, calibrated on Figures 1, 2
and 5 only), for each engine load mode:

- ``sync``: a step waits for the KV loads it carries, so a load's flash read stalls the batch;
- ``queued``: vLLM 0.32 with LMCache's MP connector (what the serving stack runs): a loading
  request waits outside the running set, and a pass with a free slot starts the loads of
  every waiting request that fits the GPU's KV.

Demand (its read starts at the retrieval request) stands for LMCache-DAX, whose retrieve
faults its pages in then: its non-resident bytes are read at the flash's demand rate (4 KiB
faults, one in flight), TempoKV's stagings at its staging rate (bulk reads). The demand rate
is ``--demand-ratio`` times the staging rate (default: 1 and the spec's
``demand_mib_s / flash_mib_s``). Per demand ratio, mode and rate: both policies' p95 TTFT
and output tok/s, their ratios as median [min, max] over output-length seeds, and Demand's
flash idle while a request waited (``fig6/headroom.py``): the time advance staging could
fill.

    python bench/tempokv/fig6_regime.py [SPEC.yaml] [--seeds N] [--engine-scale S]
        [--demand-ratio R ...] [RATES…]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from fig6 import dax
from fig6.headroom import Interval, idle_while_waiting

from bsrctl.tempokv.experiments.cells import simulate_policy
from bsrctl.tempokv.sim.models import ModelProfile, make_profile
from bsrctl.tempokv.sim.run import SimResult
from bsrctl.tempokv.spec import DeviceSpec, OutputSpec, TempoKVSpec

MODEL = "llama-3.1-8b"
LOADS = ("sync", "queued")
POLICIES = ("demand", "tempokv")
# the flash-tier spec divides the paper's tokens by 8 and its bytes by 1024 (its header)
TOKENS_PER_SPEC_TOKEN = 8
GIB_PER_SPEC_MIB = 1.0


@dataclass(frozen=True)
class Point:
    """One policy at one (mode, rate, seed); ``engine_s``: the median time from a request's
    transfer end to its last token (the engine's work once its KV is in); ``ordinary``:
    its reads of claims the budget left uncommitted (Demand's are demand reads anyway)."""

    p95_s: float
    tok_s: float
    idle_wait_s: float
    engine_s: float
    ordinary: int = 0  # reads of claims not committed (at the retrieval, same device)


def paper_spec(
    serving_spec: TempoKVSpec,
    loads: str,
    rate: float,
    seed: int,
    gpu_kv_gib: float | None = None,
    retrieval_gib_s: float | None = None,
    flash_gib_s: float | None = None,
) -> TempoKVSpec:
    """The simulation's spec of the serving spec's §5.3 workload at the paper's scale; the
    GPU's KV is the model's H100 bound (the serving spec's 434 blocks are that bound scaled),
    the fast tier→GPU rate the calibrated one (Figure 1) and the flash's read rate the
    spec's staging rate unless given."""
    run = serving_spec.serving
    if run.fast_tier is None:
        raise ValueError("serving.fast_tier: the regime is the flash tier's; use its spec")
    tier = run.fast_tier
    return TempoKVSpec.model_validate({
        "kind": "tempokv", "name": f"{serving_spec.name}-paper", "seed": seed,
        "models": [{"name": MODEL}],
        "device": {"staging_gib_s": tier.flash_mib_s * GIB_PER_SPEC_MIB if flash_gib_s is None
                                    else flash_gib_s,
                   "fast_tier_gib": tier.fast_tier_mib * GIB_PER_SPEC_MIB,
                   "budget_fraction": run.budget_mib / tier.fast_tier_mib,
                   "retrieval_gib_s": DeviceSpec().retrieval_gib_s if retrieval_gib_s is None
                                      else retrieval_gib_s},
        "engine": {"max_seqs": run.max_num_seqs, "loads": loads, "gpu_kv_gib": gpu_kv_gib},
        "workload": {"documents_tokens": [d * TOKENS_PER_SPEC_TOKEN for d in run.documents_tokens],
                     "arrivals": {"kind": "fixed", "interval_s": 1.0 / rate},
                     "output": {"max_tokens": run.max_tokens,  # early EOS: the sim's default
                                "min_tokens": min(OutputSpec().min_tokens, run.max_tokens - 1)}},
        "experiment": {"kind": "policies", "policies": list(POLICIES), "cache_ratios": [1.0]},
    })  # fmt: skip


def scaled(model: ModelProfile, scale: float) -> ModelProfile:
    """Every step cost times ``scale`` (a faster or slower engine, the same KV bytes)."""
    c = model.cost
    cost = dataclasses.replace(
        c,
        step_base_s=c.step_base_s * scale,
        token_s=c.token_s * scale,
        attn_pair_s=c.attn_pair_s * scale,
        decode_ctx_token_s=c.decode_ctx_token_s * scale,
    )
    return dataclasses.replace(model, cost=cost)


def flash_idle_while_waiting(res: SimResult) -> float:
    """A request waits from arrival until its read starts; flash reads while a claim is
    STAGING and while an ordinary read runs (a claim not committed: read at the
    retrieval, through the same device; its span ends with its transfer, a bound)."""
    arrival = {lg.req.req_id: lg.req.arrival_s for lg in res.logs}
    waiting: list[Interval] = []
    reading: list[Interval] = []
    for cid, trace in res.claim_traces.items():
        at = {state: t for t, state in reversed(trace)}  # the first time of each state
        if "STAGING" in at:
            waiting.append((arrival[cid], at["STAGING"]))
            reading.append((at["STAGING"], at.get("STAGEREADY", at["STAGING"])))
    for lg in res.logs:
        if lg.path == "ordinary" and lg.retrieval_s is not None:
            waiting.append((lg.req.arrival_s, lg.retrieval_s))
            reading.append((lg.retrieval_s, lg.transfer_end_s or lg.retrieval_s))
    return idle_while_waiting(waiting, reading)


def point(spec: TempoKVSpec, model: ModelProfile, policy: str) -> Point:
    res = simulate_policy(spec, model, 1.0, spec.device.fast_tier_gib, policy)
    m = res.measures().to_json()
    engine = statistics.median(
        lg.done_s - lg.transfer_end_s
        for lg in res.logs
        if lg.done_s is not None and lg.transfer_end_s is not None
    )
    return Point(
        m["p95_ttft_s"], m["output_tok_s"], flash_idle_while_waiting(res), engine,
        res.ordinary_retrievals,
    )  # fmt: skip


def grid(
    serving_spec: TempoKVSpec,
    rates: Sequence[float],
    seeds: Sequence[int],
    scale: float = 1.0,
    gpu_kv_gib: float | None = None,
    retrieval_gib_s: float | None = None,
    demand_ratio: float = 1.0,
    staging_gib_s: float | None = None,
    loads_modes: Sequence[str] = LOADS,
) -> dict[tuple[str, float], dict[str, list[Point]]]:
    """Per mode and rate, each policy's point per seed. Demand reads at ``demand_ratio``
    times the staging rate (the spec's unless ``staging_gib_s``), TempoKV at the staging
    rate: every read of Demand is a retrieve's, every read of TempoKV a staging."""
    model = scaled(make_profile(MODEL), scale)
    tier = serving_spec.serving.fast_tier if serving_spec.serving else None
    if tier is None:
        raise ValueError("serving.fast_tier: the regime is the flash tier's; use its spec")
    staging = tier.flash_mib_s * GIB_PER_SPEC_MIB if staging_gib_s is None else staging_gib_s
    rate_of = {"demand": staging * demand_ratio, "tempokv": staging}
    out: dict[tuple[str, float], dict[str, list[Point]]] = {}
    for loads in loads_modes:
        for rate in rates:
            cell = out.setdefault((loads, rate), {p: [] for p in POLICIES})
            for seed in seeds:
                for policy in POLICIES:
                    spec = paper_spec(serving_spec, loads, rate, seed, gpu_kv_gib,
                                      retrieval_gib_s, rate_of[policy])  # fmt: skip
                    cell[policy].append(point(spec, model, policy))
    return out


def ratios(cell: dict[str, list[Point]], field: str) -> list[float]:
    return [getattr(t, field) / getattr(d, field)
            for t, d in zip(cell["tempokv"], cell["demand"], strict=True)]  # fmt: skip


def spread(xs: Sequence[float]) -> str:
    return f"{statistics.median(xs):.3g} [{min(xs):.3g}, {max(xs):.3g}]"


def lines(got: dict[tuple[str, float], dict[str, list[Point]]]) -> list[str]:
    out = []
    for (loads, rate), cell in got.items():
        d, t = cell["demand"], cell["tempokv"]

        def med(ps: list[Point], f: str) -> float:
            return statistics.median(getattr(p, f) for p in ps)

        out.append(
            f"{loads:6} @{rate:g} rps: demand p95 {med(d, 'p95_s'):.2f} s, "
            f"{med(d, 'tok_s'):.1f} tok/s, flash idle while waiting {med(d, 'idle_wait_s'):.2f} s,"
            f" engine after the KV is in {med(d, 'engine_s'):.3f} s | tempokv p95 "
            f"{med(t, 'p95_s'):.2f} s, {med(t, 'tok_s'):.1f} tok/s, ordinary reads "
            f"{sum(p.ordinary for p in t)} | "
            f"p95 tempokv/demand {spread(ratios(cell, 'p95_s'))}, "
            f"tput {spread(ratios(cell, 'tok_s'))}"
        )
    return out


def last_line(
    got: dict[tuple[str, float], dict[str, list[Point]]], prefix: str = "fig6-regime"
) -> str:
    parts = []
    for field, name in (("tok_s", "tput"), ("p95_s", "p95")):
        for loads in LOADS:
            at = " ".join(f"@{rate:g}={statistics.median(ratios(c, field)):.3g}"
                          for (mode, rate), c in got.items() if mode == loads)  # fmt: skip
            parts.append(f"{name} tempokv/demand {loads} {at}")
    return f"{prefix} " + " ".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("args", nargs="*", help="[SPEC.yaml] [RATES…]")
    ap.add_argument("--seeds", type=int, default=6, help="output-length seeds per cell")
    ap.add_argument("--engine-scale", type=float, default=1.0,
                    help="every H100 step cost times this (1: the calibrated model)")  # fmt: skip
    ap.add_argument(
        "--gpu-kv-gib",
        type=float,
        help="the GPU's KV (default: the H100's, as the flash-tier spec bounds it)",
    )
    ap.add_argument(
        "--retrieval-gib-s",
        type=float,
        help="fast tier→GPU (default: the calibrated 16.1, Figure 1)",
    )
    ap.add_argument(
        "--demand-ratio",
        type=float,
        nargs="+",
        help="demand read rate over staging rate (default: 1 and the spec's demand_mib_s / "
        "flash_mib_s)",
    )
    ns = ap.parse_args()
    if ns.demand_ratio is not None and any(r <= 0 for r in ns.demand_ratio):
        ap.error(f"--demand-ratio {ns.demand_ratio}: each must be > 0")
    if ns.seeds < 1:
        ap.error(f"--seeds {ns.seeds}: give 1 or more")
    if ns.engine_scale <= 0:
        ap.error(f"--engine-scale {ns.engine_scale}: give a number > 0")
    for flag in ("gpu_kv_gib", "retrieval_gib_s"):
        if getattr(ns, flag) is not None and getattr(ns, flag) <= 0:
            ap.error(f"--{flag.replace('_', '-')} {getattr(ns, flag)}: give a number > 0")
    read = dax.flash_spec_and_rates(ap, ns.args, "the regime")
    if isinstance(read, int):
        return read
    path, spec, rates = read
    seeds = [spec.seed + i for i in range(ns.seeds)]
    print(
        f"{path.name} at the paper's scale (tokens x{TOKENS_PER_SPEC_TOKEN}, MiB -> GiB), "
        f"{MODEL} on the simulation's H100 (step costs x{ns.engine_scale:g}), seeds {seeds}"
    )
    kv = make_profile(MODEL).gpu_kv_gib if ns.gpu_kv_gib is None else ns.gpu_kv_gib
    docs = [d * TOKENS_PER_SPEC_TOKEN for d in spec.serving.documents_tokens]
    print(f"GPU KV {kv:.1f} GiB; documents {min(docs)}-{max(docs)} tokens")
    tier = spec.serving.fast_tier
    demand_ratios = ns.demand_ratio or sorted({1.0, round(tier.demand_ratio, 4)}, reverse=True)
    print(f"flash: staging {tier.flash_mib_s * GIB_PER_SPEC_MIB:g} GiB/s; demand ratios "
          f"{demand_ratios} (the spec's {tier.demand_ratio:.4f})")  # fmt: skip
    finals = []
    for r in demand_ratios:
        got = grid(spec, rates, seeds, ns.engine_scale, ns.gpu_kv_gib, ns.retrieval_gib_s, r)
        print(f"demand ratio {r:g} (demand {tier.flash_mib_s * r:.3g} GiB/s):")
        print("\n".join(lines(got)))
        finals.append(last_line(got, f"ratio={r:g}"))
    print(dax.paper_line())
    print("fig6-regime " + " | ".join(finals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
