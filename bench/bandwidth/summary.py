"""The bench's last line: BSR against the best baseline of each tier at the largest size."""

from __future__ import annotations

from typing import Any

from bsrctl.evidence.verdict import Point, check
from bsrctl.experiments.bench import bench_point

from .common import GIB, TierResult


def goal_label(w: int) -> str:
    """The goal rows: the first W at B = 2W."""
    return f"bsr W={w} B={2 * w}"


def last_line(fs: list[TierResult], mc: list[TierResult], w: int) -> str:
    """``fs: bsr/best-raw=X.XX bsr/whole-plan=Y.YY mooncake: bsr/best-raw=Z.ZZ peak_bytes=N``
    (each tier's part only when it ran): the ratios at the largest size (the whole-plan one
    at the largest size whose whole plan ran), N the goal row's staging peak per rank (the
    FS tier's when it ran)."""
    label = goal_label(w)
    fields: list[str] = []
    peak = None
    if fs:
        r = fs[-1]
        fields.append(f"fs: bsr/best-raw={r.rate[label] / r.best_raw:.2f}")
        wholes = [x for x in reversed(fs) if x.whole]
        if wholes:
            x = wholes[0]
            assert x.whole is not None
            fields.append(f"bsr/whole-plan={x.rate[label] / x.whole:.2f}")
        else:
            fields.append("bsr/whole-plan=n/a")
        peak = r.row(label).peak
    if mc:
        r = mc[-1]
        fields.append(f"mooncake: bsr/best-raw={r.rate[label] / r.best_raw:.2f}")
        peak = peak if peak is not None else r.row(label).peak
    return " ".join(fields) + f" peak_bytes={peak}"


def tier_points(tier: str, results: list[TierResult]) -> list[Point]:
    """The evidence of one tier: a point per size and mode, every round's pass as samples
    (``pass_s``, ``first_window_s``) and the rate of the median pass; a restore's staging
    peak must be the same in every round (``peak_identical``)."""
    out = []
    for res in results:
        for row in res.rows:
            got = dict(res.samples.get(row.label, {}))
            peaks = got.pop("peak_bytes", None)
            checks = []
            if peaks:
                same = len(set(peaks)) == 1
                checks.append(check("peak_identical", same, f"staging peak per round {peaks} B"))
            measures: dict[str, Any] = {
                "bytes": row.bytes,
                "gib_s": row.rate / GIB,
                "peak_bytes": row.peak,
                "best_raw": row.label == res.best_raw_label,
            }
            params = {"tier": tier, "tokens": res.tokens, "mode": row.label}
            pid = f"{tier}/n{res.tokens}/{row.label}"
            out.append(bench_point(pid, params, got, measures, checks))
    return out
