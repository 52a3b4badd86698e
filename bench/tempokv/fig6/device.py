"""Figure 6 across the flash's two read paths (``--baseline dax --demand-ratio R ...``): the
device measured first (fio inside a tier of the spec's own, per ratio), then per ratio
what each arm's flash read cost per MiB, the simulation's prediction beside the live
ratios, and the decomposition of TempoKV's gain: at ratio 1 both paths cost the same, so
what TempoKV gains there is timing alone (the headroom); what it gains beyond that at a
lower ratio is the demand/staging asymmetry."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bsrctl.experiments.bench import SEED
from bsrctl.stack.launch.fast_tier import FastTier
from bsrctl.stack.launch.flash_probe import FlashFigures, probe
from bsrctl.stats import paired_ratio_ci
from bsrctl.tempokv.experiments.flash import fast_tier_config
from bsrctl.tempokv.flash_spec import demand_iops
from bsrctl.tempokv.spec import TempoKVSpec
from fig6.cells import Cells
from fig6.headroom import Headroom
from fig6.predict import Prediction, inside

MIB = 1 << 20
TOLERANCE = 0.20  # the measured ratio against the spec's: within ±20 %


def default_ratios(spec: TempoKVSpec) -> list[float]:
    """1 (today's single path) and the spec's published ratio, rounded to 4 digits."""
    ft = spec.serving.fast_tier if spec.serving else None
    assert ft is not None
    return sorted({1.0, round(ft.demand_ratio, 4)}, reverse=True)


def iops_for(spec: TempoKVSpec, ratio: float) -> int:
    ft = spec.serving.fast_tier if spec.serving else None
    assert ft is not None
    return demand_iops(ratio * ft.flash_bytes_s)


def measure_device(
    spec: TempoKVSpec, ratios: Sequence[float], where: Path
) -> dict[float, tuple[FlashFigures, dict[str, Any]]]:
    """fio on a tier of the spec's own (arena, cgroups, both throttles), per ratio; the
    tier is removed after."""
    cfg = fast_tier_config(spec.serving)  # type: ignore[arg-type]
    assert cfg is not None
    tier = FastTier(cfg, where)
    out = {}
    tier.up()
    try:
        for r in ratios:
            tier.set_demand(iops_for(spec, r))
            out[r] = probe(tier)
    finally:
        tier.down()
    return out


def summary(spec: TempoKVSpec, got: dict[float, tuple[FlashFigures, Any]]) -> dict[str, Any]:
    """The evidence's record of the device: per ratio the figures, the cap, fio's JSON."""
    return {
        f"{r:g}": {"figures": f.to_json(), "spec_ratio": r,
                   "demand_iops_cap": iops_for(spec, r), "fio": raw}
        for r, (f, raw) in got.items()
    }  # fmt: skip


def device_lines(spec: TempoKVSpec, got: dict[float, tuple[FlashFigures, Any]]) -> list[str]:
    ft = spec.serving.fast_tier if spec.serving else None
    assert ft is not None
    out = [
        f"flash device (fio in the tier's cgroups, O_DIRECT): spec staging {ft.flash_mib_s:g} "
        f"MiB/s (read_bps_device), demand = ratio x staging in 4 KiB reads (read_iops_device)"
    ]
    for r, (f, _raw) in got.items():
        off = f.ratio / r - 1
        out.append(
            f"device ratio={r:g} (cap {iops_for(spec, r)} IOPS): demand 4 KiB qd1 "
            f"{f.demand_bytes_s / MIB:.2f} MiB/s ({f.demand_iops:.0f} IOPS), qd4 "
            f"{f.demand_qd4_bytes_s / MIB:.2f} MiB/s ({f.demand_qd4_iops:.0f} IOPS); staging "
            f"1 MiB {f.staging_bytes_s / MIB:.2f} MiB/s; measured ratio {f.ratio:.4f} vs the "
            f"spec's {r:.4f} ({100 * off:+.1f} %, "
            f"{'within' if abs(off) <= TOLERANCE else 'OUTSIDE'} ±{100 * TOLERANCE:.0f} %)"
        )
    return out


def flash_cost_lines(
    rates: Sequence[float],
    cells: Cells,
    arms: Sequence[str],
    headroom: dict[str, dict[float, list[Headroom]]],
) -> list[str]:
    """Per arm and rate: seconds the flash was reading (the union of the arm's read spans)
    per MiB it read (the throttle's counter), summed over repeats; and the mean read size."""
    out = []
    for arm in arms:
        for rate in rates:
            tiers = [c[arm][rate].tier for c in cells if c[arm][rate].tier]
            mib = sum(t["flash_read_bytes"] for t in tiers) / MIB  # type: ignore[index]
            reads = sum(t.get("flash_reads", 0) for t in tiers)  # type: ignore[union-attr]
            secs = sum(h.reading_s for h in headroom.get(arm, {}).get(rate, []))
            per = secs / mib if mib else math.nan
            size = mib * 1024 / reads if reads else math.nan
            out.append(
                f"flash time {arm} @{rate:g} rps: {per:.3f} s/MiB ({secs:.2f} s reading, "
                f"{mib:.1f} MiB in {reads} reads of {size:.1f} KiB mean, over {len(tiers)} "
                f"repeats)"
            )
    return out


def live_interval(cells: Cells, rate: float, key: str, arm: str, base: str) -> Any:
    a = [getattr(c[arm][rate], key) for c in cells]
    b = [getattr(c[base][rate], key) for c in cells]
    return paired_ratio_ci(a, b, SEED)


def prediction_vs_live(
    preds: Sequence[Prediction], cells: Cells, arm: str, base: str
) -> tuple[list[str], int, int]:
    """Per rate the prediction, the live interval and whether it lies inside; (lines,
    cells inside, cells)."""
    out, hits, n = [], 0, 0
    for p in preds:
        try:
            live = {k: live_interval(cells, p.rate, f, arm, base)
                    for k, f in (("p95", "p95_s"), ("tput", "tok_s"))}  # fmt: skip
        except ValueError as e:
            out.append(f"prediction @{p.rate:g}: no live interval ({e})")
            continue
        ok = inside(p, {k: (v.lo, v.hi) for k, v in live.items()})
        hits += sum(ok.values())
        n += len(ok)
        out.append(
            f"prediction @{p.rate:g} rps: p95 {p.p95:.3g} vs live {live['p95'].text(3)} "
            f"({'inside' if ok['p95'] else 'outside'}), tput {p.tput:.3g} vs live "
            f"{live['tput'].text(3)} ({'inside' if ok['tput'] else 'outside'})"
        )
    return out, hits, n


def decomposition_lines(
    rates: Sequence[float], by_ratio: dict[float, Cells], arm: str, base: str
) -> list[str]:
    """TempoKV's gain per rate and ratio as the median paired ratio; at ratio 1 the gain is
    the headroom's (timing, both paths alike), the step from ratio 1 to a lower ratio the
    asymmetry's (log-ratio shares)."""
    if 1.0 not in by_ratio:
        return ["decomposition: needs ratio 1 among --demand-ratio (the timing-only gain)"]
    out = []
    for r, cells in by_ratio.items():
        if r == 1.0:
            continue
        for rate in rates:
            parts = []
            for what, key in (("p95", "p95_s"), ("tput", "tok_s")):
                try:
                    at1 = live_interval(by_ratio[1.0], rate, key, arm, base).estimate
                    atr = live_interval(cells, rate, key, arm, base).estimate
                except ValueError:
                    parts.append(f"{what} n/a")
                    continue
                total = math.log(atr)
                timing = math.log(at1)
                share = timing / total if total else math.nan
                parts.append(
                    f"{what} {atr:.3g} = headroom (ratio 1) {at1:.3g} x asymmetry "
                    f"{atr / at1:.3g} (headroom's share of the log gain {share:.0%})"
                )
            out.append(f"decomposition ratio={r:g} @{rate:g} rps: " + "; ".join(parts))
    return out
