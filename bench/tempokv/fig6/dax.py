"""Figure 6 against §5.3's own baseline (``--baseline dax``): LMCache-DAX, unmodified vLLM and
LMCache whose whole L1 is the flash tier's arena (``serving.fast_tier``), against TempoKV on
the same tier. What differs from today's analogue: the arms' names, the spec and rates by
default, each cell's start (the fast tier cleared, the flash copy kept), the tier's counters
per cell, what the evidence records of each arm's deployment, the goals, and the paper's
magnitudes beside ours."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from bsrctl.evidence.verdict import Check
from bsrctl.spec_io import describe_error
from bsrctl.stats import decisive_repeats
from bsrctl.tempokv.experiments import flash
from bsrctl.tempokv.experiments.expectations import ordering_claim
from bsrctl.tempokv.spec import TempoKVSpec
from fig6.cells import DAX_BASE, Cells, ratio
from fig6.headroom import arm_headroom, headroom_lines
from fig6.timeline import draw
from fig6.where import rows_of, timeline_lines

ARMS = (DAX_BASE, "tempokv")
SPEC = Path(__file__).resolve().parents[3] / "ladders" / "tempokv-fig6-dax.yaml"
RATES = (0.2, 0.5, 1.0, 2.0, 4.0)  # §5.3: r from 0.2 to 4 requests/s
# §5.3 / Figure 6: "TempoKV reduces p95 TTFT by up to 48.0% and increases output throughput
# by up to 27.8% on NarrativeQA. The corresponding improvements on LooGLE reach 32.4% and
# 15.5%": as ratios tempokv/lmcache-dax, the best over the rates
PAPER = {"NarrativeQA": (1.278, 0.520), "LooGLE": (1.155, 0.676)}  # (tput, p95)


def flash_spec_and_rates(
    ap: argparse.ArgumentParser, args: Sequence[str], what: str
) -> tuple[Path, TempoKVSpec, list[float]] | int:
    """``[SPEC.yaml] [RATES…]`` of a flash-tier bench (default: this spec, §5.3's rates): the
    spec's path, the spec and the rates, or 2 after one line naming the field (``what``: the
    bench's word for what needs the flash tier)."""
    rest = list(args)
    path = Path(rest.pop(0)) if rest and rest[0].endswith(".yaml") else SPEC
    try:
        rates = [float(a) for a in rest] or list(RATES)
    except ValueError:
        ap.error(f"RATES {rest}: give numbers (requests per second)")
    if any(r <= 0 for r in rates):
        ap.error(f"RATES {rates}: each must be > 0")
    try:
        spec = TempoKVSpec.model_validate(yaml.safe_load(path.read_text()))
    except ValidationError as e:
        print(f"error: {describe_error(TempoKVSpec, e)}", file=sys.stderr)
        return 2
    if spec.serving is None or spec.serving.fast_tier is None:
        print(f"error: serving.fast_tier: {what} is the flash tier's; give its spec "
              f"(e.g. {SPEC.name})", file=sys.stderr)  # fmt: skip
        return 2
    return path, spec, rates


def paper_line() -> str:
    parts = [f"{w}: tput up to {t:.3f}, p95 down to {p:.3f}" for w, (t, p) in PAPER.items()]
    return "paper (Fig. 6, tempokv/lmcache-dax, best over r = 0.2-4 rps): " + "; ".join(parts)


def start_cell(stack: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Before a cell: vLLM forgets, the fast tier is emptied; what clearing left and the
    counters then (with the host's CPU time: the machine is shared)."""
    cleared = flash.clear_cell(stack)
    return cleared, {**flash.counters(stack), "host_cpu": host_cpu()}


def end_cell(stack: Any, cleared: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    cpu = before.pop("host_cpu")
    got = {"cleared": cleared, **flash.cell_delta(before, flash.counters(stack))}
    return {**got, "host": host_busy(cpu, host_cpu())}


def host_cpu() -> tuple[int, int, int]:
    """(busy, all) jiffies of every CPU (/proc/stat), CPUs."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields), os.cpu_count() or 1


def host_busy(a: tuple[int, int, int], b: tuple[int, int, int]) -> dict[str, float]:
    """The host's CPUs busy over a cell (all processes: ours and anyone's), and its load."""
    busy = (b[0] - a[0]) / (b[1] - a[1]) if b[1] > a[1] else float("nan")
    return {"cpu_busy": round(busy, 4), "cpus": a[2], "loadavg_1m": os.getloadavg()[0]}


def deployment_record(stack: Any) -> dict[str, Any]:
    """What the evidence keeps of an arm's deployment: LMCache's argv (the DAX arm's has
    ``--l1-devdax-path`` and no TempoKV option), vLLM's, and the fast tier (arena path,
    cgroups, limit, throttle rate, the seal's base)."""
    tier = stack.fast_tier
    return {
        "lmcache_argv": stack.parts["lmcache"].argv,
        "vllm_argv": stack.parts["vllm"].argv,
        "fast_tier": tier.describe() if tier is not None else None,
        "sealed": getattr(stack, "sealed", None),
    }


def goal_lines(rates: Sequence[float], cells: Cells, checks: Sequence[Check]) -> list[str]:
    """The goals: never decidedly behind (no per-rate claim FAILs), decidedly ahead on p95
    at the two highest rates (TempoKV's p95 strictly below LMCache-DAX's, the paired
    repeats' interval below 1: a tie is not ahead) and on throughput at the highest."""
    behind = [c.name for c in checks if str(c.verdict) == "FAIL"]
    ahead = {}
    for r in sorted(rates)[-2:]:
        a = [c["tempokv"][r].p95_s for c in cells]
        b = [c[DAX_BASE][r].p95_s for c in cells]
        got = ordering_claim("p95 ahead", "p95", a, b, "a<b", "")
        ahead[f"@{r:g}"] = {True: "PASS", False: "FAIL"}.get(got.reproduced, "UNKNOWN")  # type: ignore[arg-type]
    # with fewer repeats than decide (stats.decisive_repeats) no claim can FAIL: say so
    top = max(rates)
    a = [c["tempokv"][top].tok_s for c in cells]
    b = [c[DAX_BASE][top].tok_s for c in cells]
    tput = ordering_claim("tput ahead", "tput", a, b, "a>b", "").reproduced
    tput_v = {True: "PASS", False: "FAIL"}.get(tput, "UNKNOWN")  # type: ignore[arg-type]
    few = len(cells) < decisive_repeats()
    met = f"met, vacuously: {len(cells)} repeats decide no claim" if few else "met"
    return [
        f"goal never decidedly behind: {met if not behind else 'NOT met: ' + ', '.join(behind)}",
        f"goal p95 decidedly ahead at the two highest rates: {ahead} "
        f"({'met' if all(v == 'PASS' for v in ahead.values()) else 'not met'})",
        f"goal tput decidedly ahead at the highest rate: @{top:g} {tput_v} "
        f"({'met' if tput_v == 'PASS' else 'not met'})",
    ]


def ratio_report(
    spec: TempoKVSpec, rates: Sequence[float], cells: Cells, arms: Sequence[str],
    spans: Sequence[Any], pids: dict[int, str], run_dir: Path, demand_ratio: float,
    figures: Any, timeline_rate: float | None,
) -> list[str]:  # fmt: skip
    """One demand ratio, before its ratios: where the time goes (each arm's retrieval
    timeline at ``timeline_rate``, default the highest, in the repeat whose p95 ratio there
    is the median one), the headroom, each arm's flash time per MiB, and the simulation's
    prediction from the measured device (``figures``: the probe's at this ratio) beside the
    live intervals."""
    from fig6 import device  # it reaches the regime bench, which imports this module
    from fig6.predict import CPU_ENGINE, engine_scale_for, predict, prediction_lines

    out: list[str] = []
    at = timeline_rate if timeline_rate in rates else max(rates)
    base = arms[0]
    by = sorted(range(len(cells)), key=lambda i: ratio(cells[i]["tempokv"][at].p95_s,
                                                       cells[i][base][at].p95_s))  # fmt: skip
    k = by[len(by) // 2]
    rows = {arm: rows_of(spans, cells[k][arm][at].request_ids) for arm in arms}
    for arm in arms:
        out += ["", f"repeat {k} (the median p95 ratio at {at:g} rps):"]
        out += timeline_lines(arm, at, rows[arm])
    svg = run_dir / f"fig6-timeline-ratio{demand_ratio:g}.svg"
    out += ["", f"timeline figure {draw(rows, at, svg)}", ""]
    room = arm_headroom(spans, cells, rates, arms, pids)
    out += headroom_lines(room)
    out += device.flash_cost_lines(rates, cells, arms, room)
    if figures is not None:
        fig = figures[0]
        # the CPU engine as measured on a quiet machine, and the engine this run measured
        # (LMCache-DAX's median time from KV in to last token at the lowest rate)
        low = room.get(base, {}).get(min(rates), [])
        engines = [("this stack's CPU engine", CPU_ENGINE)]
        if low:
            eng = statistics.median(h.engine_s for h in low)
            scale = engine_scale_for(spec, min(rates), eng)
            what = f"engine measured in this run ({1000 * eng:.0f} ms from KV to end: x{scale:.3g})"
            engines.append((what, (scale, CPU_ENGINE[1])))
        for what, engine in engines:
            preds = predict(spec, rates, fig.staging_bytes_s, fig.demand_bytes_s, engine=engine)
            out += prediction_lines(preds, fig.staging_bytes_s, fig.demand_bytes_s, what)
            got, hits, n = device.prediction_vs_live(preds, cells, "tempokv", base)
            out += got + [f"prediction inside the live 95 % interval: {hits}/{n} cells"]
    return out
