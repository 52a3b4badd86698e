"""The statistics every timed figure is judged by: seeded bootstrap intervals, paired
orderings, and the regression gate's shift test. Pure (numpy, scipy.stats), no bsrctl import.

Conventions:
- Intervals are 95 % percentile bootstraps (``scipy.stats.bootstrap``, ``method="percentile"``,
  9 999 resamples) from a caller-given seed, so the same samples give the same interval.
  Percentile rather than BCa: BCa's jackknife of a median is degenerate on the small, tied
  samples repeats give (scipy warns and returns nan), and percentile never leaves the data.
- A paired comparison (arm a and arm b measured in the same repeat) works on the per-pair
  ratio a_i / b_i (or difference a_i - b_i) and takes its median: drift that hits both arms
  of a repeat alike cancels in the pair.
- One sample is never a test: every function says "cannot test significance" rather than
  inventing an interval or a p-value.
- Few samples decide nothing either. The percentile bootstrap of a median over n paired
  samples spans about their range when n is small (at n = 3 exactly [min, max]), so it
  excludes the threshold whenever every pair lies on one side: under no effect at all that
  happens with probability 2 / 2^n (25 % at n = 3), not 5 %. An ordering is therefore
  decided only where that sign-test floor (``scipy.stats.binomtest``) is below the level's
  alpha: 6 paired repeats or more at 95 % (``decisive_repeats``); below, it reads UNKNOWN,
  whatever the interval says. Samples that are all equal (byte counts) are exact, not
  sampled: they decide at any n.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats as sps

LEVEL = 0.95
ALPHA = 0.05
RESAMPLES = 9999
VerdictName = Literal["PASS", "FAIL", "UNKNOWN"]
Claim = Literal["a<b", "a>b", "a<=b", "a>=b"]
Kind = Literal["ratio", "diff"]
CLAIMS: tuple[str, ...] = ("a<b", "a>b", "a<=b", "a>=b")
NO_TEST = "cannot test significance"


@dataclass(frozen=True)
class Interval:
    """A point estimate and its confidence interval; ``method`` says how it was made:
    ``bootstrap-percentile``, ``identical`` (all samples equal: [x, x]) or ``single`` (one
    sample: no interval, lo and hi are nan)."""

    estimate: float
    lo: float
    hi: float
    n: int
    level: float = LEVEL
    method: str = "bootstrap-percentile"

    @property
    def testable(self) -> bool:
        return self.method != "single"

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    def as_list(self) -> list[float]:
        """The evidence form: ``intervals: {measure: [lo, hi]}``."""
        return [self.lo, self.hi]

    def text(self, digits: int = 3) -> str:
        if not self.testable:
            return f"{self.estimate:.{digits}g} (1 sample: no interval)"
        return f"{self.estimate:.{digits}g} [{self.lo:.{digits}g}, {self.hi:.{digits}g}]"


def _array(samples: Sequence[float]) -> np.ndarray:
    x = np.asarray(samples, dtype=float)
    if x.ndim != 1 or x.size == 0:
        raise ValueError("samples: a non-empty 1-d sequence of numbers")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"samples: every sample must be finite, got {x.tolist()}")
    return x


def median_ci(samples: Sequence[float], seed: int, level: float = LEVEL) -> Interval:
    """The median of ``samples`` and its seeded percentile-bootstrap interval."""
    x = _array(samples)
    med = float(np.median(x))
    if x.size == 1:
        return Interval(med, math.nan, math.nan, 1, level, "single")
    if np.all(x == x[0]):  # the bootstrap distribution is a point; scipy would warn
        return Interval(med, med, med, int(x.size), level, "identical")
    res = sps.bootstrap(
        (x,),
        np.median,
        n_resamples=RESAMPLES,
        vectorized=True,
        confidence_level=level,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    ci = res.confidence_interval
    return Interval(med, float(ci.low), float(ci.high), int(x.size), level)


def _pairs(a: Sequence[float], b: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    x, y = _array(a), _array(b)
    if x.size != y.size:
        raise ValueError(f"paired repeats: a has {x.size} samples and b {y.size}")
    return x, y


def paired_ratio_ci(
    a: Sequence[float], b: Sequence[float], seed: int, level: float = LEVEL
) -> Interval:
    """Median over repeats of a_i / b_i, with its interval (b must not hold a zero)."""
    x, y = _pairs(a, b)
    if np.any(y == 0):
        raise ValueError("paired ratio: b holds a zero sample; compare by difference")
    return median_ci(x / y, seed, level)


def paired_diff_ci(
    a: Sequence[float], b: Sequence[float], seed: int, level: float = LEVEL
) -> Interval:
    """Median over repeats of a_i - b_i, with its interval."""
    x, y = _pairs(a, b)
    return median_ci(x - y, seed, level)


@dataclass(frozen=True)
class Ordering:
    """A claimed ordering of two arms judged by the interval of their paired ratio/diff."""

    verdict: VerdictName
    claim: str
    kind: str
    threshold: float
    interval: Interval
    repeats_needed: int | None  # about how many paired repeats would decide (UNKNOWN only)
    detail: str


def repeats_to_decide(iv: Interval, threshold: float) -> int | None:
    """About how many repeats would move the interval's near end off ``threshold``.

    Method: the interval's half-width on the threshold's side shrinks as sqrt(n / n'), so
    n' = n * (half-width / distance of the estimate from the threshold)^2, rounded up.
    None when the estimate sits on the threshold (no number of repeats decides) or when
    there is no interval to scale (one sample)."""
    if not iv.testable:
        return None
    distance = abs(iv.estimate - threshold)
    if distance == 0:
        return None
    side = iv.hi - iv.estimate if iv.estimate < threshold else iv.estimate - iv.lo
    return max(iv.n + 1, math.ceil(iv.n * (side / distance) ** 2))


def sign_floor(n: int) -> float:
    """The smallest two-sided p-value n paired samples can give by their signs alone (every
    pair on one side): ``binomtest(n, n, 0.5)``, 2 / 2^n."""
    return float(sps.binomtest(n, n, 0.5).pvalue)


@functools.cache
def decisive_repeats(level: float = LEVEL) -> int:
    """The fewest paired repeats whose sign-test floor is below 1 - ``level`` (6 at 95 %)."""
    n = 1
    while sign_floor(n) >= 1 - level:
        n += 1
    return n


def _side(claim: str, iv: Interval, t: float) -> VerdictName:
    less = claim in ("a<b", "a<=b")
    strict = claim in ("a<b", "a>b")
    lo, hi = iv.lo, iv.hi
    if less:
        passed = hi < t if strict else hi <= t
        failed = lo >= t if strict else lo > t
    else:
        passed = lo > t if strict else lo >= t
        failed = hi <= t if strict else hi < t
    return "PASS" if passed else "FAIL" if failed else "UNKNOWN"


def ordering_verdict(
    a: Sequence[float],
    b: Sequence[float],
    claim: str,
    kind: str = "ratio",
    seed: int = 0,
    threshold: float | None = None,
    level: float = LEVEL,
) -> Ordering:
    """PASS when the interval of a/b (or a-b) lies on the claimed side of ``threshold``
    (1 for a ratio, 0 for a difference), FAIL when it lies on the other, UNKNOWN when it
    straddles it, when there is one repeat only, or when the repeats are too few to decide
    at ``level`` (``decisive_repeats``: the module docstring says why)."""
    if claim not in CLAIMS:
        raise ValueError(f"claim {claim!r}: one of {', '.join(CLAIMS)}")
    if kind not in ("ratio", "diff"):
        raise ValueError(f"kind {kind!r}: ratio or diff")
    t = (1.0 if kind == "ratio" else 0.0) if threshold is None else float(threshold)
    fn = paired_ratio_ci if kind == "ratio" else paired_diff_ci
    iv = fn(a, b, seed, level)
    stat = "a/b" if kind == "ratio" else "a-b"
    op = claim[1:-1]
    said = f"claim {stat} {op} {t:g}"
    if not iv.testable:
        return Ordering("UNKNOWN", claim, kind, t, iv, None,
                        f"{said}: {stat} = {iv.estimate:.4g} from 1 repeat: {NO_TEST}; "
                        f"repeat the arms")  # fmt: skip
    verdict = _side(claim, iv, t)
    where = (f"{stat} median {iv.estimate:.4g}, {level:.0%} interval [{iv.lo:.4g}, "
             f"{iv.hi:.4g}] over {iv.n} paired repeats")  # fmt: skip
    needed = None
    least = decisive_repeats(level)
    if verdict != "UNKNOWN" and iv.method != "identical" and iv.n < least:
        side = "lies on the claimed side" if verdict == "PASS" else "contradicts it"
        detail = (f"{said}: {where} {side}, but {iv.n} paired repeats cannot decide at "
                  f"{level:.0%}: all {iv.n} on one side has a sign-test p of "
                  f"{sign_floor(iv.n):.3g} under no effect; {least} repeats can")  # fmt: skip
        return Ordering("UNKNOWN", claim, kind, t, iv, least, detail)
    if verdict == "UNKNOWN":
        needed = repeats_to_decide(iv, t)
        needed = None if needed is None else max(needed, least)
        more = (
            "the estimate sits on the threshold: more repeats will not decide it"
            if needed is None
            else f"about {needed} repeats would decide it (half-width scaled by sqrt(n/n'), "
            f"at least {least})"
        )
        detail = f"{said}: {where} straddles {t:g}; {more}"
    else:
        side = "lies on the claimed side" if verdict == "PASS" else "contradicts it"
        detail = f"{said}: {where} {side}"
    return Ordering(verdict, claim, kind, t, iv, needed, detail)


@dataclass(frozen=True)
class Shift:
    """NEW against BASE: Mann-Whitney U (two-sided) and the interval of the ratio of medians
    new/base. ``p_value`` and ``ratio`` are None when either side has one sample."""

    n_base: int
    n_new: int
    ratio_estimate: float  # median(new) / median(base); base median 0: 1 if new's is, else ±inf
    ratio: Interval | None
    p_value: float | None
    alpha: float = ALPHA

    @property
    def testable(self) -> bool:
        return self.p_value is not None

    @property
    def exact(self) -> bool:
        """Every sample of both sides equal within its side (byte counts): any move is real."""
        return self.ratio is not None and self.ratio.method == "identical"

    @property
    def significant(self) -> bool | None:
        if self.p_value is None:
            return None
        if self.exact:
            return self.ratio_estimate != 1.0
        return self.p_value < self.alpha

    @property
    def noise_floor_pct(self) -> float | None:
        """The half-width of the ratio's interval, in percent: the smallest shift this pair of
        sample sets can tell from noise."""
        if self.ratio is None or not self.ratio.testable:
            return None
        return self.ratio.half_width * 100

    def text(self) -> str:
        if not self.testable:
            return f"{NO_TEST} ({self.n_base} vs {self.n_new} samples): bound only"
        word = "significant" if self.significant else "not significant"
        if self.exact:
            return f"{word}: exact, no spread on either side (new/base {self.ratio_estimate:.4g})"
        ratio = "new/base: no interval (a zero sample)"
        if self.ratio is not None:
            ratio = f"new/base {self.ratio.text()}, noise floor ±{self.noise_floor_pct:.1f}%"
        text = f"{word}: Mann-Whitney p={self.p_value:.2g} (α={self.alpha:g}), {ratio}"
        floor = smallest_p(self.n_base, self.n_new)
        if not self.significant and floor >= self.alpha:
            text += (f" (at {self.n_base} vs {self.n_new} samples p cannot go below "
                     f"{floor:.2g}: repeat more)")  # fmt: skip
        return text


def smallest_p(n: int, m: int) -> float:
    """The smallest two-sided Mann-Whitney p-value n vs m tie-free samples can give: the
    two most extreme of the C(n+m, n) equally likely rankings."""
    return min(1.0, 2 / math.comb(n + m, n))


def shift_test(
    base: Sequence[float], new: Sequence[float], seed: int = 0, alpha: float = ALPHA
) -> Shift:
    x, y = _array(base), _array(new)
    mb, mn = float(np.median(x)), float(np.median(y))
    est = mn / mb if mb != 0 else (1.0 if mn == 0 else math.copysign(math.inf, mn))
    if x.size < 2 or y.size < 2:
        return Shift(int(x.size), int(y.size), est, None, None, alpha)
    p = float(sps.mannwhitneyu(y, x, alternative="two-sided").pvalue)
    if math.isnan(p):  # every sample of both sides equal: no shift at all
        p = 1.0
    if np.all(x == x[0]) and np.all(y == y[0]):  # no spread anywhere: the ratio is exact
        iv = Interval(est, est, est, int(x.size + y.size), LEVEL, "identical")
    elif mb == 0 or np.any(x == 0):
        iv = None
    else:
        res = sps.bootstrap(
            (y, x),
            lambda s, r, axis: np.median(s, axis=axis) / np.median(r, axis=axis),
            n_resamples=RESAMPLES,
            vectorized=True,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
        ci = res.confidence_interval
        iv = Interval(est, float(ci.low), float(ci.high), int(x.size + y.size))
    return Shift(int(x.size), int(y.size), est, iv, p, alpha)


def sample_fields(
    samples: dict[str, Sequence[float]], seed: int
) -> tuple[dict[str, float], dict[str, list[float]], dict[str, list[float]]]:
    """What a point with repeated measures writes (the evidence convention): the medians for
    ``measures``, the raw ``samples`` in measurement order, and ``intervals`` [lo, hi] for
    every measure with two or more samples."""
    medians: dict[str, float] = {}
    raw: dict[str, list[float]] = {}
    intervals: dict[str, list[float]] = {}
    for name, values in samples.items():
        iv = median_ci(values, seed)
        medians[name] = iv.estimate
        raw[name] = [float(v) for v in values]
        if iv.testable:
            intervals[name] = iv.as_list()
    return medians, raw, intervals
