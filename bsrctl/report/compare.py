"""`bsrctl compare BASE NEW`: point-by-point deltas of two runs of the same spec, and the
regression gate (``--fail-on METRIC:PCT``), on distributions where the points have samples.

Points are matched by id; a point present in one run only is listed, never dropped. A
metric regresses when it moves the bad way by more than its bound: up for times and bytes,
down for what should stay high (cached tokens, throughput). Runs of different kinds or specs
are refused: their points do not measure the same thing.

Where both runs repeated a metric, a move beyond the bound is flagged only when it is also
significant (``bsrctl.stats.shift_test``: Mann-Whitney U, two-sided, α = 0.05); every such
delta shows new/base's bootstrap interval and the noise floor (its half-width). Points with
one sample cannot be tested: the bound alone decides, and the output says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from bsrctl.evidence.table import evidence_frame, measure_columns
from bsrctl.stats import NO_TEST, Shift, shift_test

# Shown in the delta table (others are compared when named by --fail-on).
KEY_METRICS = (
    "restore_pool_peak_bytes", "cached_tokens", "ttft_s", "restore_s", "probe_s",
    "bytes_restored", "time_to_fallback_s", "p95_ttft_s", "c_gib_s_per_req",
)  # fmt: skip
LOWER_IS_WORSE = frozenset(
    {"cached_tokens", "external_hit_tokens", "output_tok_s", "blocks_valid", "windows_done"}
)


class Incomparable(ValueError):
    """Two runs that do not measure the same thing (kind or spec differ)."""


@dataclass(frozen=True)
class Bound:
    metric: str
    pct: float  # the largest move the bad way allowed, in percent

    @classmethod
    def parse(cls, text: str) -> Bound:
        metric, sep, pct = text.rpartition(":")
        try:
            value = float(pct)
        except ValueError:
            value = math.nan
        if not sep or not metric or not value >= 0:
            raise ValueError(f"--fail-on {text!r}: write METRIC:PCT, e.g. restore_s:20")
        return cls(metric, value)


@dataclass(frozen=True)
class Delta:
    point: str
    metric: str
    base: float  # the median where the point has samples, else its one value
    new: float
    worse_pct: float  # how far the bad way, in percent of base (negative: it improved)
    shift: Shift | None = None  # the distributions' test; None for hand-made deltas

    @property
    def change_pct(self) -> float:
        if self.base == 0:
            return 0.0 if self.new == 0 else math.inf
        return (self.new - self.base) / abs(self.base) * 100

    @property
    def testable(self) -> bool:
        return self.shift is not None and self.shift.testable


@dataclass(frozen=True)
class Comparison:
    base_id: str
    new_id: str
    kind: str
    deltas: tuple[Delta, ...]
    only_base: tuple[str, ...]
    only_new: tuple[str, ...]
    verdicts: tuple[tuple[str, str, str], ...]  # (point, base verdict, new verdict)
    regressions: tuple[tuple[Delta, Bound], ...]
    # beyond the bound but not significant: shown, never flagged
    within_noise: tuple[tuple[Delta, Bound], ...] = ()

    @property
    def regressed(self) -> bool:
        return bool(self.regressions)


def _is_number(v: Any) -> bool:
    return (
        isinstance(v, int | float | np.integer | np.floating)
        and not isinstance(v, bool | np.bool_)
        and math.isfinite(float(v))
    )


def _worse(metric: str, base: float, new: float) -> float:
    sign = -1.0 if metric in LOWER_IS_WORSE else 1.0
    if base == 0:
        return 0.0 if new == base else math.copysign(math.inf, sign * (new - base))
    return sign * (new - base) / abs(base) * 100


def _point_samples(doc: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """point -> metric -> its samples (one value when measured once), from the frame: a
    repeated measure's column holds one sample per row, a single one the same every row."""
    frame = evidence_frame([doc])
    repeated = {p["id"]: set(p.get("samples") or {}) for p in doc.get("points", [])}
    out: dict[str, dict[str, list[float]]] = {}
    for pid, rows in frame.groupby("point", sort=False):
        values: dict[str, list[float]] = {}
        for metric in measure_columns(frame):
            cells = (
                rows[metric].tolist() if metric in repeated.get(pid, ()) else [rows[metric].iloc[0]]
            )
            nums = [float(v) for v in cells if _is_number(v)]
            if nums and len(nums) == len(cells):
                values[metric] = nums
        out[str(pid)] = values
    return out


def metrics_of(doc: dict[str, Any]) -> set[str]:
    return {m for values in _point_samples(doc).values() for m in values}


def compare(
    base: dict[str, Any], new: dict[str, Any], bounds: list[Bound], seed: int = 0
) -> Comparison:
    """A metric regresses when its median moves the bad way beyond its bound AND the move is
    significant (Mann-Whitney U, two-sided, α = 0.05) where both runs have samples; where
    either has one sample the bound alone decides, as before repeats (marked so)."""
    if base["kind"] != new["kind"]:
        raise Incomparable(
            f"BASE is a {base['kind']} run and NEW a {new['kind']} run: compare runs of one kind"
        )
    if base["spec_sha256"] != new["spec_sha256"]:
        raise Incomparable(
            f"the runs have different specs (sha256 {base['spec_sha256'][:12]} vs "
            f"{new['spec_sha256'][:12]}): compare runs of the same spec"
        )
    b_vals, n_vals = _point_samples(base), _point_samples(new)
    known = {m for v in (*b_vals.values(), *n_vals.values()) for m in v}
    unknown = sorted({b.metric for b in bounds} - known)
    if unknown:
        raise ValueError(f"--fail-on: no point measures {unknown}; measured: {sorted(known)}")
    b_pts = {p["id"]: p for p in base.get("points", [])}
    n_pts = {p["id"]: p for p in new.get("points", [])}
    common = [pid for pid in b_pts if pid in n_pts]
    wanted = set(KEY_METRICS) | {b.metric for b in bounds}
    deltas, regressions, noise = [], [], []
    for pid in common:
        bm, nm = b_vals.get(pid, {}), n_vals.get(pid, {})
        for metric in sorted(set(bm) & set(nm) & wanted, key=_order):
            bs, ns = bm[metric], nm[metric]
            b0, n0 = float(np.median(bs)), float(np.median(ns))
            shift = shift_test(bs, ns, seed)
            d = Delta(pid, metric, b0, n0, _worse(metric, b0, n0), shift)
            deltas.append(d)
            for b in bounds:
                if b.metric != metric or not d.worse_pct > b.pct:
                    continue
                (regressions if shift.significant is not False else noise).append((d, b))
    verdicts = tuple(
        (pid, b_pts[pid]["verdict"], n_pts[pid]["verdict"])
        for pid in common
        if b_pts[pid]["verdict"] != n_pts[pid]["verdict"]
    )
    return Comparison(
        base["run_id"],
        new["run_id"],
        base["kind"],
        tuple(deltas),
        tuple(pid for pid in b_pts if pid not in n_pts),
        tuple(pid for pid in n_pts if pid not in b_pts),
        verdicts,
        tuple(regressions),
        tuple(noise),
    )


def _order(metric: str) -> tuple[int, str]:
    return (KEY_METRICS.index(metric) if metric in KEY_METRICS else len(KEY_METRICS), metric)


def fmt(metric: str, v: float) -> str:
    """A metric's value as reports show it (seconds in ms, bytes in MiB)."""
    if metric.endswith("_s"):
        return f"{v * 1000:.1f} ms"
    if "bytes" in metric:
        return f"{v / 2**20:.2f} MiB"
    return f"{v:g}"


def _pct(p: float) -> str:
    return "∞" if math.isinf(p) else f"{p:+.1f}%"


def _significance(d: Delta) -> str:
    return d.shift.text() if d.shift is not None else f"{NO_TEST}: bound only"


def regression_line(d: Delta, b: Bound) -> str:
    """Names the metric, the point and the delta; where both runs have samples, the shift's
    significance and the noise floor too (single samples keep the bound-only line)."""
    line = (
        f"REGRESSION {d.metric} at {d.point}: {fmt(d.metric, d.base)} → "
        f"{fmt(d.metric, d.new)} ({_pct(d.change_pct)}), worse by {_pct(d.worse_pct)} > "
        f"bound {b.pct:g}%"
    )
    return f"{line}; {_significance(d)}" if d.testable else line


def _interval(d: Delta) -> tuple[str, str, str]:
    """The table's new/base interval, p-value and noise floor cells."""
    sh = d.shift
    if sh is None or not sh.testable or sh.ratio is None:
        return ("1 sample", "–", "–") if sh is None or not sh.testable else ("–", "–", "–")
    return sh.ratio.text(), f"{sh.p_value:.2g}", f"±{sh.noise_floor_pct:.1f}%"


def noise_floor(c: Comparison) -> dict[str, tuple[float, Delta]]:
    """metric -> (its noise floor in percent: the largest half-width over its points of the
    95 % bootstrap interval of new/base medians, the delta whose shift is largest)."""
    out: dict[str, tuple[float, Delta]] = {}
    for d in c.deltas:
        floor = d.shift.noise_floor_pct if d.shift is not None else None
        if floor is None:
            continue
        prev = out.get(d.metric)
        if prev is None:
            out[d.metric] = (floor, d)
            continue
        wider = max(prev[0], floor)
        far = d if abs(d.change_pct) > abs(prev[1].change_pct) else prev[1]
        out[d.metric] = (wider, far)
    return out


def render(c: Comparison) -> str:
    lines = [f"# {c.new_id} against {c.base_id} ({c.kind})", ""]
    lines += [
        "| point | metric | base | new | change | new/base [95% CI] | Mann-Whitney p | "
        "noise floor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {d.point} | {d.metric} | {fmt(d.metric, d.base)} | {fmt(d.metric, d.new)} | "
        f"{_pct(d.change_pct)} | {' | '.join(_interval(d))} |"
        for d in c.deltas
    ]
    if c.only_base or c.only_new:
        lines += ["", "Points in one run only:"]
        lines += [f"- {pid}: only in BASE {c.base_id}" for pid in c.only_base]
        lines += [f"- {pid}: only in NEW {c.new_id}" for pid in c.only_new]
    if c.verdicts:
        lines += ["", "Verdicts that changed:"]
        lines += [f"- {pid}: {b} → {n}" for pid, b, n in c.verdicts]
    floors = noise_floor(c)
    if floors:
        lines += ["", "Noise floor per metric (half-width of the 95 % seeded bootstrap interval "
                  "of new/base medians, the widest over the points; of an A/A pair of runs it "
                  "is this machine's noise):"]  # fmt: skip
        for metric, (floor, d) in sorted(floors.items(), key=lambda kv: _order(kv[0])):
            ratio = d.shift.ratio.text() if d.shift and d.shift.ratio else "–"
            lines.append(f"- {metric}: ±{floor:.1f}%; largest shift {_pct(d.change_pct)} at "
                         f"{d.point}, new/base {ratio}")  # fmt: skip
    single = sorted({d.metric for d in c.deltas if not d.testable})
    if single:
        lines += ["", f"Single samples: {NO_TEST} for {', '.join(single)} at "
                  f"{len({d.point for d in c.deltas if not d.testable})} point(s): their bound "
                  "alone decides"]  # fmt: skip
    if c.within_noise:
        lines += [""]
        lines += [f"within noise {d.metric} at {d.point}: worse by {_pct(d.worse_pct)} > bound "
                  f"{b.pct:g}% but {_significance(d)}" for d, b in c.within_noise]  # fmt: skip
    lines += [""]
    lines += [regression_line(d, b) for d, b in c.regressions] or ["no regression beyond a bound"]
    return "\n".join(lines) + "\n"
