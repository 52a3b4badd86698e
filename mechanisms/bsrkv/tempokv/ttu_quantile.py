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
from functools import lru_cache

from bsrkv.tempokv.ttu import (
    CostModel,
    EngineLimits,
    EngineSnapshot,
    OutputPredictor,
    project_with_outputs,
    waiting_reach,
)

SCENARIOS = 16
_PHI = (math.sqrt(5.0) - 1.0) / 2.0


@lru_cache(maxsize=4096)
def scenario_levels(i: int, scenarios: int = SCENARIOS) -> tuple[float, ...]:
    """Quantile levels of sequence i in scenarios 0..S−1."""
    return tuple(((k + 0.5) / scenarios + i * _PHI) % 1.0 for k in range(scenarios))


@lru_cache(maxsize=65536)
def _level_indices(i: int, count: int, scenarios: int) -> tuple[int, ...]:
    """Which of `count` sorted values each of sequence i's levels draws."""
    return tuple(min(count - 1, int(u * count)) for u in scenario_levels(i, scenarios))


def _draws(predictor: OutputPredictor, generated: int, i: int, scenarios: int) -> list[float]:
    """Sequence i's remaining output in each scenario: `remaining_quantile` at its levels."""
    limit = predictor.limit_tokens
    if generated >= limit:
        return [0.0] * scenarios
    xs, first, count = predictor.completions_above(generated)
    if count == 0:
        return [float(max(1, limit - generated))] * scenarios
    return [float(xs[first + j] - generated) for j in _level_indices(i, count, scenarios)]


def quantile_rank(q: float, n: int) -> int:
    """1-based rank of the lower q-quantile among n values."""
    return min(n, max(1, math.ceil(q * n - 1e-9)))


def lower_quantile(values: list[float], q: float) -> float:
    """The smallest value whose empirical CDF reaches q (0 < q ≤ 1)."""
    return sorted(values)[quantile_rank(q, len(values)) - 1]


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
    scenarios; with `targets`, only as far down the queue as they reach. Every distinct
    scenario is projected: the projection is not monotone in output lengths (a longer
    output can move a load into a different step), so none can be skipped by bounds."""
    reach = waiting_reach(snap.waiting, targets)  # later requests never move these TTUs
    generated = [r.generated_tokens for r in snap.running]
    generated += [0] * (len(snap.holding) + reach)
    # one column of S draws per sequence, then one row (scenario) per distinct joint draw
    columns = [_draws(predictor, n, i, scenarios) for i, n in enumerate(generated)]
    n_run, n_hold = len(snap.running), len(snap.holding)
    pad = [0.0] * (len(snap.waiting) - reach)
    counts: dict[tuple[float, ...], int] = {}
    for row in zip(*columns, strict=True) if columns else [()] * scenarios:
        counts[row] = counts.get(row, 0) + 1
    per_request: dict[str, list[float]] = {}
    for row, count in counts.items():
        ttus = project_with_outputs(
            snap,
            row[:n_run],
            row[n_run : n_run + n_hold],
            [*row[n_run + n_hold :], *pad],
            cost,
            limits,
            targets,
        )
        for req_id, ttu_s in ttus.items():
            per_request.setdefault(req_id, []).extend([ttu_s] * count)
    return {req_id: lower_quantile(ttus, q) for req_id, ttus in per_request.items()}
