"""TempoKV-U's time-to-use: a distribution, not a point.

TempoKV's TTU projects every sequence with its conditional mean of remaining output, so a
sequence that ends early on EOS frees its slot before the projection said and the claim
behind it is late. Here each remaining output length is a draw from the empirical
distribution of recent completed outputs (early EOS included) conditioned on what the
sequence has produced, the draws are independent across sequences, and the same engine
projection maps each joint draw to a TTU. The claim's TTU is the q-quantile of those TTUs.

The draws are `SCENARIOS` deterministic scenarios, not random ones: scenario k takes level
u = frac((k + ½)/S + i·φ) for the i-th sequence of the snapshot (running, then holding,
then waiting), φ the golden ratio's conjugate. Each sequence's S levels cover the S strata
of [0, 1) once, so its marginal is exact to 1/S, and the irrational shift decorrelates the
sequences. A run stays a pure function of its inputs. Scenarios with identical lengths
(every output at the limit, say) are projected once; where every remaining-output
distribution is a point, every scenario is TempoKV's projection and so is the quantile."""

from __future__ import annotations

import math
from collections.abc import Collection

from bsrctl.tempokv.ttu import (
    CostModel,
    EngineLimits,
    EngineSnapshot,
    OutputPredictor,
    project_with_outputs,
    waiting_reach,
)

SCENARIOS = 16
_PHI = (math.sqrt(5.0) - 1.0) / 2.0


def scenario_level(k: int, i: int, scenarios: int = SCENARIOS) -> float:
    """Quantile level of sequence i in scenario k."""
    return ((k + 0.5) / scenarios + i * _PHI) % 1.0


def lower_quantile(values: list[float], q: float) -> float:
    """The smallest value whose empirical CDF reaches q (0 < q ≤ 1)."""
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs) - 1e-9) - 1))]


def project_ttu_quantiles(
    snap: EngineSnapshot,
    cost: CostModel,
    limits: EngineLimits,
    predictor: OutputPredictor,
    q: float,
    targets: Collection[str] | None = None,
    scenarios: int = SCENARIOS,
) -> dict[str, float]:
    """The q-quantile of each waiting request's TTU (seconds after snap.at_s) over the
    scenarios; with `targets`, only as far down the queue as they reach."""
    n_run, n_hold = len(snap.running), len(snap.holding)
    reach = waiting_reach(snap.waiting, targets)  # later requests never move these TTUs
    per_request: dict[str, list[float]] = {}
    projected: dict[tuple[float, ...], dict[str, float]] = {}
    for k in range(scenarios):
        running = [
            predictor.remaining_quantile(r.generated_tokens, scenario_level(k, i, scenarios))
            for i, r in enumerate(snap.running)
        ]
        holding = [
            predictor.remaining_quantile(0, scenario_level(k, n_run + j, scenarios))
            for j in range(n_hold)
        ]
        waiting = [
            predictor.remaining_quantile(0, scenario_level(k, n_run + n_hold + j, scenarios))
            for j in range(reach)
        ] + [0.0] * (len(snap.waiting) - reach)
        key = (*running, *holding, *waiting)
        ttus = projected.get(key)
        if ttus is None:
            ttus = project_with_outputs(snap, running, holding, waiting, cost, limits, targets)
            projected[key] = ttus
        for req_id, ttu_s in ttus.items():
            per_request.setdefault(req_id, []).append(ttu_s)
    return {req_id: lower_quantile(ttus, q) for req_id, ttus in per_request.items()}
