"""bsrctl.stats: seeded intervals with known values, ordering verdicts on each side and
straddling, the repeats estimate, shift tests, and one sample never tested."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bsrctl import stats


def test_median_ci_known_samples_known_interval() -> None:
    iv = stats.median_ci([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], seed=1)
    assert (iv.estimate, iv.lo, iv.hi, iv.n, iv.method) == (
        5.5,
        3.0,
        8.0,
        10,
        "bootstrap-percentile",
    )
    assert stats.median_ci([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], seed=1) == iv  # seeded: the same
    iv = stats.median_ci([10.0, 11.0, 12.0, 13.0, 50.0], seed=3)
    assert (iv.estimate, iv.lo, iv.hi) == (12.0, 10.0, 50.0)  # percentile: never off the data


def test_identical_and_single_samples() -> None:
    iv = stats.median_ci([3.0, 3.0, 3.0], seed=0)
    assert (iv.lo, iv.hi, iv.half_width, iv.method, iv.testable) == (
        3.0,
        3.0,
        0.0,
        "identical",
        True,
    )
    one = stats.median_ci([3.0], seed=0)
    assert one.estimate == 3.0 and not one.testable and math.isnan(one.lo) and math.isnan(one.hi)
    with pytest.raises(ValueError, match="non-empty"):
        stats.median_ci([], seed=0)
    with pytest.raises(ValueError, match="finite"):
        stats.median_ci([1.0, math.nan], seed=0)


def test_paired_ratio_and_diff() -> None:
    a = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02, 0.98]
    b = [2 * x for x in a]
    r = stats.paired_ratio_ci(a, b, seed=0)  # drift shared by the pair cancels exactly
    assert (r.estimate, r.lo, r.hi, r.method) == (0.5, 0.5, 0.5, "identical")
    d = stats.paired_diff_ci(b, a, seed=0)
    assert (d.estimate, d.lo, d.hi, d.n) == (1.0, 0.95, 1.05, 8)
    with pytest.raises(ValueError, match="a has 2 samples and b 3"):
        stats.paired_ratio_ci([1, 2], [1, 2, 3], seed=0)
    with pytest.raises(ValueError, match="zero"):
        stats.paired_ratio_ci([1, 2], [1, 0], seed=0)


def test_ordering_verdict_sides_and_straddle() -> None:
    a = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02, 0.98]
    fast = [x / 2 for x in a]
    assert stats.ordering_verdict(fast, a, "a<b").verdict == "PASS"
    assert stats.ordering_verdict(fast, a, "a>b").verdict == "FAIL"
    assert stats.ordering_verdict(a, fast, "a>b", kind="diff").verdict == "PASS"
    # a bound other than 1: a/b = 0.5 is within 0.6 and beyond 0.4
    assert stats.ordering_verdict(fast, a, "a<=b", threshold=0.6).verdict == "PASS"
    assert stats.ordering_verdict(fast, a, "a<=b", threshold=0.4).verdict == "FAIL"
    # identical on the threshold: strict claims fail, non-strict pass
    assert stats.ordering_verdict(a, a, "a<b").verdict == "FAIL"
    assert stats.ordering_verdict(a, a, "a<=b").verdict == "PASS"
    o = stats.ordering_verdict([1.0, 1.2, 0.9, 1.1, 1.05], [1.0] * 5, "a>b", seed=0)
    assert (o.verdict, o.interval.lo, o.interval.hi, o.repeats_needed) == ("UNKNOWN", 0.9, 1.2, 45)
    # 45 = 5 * ((1.05 - 0.9) / (1.05 - 1))^2: the near half-width scaled by sqrt(n/n')
    assert o.detail == (
        "claim a/b > 1: a/b median 1.05, 95% interval [0.9, 1.2] over 5 paired repeats "
        "straddles 1; about 45 repeats would decide it (half-width scaled by sqrt(n/n'), "
        "at least 6)"
    )
    with pytest.raises(ValueError, match="claim 'a=b'"):
        stats.ordering_verdict(a, a, "a=b")


def test_one_repeat_is_never_decided() -> None:
    o = stats.ordering_verdict([1.0], [2.0], "a<b")
    assert (o.verdict, o.repeats_needed) == ("UNKNOWN", None)
    assert "cannot test significance" in o.detail
    sh = stats.shift_test([1.0], [2.0, 2.1])
    assert (sh.testable, sh.p_value, sh.ratio, sh.significant) == (False, None, None, None)
    assert sh.text() == "cannot test significance (1 vs 2 samples): bound only"


def test_shift_test() -> None:
    base = [float(x) for x in range(1, 11)]
    sh = stats.shift_test(base, [x + 10 for x in base], seed=0)
    assert sh.p_value == pytest.approx(0.000182671791, rel=1e-9) and sh.significant
    assert (sh.ratio.lo, sh.ratio.hi) == (1.8, 5.5)
    same = stats.shift_test(base, base, seed=0)
    assert same.p_value == 1.0 and same.significant is False
    # no spread on either side: a byte count that moved moved for sure
    assert stats.shift_test([4.0] * 3, [5.0] * 3).significant is True
    assert stats.shift_test([4.0] * 3, [4.0] * 3).significant is False
    few = stats.shift_test([1.0, 1.1], [2.0, 2.1])
    assert few.significant is False and "p cannot go below 0.33: repeat more" in few.text()


def test_sample_fields_is_the_evidence_convention() -> None:
    medians, raw, intervals = stats.sample_fields({"ttft_s": [3.0, 1.0, 2.0], "x": [5.0]}, 0)
    assert medians == {"ttft_s": 2.0, "x": 5.0}
    assert raw == {"ttft_s": [3.0, 1.0, 2.0], "x": [5.0]}  # measurement order kept
    assert list(intervals) == ["ttft_s"]  # one sample: no interval


samples = st.lists(
    st.floats(min_value=1e-3, max_value=1e3, allow_nan=False), min_size=2, max_size=30
)


@settings(max_examples=60, deadline=None)
@given(samples, st.integers(0, 2**32 - 1))
def test_median_ci_contains_the_median(xs: list[float], seed: int) -> None:
    iv = stats.median_ci(xs, seed)
    eps = 1e-12 * max(xs)  # the percentile interpolates: a last-bit rounding either way
    assert iv.lo - eps <= float(np.median(xs)) <= iv.hi + eps
    assert min(xs) - eps <= iv.lo and iv.hi <= max(xs) + eps


@settings(max_examples=30, deadline=None)
@given(st.floats(min_value=1e-3, max_value=1e3), st.integers(2, 20))
def test_identical_samples_have_zero_width(x: float, n: int) -> None:
    assert stats.median_ci([x] * n, seed=0).half_width == 0.0


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(min_value=0.5, max_value=2.0), min_size=6, max_size=20),
    st.sampled_from([0.2, 0.5, 2.0, 5.0]),
)
def test_a_far_ratio_is_decided(xs: list[float], k: float) -> None:
    # b = a*k with k far from 1: every pair's ratio is 1/k, whatever the spread of a
    o = stats.ordering_verdict(xs, [x * k for x in xs], "a<b")
    assert o.verdict == ("PASS" if k > 1 else "FAIL")


def test_fewer_than_six_repeats_decide_nothing_that_was_sampled() -> None:
    """Three pairs all on one side: the bootstrap's interval is their range and excludes 1,
    but under no effect at all that happens one time in four (2 / 2^3): UNKNOWN, naming the
    sign-test floor and the repeats that can decide. Six pairs can; equal samples are exact
    at any n."""
    assert (stats.sign_floor(3), stats.sign_floor(5), stats.sign_floor(6)) == (
        0.25,
        0.0625,
        0.03125,
    )
    assert stats.decisive_repeats() == 6 and stats.decisive_repeats(0.99) == 8
    o = stats.ordering_verdict([0.5, 0.6, 0.55], [1.0] * 3, "a<b")
    assert (o.verdict, o.interval.lo, o.interval.hi, o.repeats_needed) == ("UNKNOWN", 0.5, 0.6, 6)
    assert o.detail == (
        "claim a/b < 1: a/b median 0.55, 95% interval [0.5, 0.6] over 3 paired repeats lies "
        "on the claimed side, but 3 paired repeats cannot decide at 95%: all 3 on one side "
        "has a sign-test p of 0.25 under no effect; 6 repeats can"
    )
    six = stats.ordering_verdict([0.5, 0.6, 0.55, 0.52, 0.58, 0.54], [1.0] * 6, "a<b")
    assert (six.verdict, six.repeats_needed) == ("PASS", None)
    exact = stats.ordering_verdict([2.0] * 3, [1.0] * 3, "a<b")  # byte counts: no sampling
    assert (exact.verdict, exact.interval.method) == ("FAIL", "identical")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0.1, max_value=10.0), st.floats(min_value=0.1, max_value=10.0)
        ),
        min_size=2,
        max_size=5,
    ).filter(lambda ps: len({a / b for a, b in ps}) > 1),
    st.sampled_from(["a<b", "a>b", "a<=b", "a>=b"]),
)
def test_no_sampled_ordering_of_five_or_fewer_pairs_is_decided(
    pairs: list[tuple[float, float]], claim: str
) -> None:
    a, b = [x for x, _ in pairs], [y for _, y in pairs]
    assert stats.ordering_verdict(a, b, claim).verdict == "UNKNOWN"
