"""Pooling a serving policy's repeats: over requests, exactly; the repeat run order."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bsrctl.tempokv.experiments.pooled import MIB, pool, quantile, run_order
from bsrctl.tempokv.measures import RepeatMeasures
from tests.bsrctl.tempokv.rows import repeat


def _rep(ttfts: list[float], c: float, tokens: int, span: float, **over: object) -> RepeatMeasures:
    m = dict(
        ttfts_s=tuple(ttfts), makespan_s=span, output_tokens=tokens, c_byte_s=c,
        model_c_byte_s=2 * c, requests=len(ttfts), canonical=len(ttfts), committed=1, claims=2,
        ttr_error_s=(0.1, -0.3), p95_ttft_s=quantile(ttfts, 0.95), output_tok_s=tokens / span,
        c_mib_s_per_req=c / MIB / len(ttfts),
    )  # fmt: skip
    return repeat(**{**m, **over})


def test_pooled_over_requests_not_over_repeat_summaries() -> None:
    a = _rep([1.0, 2.0, 3.0, 4.0], 4 * MIB, 40, 2.0, peak_locked_bytes=700, committed=3)
    b = _rep([10.0, 20.0], 8 * MIB, 20, 4.0, ttr_error_s=(0.2,))
    p = pool([a, b])
    ttfts = [1.0, 2.0, 3.0, 4.0, 10.0, 20.0]
    assert p.repeats == 2 and p.requests == 6 and p.canonical == 6
    assert p.p95_ttft_s == round(quantile(ttfts, 0.95), 6) == 17.5  # 10 + 0.75·10
    assert p.mean_ttft_s == round(40.0 / 6, 6)
    assert p.output_tok_s == 10.0  # 60 tokens over 6 s of makespan
    assert p.c_mib_s_per_req == 2.0  # 12 MiB·s over 6 requests
    assert p.model_c_mib_s_per_req == 4.0
    assert p.peak_locked_bytes == 700 and p.peak_reserved_bytes == 200
    assert (p.committed, p.claims) == (4, 4)
    assert p.ttr_error_s == (-0.3, 0.1, 0.2)
    assert p.ttr_error_abs_p50_s == 0.2 and p.ttr_error_abs_p95_s == 0.29
    assert p.per_repeat.committed == (3, 1)
    assert p.per_repeat.p95_ttft_s == (a.p95_ttft_s, b.p95_ttft_s)


def test_goodput_pools_over_requests_when_every_repeat_has_an_slo() -> None:
    slo = {"slo_ttft_s": 2.5}
    a = _rep([1.0, 2.0, 3.0, 4.0], MIB, 40, 2.0, goodput_requests=2, goodput_share=0.5, **slo)
    b = _rep([10.0, 2.0], MIB, 20, 4.0, goodput_requests=1, goodput_share=0.5, **slo)
    p = pool([a, b])
    assert (p.slo_ttft_s, p.goodput_share, p.goodput_req_s) == (2.5, 0.5, 0.5)
    assert p.per_repeat.goodput_share == (0.5, 0.5)
    plain = pool([_rep([1.0], MIB, 4, 1.0)])
    assert plain.goodput_share is None and plain.per_repeat.goodput_share is None
    assert "goodput_share" not in plain.to_json()  # the JSON as before: no key, not null
    assert "goodput_share" not in plain.to_json()["per_repeat"]


def test_one_repeat_pools_to_itself() -> None:
    a = _rep([0.5, 0.7, 0.9], 3 * MIB, 30, 3.0)
    p = pool([a])
    assert p.p95_ttft_s == round(a.p95_ttft_s, 6)
    assert p.output_tok_s == a.output_tok_s and p.c_mib_s_per_req == 1.0


def test_no_repeat_is_an_error_and_no_sample_is_nan() -> None:
    with pytest.raises(ValueError, match="no repeats"):
        pool([])
    assert math.isnan(quantile([], 0.95))


def test_run_order_alternates() -> None:
    pols = ["demand", "immediate", "tempokv"]
    assert [run_order(pols, r) for r in range(3)] == [pols, pols[::-1], pols]


@given(st.lists(st.lists(st.floats(0.0, 100.0), min_size=1, max_size=9), min_size=1, max_size=5))
def test_pooled_p95_lies_within_the_repeats_samples(samples: list[list[float]]) -> None:
    p = pool([_rep(xs, 0.0, 1, 1.0) for xs in samples])
    flat = [x for xs in samples for x in xs]
    assert min(flat) - 1e-6 <= p.p95_ttft_s <= max(flat) + 1e-6
    assert p.requests == len(flat)
    assert p.p95_ttft_s == pool([_rep(xs, 0.0, 1, 1.0) for xs in reversed(samples)]).p95_ttft_s
