"""Figures 4 and 5: every policy of the spec on identical seeded traces, per (model, fast
tier, cache ratio) cell; the paper's claims about them, and each causal policy's distance
to the oracle."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bsrctl.evidence import EvidenceWriter, Point
from bsrctl.tempokv.experiments.cells import device_config, invariants, simulate_policy
from bsrctl.tempokv.experiments.expectations import Claim, JudgedCheck, judge
from bsrctl.tempokv.experiments.paper import CLAIMS, PAPER_FIG4, PAPER_SIX
from bsrctl.tempokv.measures import SimMeasures
from bsrctl.tempokv.sim.models import make_profile
from bsrctl.tempokv.spec import PolicyAcceptance, PolicyGrid, TempoKVSpec
from bsrkv.tempokv.kv import GIB

Progress = Callable[[str], None]
Cells = dict[tuple[str, float, float], dict[str, SimMeasures]]


def run_grid(
    spec: TempoKVSpec, exp: PolicyGrid, writer: EvidenceWriter, say: Progress
) -> tuple[dict[str, Any], list[JudgedCheck]]:
    sizes = exp.fast_tier_gib or [spec.device.fast_tier_gib]
    cells: Cells = {}
    for mspec in spec.models:
        model = make_profile(mspec.name, mspec.step_overhead_s)
        for size in sizes:
            device = device_config(spec, size)
            for ratio in exp.cache_ratios:
                cell = cells.setdefault((model.name, size, ratio), {})
                for policy in exp.policies:
                    res = simulate_policy(spec, model, ratio, size, policy)
                    measures = res.measures()
                    cell[policy] = measures
                    writer.add_point(
                        Point(
                            id=f"{model.name}/ratio={ratio:g}/fast={size:g}GiB/{policy}",
                            params={
                                "model": model.name,
                                "cache_ratio": ratio,
                                "fast_tier_gib": size,
                                "budget_gib": device.budget_bytes / GIB,
                                "policy": policy,
                                "requests": len(res.logs),
                            },
                            measures=measures.to_json(),
                            checks=invariants(res),
                            extra={"extra": {"claims": res.claim_traces}},
                        )
                    )
                    say(
                        f"{model.name} ratio={ratio:g} fast={size:g}GiB {policy}: "
                        f"C={measures.c_gib_s_per_req:.2f} p95={measures.p95_ttft_s:.2f}s "
                        f"{measures.output_tok_s:.1f} tok/s"
                    )
    summary = {
        "experiment": "policies",
        "spec_name": spec.name,
        "cells": [
            {
                "model": m,
                "fast_tier_gib": s,
                "cache_ratio": r,
                "policies": {p: m.to_json() for p, m in pol.items()},
                "paper": {p: list(v) for p, v in _paper(m, s, r).items()},
                "to_oracle": to_oracle(pol),
            }
            for (m, s, r), pol in cells.items()
        ],
    }
    return summary, grid_checks(exp.acceptance, cells)


def _paper(model: str, size: float, ratio: float) -> dict[str, tuple[float, float, float]]:
    """Figure 4's bars, where the paper has the cell (its default 100 GiB fast tier)."""
    return PAPER_FIG4.get((model, ratio), {}) if size == 100 else {}


def to_oracle(pol: dict[str, SimMeasures]) -> dict[str, dict[str, float]]:
    """Each causal policy's C and p95 TTFT as multiples of the oracle's."""
    o = pol.get("oracle")
    if o is None:
        return {}
    return {
        name: {
            "c": m.c_gib_s_per_req / o.c_gib_s_per_req,
            "p95": m.p95_ttft_s / o.p95_ttft_s,
        }
        for name, m in pol.items()
        if name != "oracle"
    }


def grid_checks(acc: PolicyAcceptance, cells: Cells) -> list[JudgedCheck]:
    out: list[JudgedCheck] = []
    for (model, size, ratio), pol in cells.items():
        where = f"{model} ratio={ratio:g} fast={size:g}GiB"
        t = pol.get("tempokv")
        if acc.c_reduction_vs_immediate is not None:
            exp = acc.c_reduction_vs_immediate
            out.append(
                judge(_c_reduction(where, t, pol.get("immediate"), exp), exp, CLAIMS["c_reduction"])
            )
        if acc.p95_below_demand is not None:
            exp = acc.p95_below_demand
            claim = _p95_below_demand(where, t, pol.get("demand"), exp.tolerance_pct)
            out.append(judge(claim, exp, CLAIMS["p95_below_demand"]))
        best = acc.best_at_fast_tier
        if best is not None and size == best.fast_tier_gib:
            claim = _best(where, pol, best.tolerance_pct)
            out.append(judge(claim, best, CLAIMS["tempokv_best"]))
    flat = acc.flat_across_fast_tier
    if flat is not None:
        out.extend(judge(c, flat, CLAIMS["flat_across_fast_tier"]) for c in _flat(cells, flat))
    return out


def _c_reduction(where: str, t: SimMeasures | None, imm: SimMeasures | None, exp: Any) -> Claim:
    name = f"c_reduction[{where}]"
    if t is None or imm is None:
        return Claim(name, "c_reduction", None, "tempokv or immediate not run")
    red = 100 * (1 - t.c_gib_s_per_req / imm.c_gib_s_per_req)
    floor = exp.at_least_pct - exp.tolerance_pct
    return Claim(
        name,
        "c_reduction",
        red >= floor,
        f"TempoKV C {t.c_gib_s_per_req:.2f} vs Immediate {imm.c_gib_s_per_req:.2f} "
        f"GiB·s/req: {red:.1f}% below (claim: at least {exp.at_least_pct:g}%, "
        f"tolerance {exp.tolerance_pct:g} points)",
    )


def _p95_below_demand(
    where: str, t: SimMeasures | None, dem: SimMeasures | None, tol_pct: float
) -> Claim:
    name = f"p95_below_demand[{where}]"
    if t is None or dem is None:
        return Claim(name, "p95_below_demand", None, "tempokv or demand not run")
    ok = t.p95_ttft_s < dem.p95_ttft_s * (1 + tol_pct / 100)
    tol = f" (tolerance {tol_pct:g}%)" if tol_pct else ""
    return Claim(
        name,
        "p95_below_demand",
        ok,
        f"TempoKV p95 {t.p95_ttft_s:.3f} s vs Demand {dem.p95_ttft_s:.3f} s{tol}",
    )


def _best(where: str, pol: dict[str, SimMeasures], tol_pct: float) -> Claim:
    name = f"tempokv_best[{where}]"
    t = pol.get("tempokv")
    others = {p: m for p, m in pol.items() if p in PAPER_SIX and p != "tempokv"}
    if t is None or not others:
        return Claim(name, "tempokv_best", None, "tempokv or the paper's other five not run")
    tol = tol_pct / 100
    best_tput = max(others.values(), key=lambda m: m.output_tok_s)
    best_mean = min(others.values(), key=lambda m: m.mean_ttft_s)
    best_p95 = min(others.values(), key=lambda m: m.p95_ttft_s)
    ok = (
        t.output_tok_s >= best_tput.output_tok_s * (1 - tol)
        and t.mean_ttft_s <= best_mean.mean_ttft_s * (1 + tol)
        and t.p95_ttft_s <= best_p95.p95_ttft_s * (1 + tol)
    )

    def who(m: SimMeasures) -> str:
        return next(p for p, v in others.items() if v is m)

    return Claim(
        name,
        "tempokv_best",
        ok,
        f"TempoKV {t.output_tok_s:.1f} tok/s, mean {t.mean_ttft_s:.3f} s, p95 "
        f"{t.p95_ttft_s:.3f} s; best of the other five: {best_tput.output_tok_s:.1f} "
        f"tok/s ({who(best_tput)}), mean {best_mean.mean_ttft_s:.3f} s ({who(best_mean)}), "
        f"p95 {best_p95.p95_ttft_s:.3f} s ({who(best_p95)})",
    )


def _flat(cells: Cells, flat: Any) -> list[Claim]:
    by_line: dict[tuple[str, float], list[tuple[float, SimMeasures]]] = {}
    for (model, size, ratio), pol in cells.items():
        if "tempokv" in pol:
            by_line.setdefault((model, ratio), []).append((size, pol["tempokv"]))
    out = []
    for (model, ratio), rows in by_line.items():
        name = f"flat_across_fast_tier[{model} ratio={ratio:g}]"
        if len(rows) < 2:
            out.append(Claim(name, "flat_across_fast_tier", None, "one fast-tier size only"))
            continue
        rows.sort(key=lambda r: -r[0])
        top = rows[0][1]
        worst_tput = max(abs(m.output_tok_s / top.output_tok_s - 1) for _, m in rows)
        worst_p95 = max(abs(m.p95_ttft_s / top.p95_ttft_s - 1) for _, m in rows)
        tol = flat.tolerance_pct / 100
        by_size = ", ".join(
            f"{s:g} GiB {m.output_tok_s:.1f} tok/s {m.p95_ttft_s:.3f} s" for s, m in rows
        )
        out.append(
            Claim(
                name,
                "flat_across_fast_tier",
                worst_tput <= tol and worst_p95 <= tol,
                f"TempoKV {by_size}: throughput within {100 * worst_tput:.1f}%, p95 within "
                f"{100 * worst_p95:.1f}% of the largest size's (tolerance {flat.tolerance_pct:g}%)",
            )
        )
    return out
