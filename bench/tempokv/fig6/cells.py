"""One cell of Figure 6 (an arm at a rate, one repeat) and what the bench makes of the cells:
the table per rate (medians over repeats and the per-repeat ratios' spread), the claims
decided on the paired repeats, the evidence's points and the last line."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bsrctl.evidence.verdict import Check, check
from bsrctl.experiments.bench import SEED, bench_point
from bsrctl.stats import paired_ratio_ci
from bsrctl.tempokv.experiments.expectations import ordering_claim

BASE = "lmcache"  # today's analogue's baseline: stock LMCache, DRAM L1 + shaped FS L2
DAX_BASE = "lmcache-dax"  # §5.3's: unmodified LMCache, its whole L1 on the flash tier
NAMES = {"tempokv": "TempoKV", "adapter": "adapter only", "adapter-local": "adapter, no RPC",
         "lmcache-retain": "stock + retain", "lmcache-t1": "stock, server 1 thread",
         BASE: "LMCache", DAX_BASE: "LMCache-DAX"}  # fmt: skip

Cells = list[dict[str, dict[float, "Cell"]]]  # per repeat: arm -> rate -> cell


def arm_orders(repeats: int, arms: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The arms' order in each repeat: AB, BA, AB, ... (drift over the run hits both)."""
    return [arms if k % 2 == 0 else arms[::-1] for k in range(repeats)]


@dataclass(frozen=True)
class Spread:
    median: float
    lo: float
    hi: float


def spread(xs: Sequence[float]) -> Spread:
    """Median, min and max of the per-repeat values (NaN when there are none)."""
    if not xs:
        return Spread(math.nan, math.nan, math.nan)
    return Spread(statistics.median(xs), min(xs), max(xs))


def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


@dataclass(frozen=True)
class Cell:
    p95_s: float
    tok_s: float
    canonical: int
    requests: int
    controller: str  # what tempokv.status said after the cell ("" for the baseline)
    goodput: float = math.nan  # share of requests with TTFT <= serving.slo_ttft_s (NaN: none)
    retrieves_s: tuple[float, ...] = ()  # each stock retrieve's time in the server (bsr.status)
    request_ids: tuple[str, ...] = ()  # the client's ids, arrival order (the timeline's)
    # the flash tier's cell: what clearing left, the cgroup's memory.stat and the throttle's
    # counters before and after, the bytes read from flash (None: not on the flash tier)
    tier: dict[str, Any] | None = field(default=None, compare=False)


def table(
    rates: Sequence[float], cells: Cells, arm: str = "tempokv", base: str = BASE
) -> list[str]:
    name, bname = NAMES[arm], NAMES[base]
    lines = [
        f"| rate rps | {bname} p95 TTFT s | {name} p95 TTFT s | {bname} tok/s | {name} tok/s "
        f"| p95 {name}/{bname} median [min–max] | tput {name}/{bname} median [min–max] "
        f"| canonical {bname}, {name} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rate in rates:
        lm = [c[base][rate] for c in cells]
        tk = [c[arm][rate] for c in cells]
        p95 = spread([ratio(t.p95_s, m.p95_s) for m, t in zip(lm, tk, strict=True)])
        tput = spread([ratio(t.tok_s, m.tok_s) for m, t in zip(lm, tk, strict=True)])
        lines.append(
            f"| {rate:g} | {spread([c.p95_s for c in lm]).median:.3f} "
            f"| {spread([c.p95_s for c in tk]).median:.3f} "
            f"| {spread([c.tok_s for c in lm]).median:.1f} "
            f"| {spread([c.tok_s for c in tk]).median:.1f} "
            f"| {p95.median:.3f} [{p95.lo:.3f}–{p95.hi:.3f}] "
            f"| {tput.median:.3f} [{tput.lo:.3f}–{tput.hi:.3f}] "
            f"| {sum(c.canonical for c in lm)}/{sum(c.requests for c in lm)}, "
            f"{sum(c.canonical for c in tk)}/{sum(c.requests for c in tk)} |"
        )
    return lines


def claims(
    rates: Sequence[float], cells: Cells, arm: str = "tempokv", base: str = BASE
) -> list[str]:
    """The paper's Figure 6 claims per rate, judged on the paired repeats (repeat k of both
    arms; ``expectations.ordering_claim``): ``arm``'s throughput >= the baseline's and its
    p95 TTFT <= the baseline's, each PASS / FAIL / UNKNOWN with the ratio's 95 % interval."""
    return [f"claim {c.detail}" for c in claim_checks(rates, cells, arm, base)]


def claim_checks(
    rates: Sequence[float], cells: Cells, arm: str = "tempokv", base: str = BASE, tag: str = ""
) -> list[Check]:
    """The claims as the run's checks (PASS, FAIL, or UNKNOWN while the interval straddles);
    ``tag`` heads each name (a demand ratio's, where a run has several)."""
    out = []
    for rate in rates:
        lm = [c[base][rate] for c in cells]
        tk = [c[arm][rate] for c in cells]
        keys = [("tput", "a>=b", "tok_s"), ("p95", "a<=b", "p95_s")]
        if not any(math.isnan(c.goodput) for c in lm + tk):
            keys.append(("goodput", "a>=b", "goodput"))
        for what, claim, key in keys:
            name = f"{tag}{what} {arm}/{base} @{rate:g}"
            a, b = [getattr(c, key) for c in tk], [getattr(c, key) for c in lm]
            got = ordering_claim(name, what, a, b, claim, name)
            out.append(check(name.replace(" ", "_"), got.reproduced, got.detail))
    return out


def bench_points(
    rates: Sequence[float], cells: Cells, arms: Sequence[str], demand_ratio: float | None = None
) -> list[Any]:
    """The bench's evidence: a point per (arm, rate[, demand ratio]), its per-repeat p95
    TTFT, tok/s and goodput as samples (repeat order), every output checked against the
    canonical one; on the flash tier each repeat's bytes read from flash as a sample (the
    cells' counters go to the summary: ``tier_cells``)."""
    out = []
    for arm in arms:
        for rate in rates:
            cs = [c[arm][rate] for c in cells]
            samples = {"p95_ttft_s": [c.p95_s for c in cs], "tok_s": [c.tok_s for c in cs],
                       "retrieve_s": [x for c in cs for x in c.retrieves_s]}  # fmt: skip
            if not any(math.isnan(c.goodput) for c in cs):
                samples["goodput"] = [c.goodput for c in cs]
            if all(c.tier is not None for c in cs):
                samples["flash_read_bytes"] = [c.tier["flash_read_bytes"] for c in cs]  # type: ignore[index]
            same, n = sum(c.canonical for c in cs), sum(c.requests for c in cs)
            canon = check("canonical_output", same == n, f"{same}/{n} outputs canonical")
            params: dict[str, Any] = {"arm": arm, "rate_rps": rate}
            name = f"fig6/{arm}@{rate:g}"
            if demand_ratio is not None:
                params["demand_ratio"] = demand_ratio
                name += f"/ratio={demand_ratio:g}"
            measures: dict[str, Any] = {"canonical": same, "requests": n}
            out.append(bench_point(name, params, samples, measures, [canon]))
    return out


def last_line(
    rates: Sequence[float], cells: Cells, arm: str = "tempokv", base: str = BASE,
    prefix: str = "fig6",
) -> str:  # fmt: skip
    """``fig6 tput tempokv/lmcache @2=R [lo, hi] ... p95 tempokv/lmcache @2=...``: the
    median of the per-repeat ratios with its 95 % bootstrap interval, per rate."""
    parts = []
    for what, key in (("tput", "tok_s"), ("p95", "p95_s")):
        per = []
        for rate in rates:
            a = [getattr(c[arm][rate], key) for c in cells]
            b = [getattr(c[base][rate], key) for c in cells]
            try:
                per.append(f"@{rate:g}={paired_ratio_ci(a, b, SEED).text(3)}")
            except ValueError as e:  # a NaN repeat (no request finished)
                per.append(f"@{rate:g}=n/a ({e})")
        parts.append(f"{what} {arm}/{base} " + " ".join(per))
    return f"{prefix} " + " ".join(parts)


def tier_cells(rates: Sequence[float], cells: Cells, arms: Sequence[str]) -> dict[str, Any]:
    """Per arm and rate, each repeat's flash-tier cell (clearing, memory.stat, throttle)."""
    return {arm: {f"{rate:g}": [c[arm][rate].tier for c in cells] for rate in rates}
            for arm in arms}  # fmt: skip
