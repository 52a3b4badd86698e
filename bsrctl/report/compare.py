"""`bsrctl compare BASE NEW`: point-by-point deltas of two runs of the same spec, and the
regression gate (``--fail-on METRIC:PCT``).

Points are matched by id; a point present in one run only is listed, never dropped. A
metric regresses when it moves the bad way by more than its bound: up for times and bytes,
down for what should stay high (cached tokens, throughput). Runs of different kinds or specs
are refused: their points do not measure the same thing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

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
    base: float
    new: float
    worse_pct: float  # how far the bad way, in percent of base (negative: it improved)

    @property
    def change_pct(self) -> float:
        if self.base == 0:
            return 0.0 if self.new == 0 else math.inf
        return (self.new - self.base) / abs(self.base) * 100


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

    @property
    def regressed(self) -> bool:
        return bool(self.regressions)


def _numbers(point: dict[str, Any]) -> dict[str, float]:
    m = point.get("measures") or {}
    return {
        k: float(v)
        for k, v in m.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def _worse(metric: str, base: float, new: float) -> float:
    sign = -1.0 if metric in LOWER_IS_WORSE else 1.0
    if base == 0:
        return 0.0 if new == base else math.copysign(math.inf, sign * (new - base))
    return sign * (new - base) / abs(base) * 100


def metrics_of(doc: dict[str, Any]) -> set[str]:
    return {k for p in doc.get("points", []) for k in _numbers(p)}


def compare(base: dict[str, Any], new: dict[str, Any], bounds: list[Bound]) -> Comparison:
    if base["kind"] != new["kind"]:
        raise Incomparable(
            f"BASE is a {base['kind']} run and NEW a {new['kind']} run: compare runs of one kind"
        )
    if base["spec_sha256"] != new["spec_sha256"]:
        raise Incomparable(
            f"the runs have different specs (sha256 {base['spec_sha256'][:12]} vs "
            f"{new['spec_sha256'][:12]}): compare runs of the same spec"
        )
    known = metrics_of(base) | metrics_of(new)
    unknown = sorted({b.metric for b in bounds} - known)
    if unknown:
        raise ValueError(f"--fail-on: no point measures {unknown}; measured: {sorted(known)}")
    b_pts = {p["id"]: p for p in base.get("points", [])}
    n_pts = {p["id"]: p for p in new.get("points", [])}
    common = [pid for pid in b_pts if pid in n_pts]
    wanted = set(KEY_METRICS) | {b.metric for b in bounds}
    deltas, regressions = [], []
    for pid in common:
        bm, nm = _numbers(b_pts[pid]), _numbers(n_pts[pid])
        for metric in sorted(set(bm) & set(nm) & wanted, key=_order):
            d = Delta(pid, metric, bm[metric], nm[metric], _worse(metric, bm[metric], nm[metric]))
            deltas.append(d)
            regressions += [(d, b) for b in bounds if b.metric == metric and d.worse_pct > b.pct]
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
    )


def _order(metric: str) -> tuple[int, str]:
    return (KEY_METRICS.index(metric) if metric in KEY_METRICS else len(KEY_METRICS), metric)


def _value(metric: str, v: float) -> str:
    if metric.endswith("_s"):
        return f"{v * 1000:.1f} ms"
    if "bytes" in metric:
        return f"{v / 2**20:.2f} MiB"
    return f"{v:g}"


def _pct(p: float) -> str:
    return "∞" if math.isinf(p) else f"{p:+.1f}%"


def regression_line(d: Delta, b: Bound) -> str:
    """Names the metric, the point and the delta."""
    return (
        f"REGRESSION {d.metric} at {d.point}: {_value(d.metric, d.base)} → "
        f"{_value(d.metric, d.new)} ({_pct(d.change_pct)}), worse by {_pct(d.worse_pct)} > "
        f"bound {b.pct:g}%"
    )


def render(c: Comparison) -> str:
    lines = [f"# {c.new_id} against {c.base_id} ({c.kind})", ""]
    lines += ["| point | metric | base | new | change |", "|---|---|---|---|---|"]
    lines += [
        f"| {d.point} | {d.metric} | {_value(d.metric, d.base)} | {_value(d.metric, d.new)} | "
        f"{_pct(d.change_pct)} |"
        for d in c.deltas
    ]
    if c.only_base or c.only_new:
        lines += ["", "Points in one run only:"]
        lines += [f"- {pid}: only in BASE {c.base_id}" for pid in c.only_base]
        lines += [f"- {pid}: only in NEW {c.new_id}" for pid in c.only_new]
    if c.verdicts:
        lines += ["", "Verdicts that changed:"]
        lines += [f"- {pid}: {b} → {n}" for pid, b, n in c.verdicts]
    lines += [""]
    lines += [regression_line(d, b) for d, b in c.regressions] or ["no regression beyond a bound"]
    return "\n".join(lines) + "\n"
