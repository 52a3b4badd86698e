"""What the simulation predicts for TempoKV against LMCache-DAX on a given flash tier,
before anything is served: the tier's two read rates (measured with fio,
``bsrctl/stack/launch/flash_probe.py``, or an operator's own device's figures) into the
regime's virtual time (``fig6_regime.py``), under the serving stack's engine loads
(``queued``: vLLM 0.32 with LMCache's MP connector). Per rate: the predicted p95 TTFT and
throughput ratios (median over output-length seeds) and Demand's flash idle while a request
waited (the headroom timing alone could fill, at these rates)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import fig6_regime as regime

from bsrctl.tempokv.spec import TempoKVSpec

LOADS = "queued"  # the serving stack's (vLLM 0.32 + LMCache's MP connector)
MIB = 1 << 20
# The CPU serving stack's engine in the simulation (engine scale, fast tier -> engine GiB/s),
# as measured before this bench had two read paths (docs/architecture/tempokv.md, the
# regime): 0.098 s from KV in to last token (the live spans' 94-141 ms), a resident retrieve
# of 4.6 MiB in about 6 ms. Fixed: not fitted to any ratio of Figure 6.
CPU_ENGINE = (0.25, 790.0)


@dataclass(frozen=True)
class Prediction:
    rate: float
    p95: float  # tempokv / lmcache-dax, median over seeds
    tput: float
    demand_idle_wait_s: float  # Demand's flash idle while a request waited (median)
    tempokv_ordinary: int  # TempoKV's reads the budget left uncommitted (all seeds)


def predict(
    spec: TempoKVSpec,
    rates: Sequence[float],
    staging_bytes_s: float,
    demand_bytes_s: float,
    seeds: int = 6,
    engine: tuple[float, float | None] = (1.0, None),
) -> list[Prediction]:
    """The flash-tier spec at the paper's scale (its MiB are the paper's GiB), its flash
    read at ``staging_bytes_s`` in bulk and ``demand_bytes_s`` on demand (the spec's
    scale: bytes per second of this tier); ``engine``: the step costs' scale and the fast
    tier -> engine rate (default: the simulation's calibrated H100; ``CPU_ENGINE``: the
    serving stack's)."""
    staging_gib_s = staging_bytes_s / MIB * regime.GIB_PER_SPEC_MIB
    got = regime.grid(
        spec, rates, [spec.seed + i for i in range(seeds)], engine[0], None, engine[1],
        demand_bytes_s / staging_bytes_s, staging_gib_s, (LOADS,),
    )  # fmt: skip
    out = []
    for rate in rates:
        cell = got[(LOADS, rate)]
        out.append(
            Prediction(
                rate,
                statistics.median(regime.ratios(cell, "p95_s")),
                statistics.median(regime.ratios(cell, "tok_s")),
                statistics.median(p.idle_wait_s for p in cell["demand"]),
                sum(p.ordinary for p in cell["tempokv"]),
            )
        )
    return out


def engine_scale_for(spec: TempoKVSpec, rate: float, engine_s: float) -> float:
    """The step-cost scale whose simulated engine time (a request's KV in to its last
    token, Demand's median at ``rate``, queued loads, seed of the spec) is ``engine_s``: the
    simulation set to an engine measured live (step costs scale every step alike)."""
    got = regime.grid(spec, [rate], [spec.seed], 1.0, None, CPU_ENGINE[1], 1.0, None, (LOADS,))
    return engine_s / got[(LOADS, rate)]["demand"][0].engine_s


def prediction_lines(
    preds: Sequence[Prediction], staging_bytes_s: float, demand_bytes_s: float, engine: str
) -> list[str]:
    head = (
        f"predicted ({LOADS} loads, {engine}, virtual time at the paper's scale): staging "
        f"{staging_bytes_s / MIB:.2f} MiB/s, demand {demand_bytes_s / MIB:.2f} MiB/s, ratio "
        f"{demand_bytes_s / staging_bytes_s:.3f}"
    )
    return [head] + [
        f"  @{p.rate:g} rps: p95 tempokv/lmcache-dax {p.p95:.3g}, tput {p.tput:.3g}; "
        f"LMCache-DAX's flash idle while a request waited {p.demand_idle_wait_s:.2f} s"
        + (f"; TempoKV ordinary reads {p.tempokv_ordinary}" if p.tempokv_ordinary else "")
        for p in preds
    ]


def inside(pred: Prediction, live: Mapping[str, tuple[float, float]]) -> dict[str, bool]:
    """Whether each predicted ratio lies in the live 95 % interval (``live``: what ->
    (lo, hi), what in ``p95``, ``tput``)."""
    return {k: live[k][0] <= getattr(pred, k) <= live[k][1] for k in ("p95", "tput")}
