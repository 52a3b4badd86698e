"""The bench's last line: BSR against the best baseline of each tier at the largest size."""

from __future__ import annotations

from typing import Any

from bsrctl.evidence.verdict import Point, check
from bsrctl.experiments.bench import bench_point
from bsrctl.stats import paired_ratio_ci

from .common import GIB, TierResult


def goal_label(w: int) -> str:
    """The goal rows: the first W at B = 2W."""
    return f"bsr W={w} B={2 * w}"


def no_checksum_label(w: int) -> str:
    """The goal row over the same files with the FS tier verifying no checksum."""
    return f"{goal_label(w)} no checksum"


def checksum_ratio(res: TierResult, w: int, seed: int = 0) -> str:
    """``checksum/no-checksum=X [lo, hi]``: the goal row's rate with every object's
    checksum verified at load over its rate without, paired by round (below 1: what the
    integrity check costs); ``n/a`` when either did not run."""
    name, a, b = "checksum/no-checksum", goal_label(w), no_checksum_label(w)
    if a not in res.samples or b not in res.samples:
        return f"{name}=n/a"
    iv = paired_ratio_ci(round_rates(res, a), round_rates(res, b), seed)
    if not iv.testable:
        return f"{name}={iv.estimate:.2f} [1 round: no interval]"
    return f"{name}={iv.estimate:.2f} [{iv.lo:.2f}, {iv.hi:.2f}]"


def last_line(fs: list[TierResult], mc: list[TierResult], w: int) -> str:
    """``fs: bsr/best-raw=X.XX bsr/whole-plan=Y.YY bsr/fio@8192=F [lo, hi] bsr/fio@65536=…
    checksum/no-checksum=K [lo, hi] mooncake: bsr/best-raw=Z.ZZ peak_bytes=N`` (each
    tier's part only when it ran): the ratios at the largest size (the whole-plan one at
    the largest size whose whole plan ran), BSR against fio at every size, N the goal row's
    staging peak per rank (the FS tier's when it ran)."""
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
        fields += [fio_ratio(x, label, tag=f"@{x.tokens}") for x in fs]
        fields.append(checksum_ratio(r, w))
        peak = r.row(label).peak
    if mc:
        r = mc[-1]
        fields.append(f"mooncake: bsr/best-raw={r.rate[label] / r.best_raw:.2f}")
        peak = peak if peak is not None else r.row(label).peak
    return " ".join(fields) + f" peak_bytes={peak}"


def round_rates(res: TierResult, label: str) -> list[float]:
    """The mode's rate in each round (its bytes over each pass)."""
    return [res.row(label).bytes / s for s in res.samples[label]["pass_s"]]


def fio_ratio(res: TierResult, label: str, seed: int = 0, tag: str = "") -> str:
    """``bsr/fio<tag>=X [lo, hi]``: BSR's rate over the best fio mode's (the best median
    rate), paired by round; ``n/a`` without fio modes (none ran, or every one dropped)."""
    name = f"bsr/fio{tag}"
    fios = [r for r in res.rows if r.label.startswith("fio")]
    if not fios or label not in res.samples:
        return f"{name}=n/a"
    best = max(fios, key=lambda r: r.rate)
    iv = paired_ratio_ci(round_rates(res, label), round_rates(res, best.label), seed)
    if not iv.testable:
        return f"{name}={iv.estimate:.2f} [1 round: no interval]"
    return f"{name}={iv.estimate:.2f} [{iv.lo:.2f}, {iv.hi:.2f}]"


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
