"""A serving policy grid run R times on one stack: each policy's repeats pooled into one
row, and the run order of the repeats.

Pooling is over requests, not over per-repeat summaries: p95 and mean TTFT over every
request of every repeat, throughput as all output tokens over all makespans, C as the whole
sampled byte-time over all requests. A p95 of 8 requests is nearly the slowest request; R
repeats give the percentile R times the samples. The per-repeat values stay beside the pooled
ones so a reader sees whether an ordering flips between repeats."""

from __future__ import annotations

import math
from collections.abc import Sequence

from bsrctl.tempokv.measures import PerRepeat, PooledMeasures, RepeatMeasures

MIB = 1 << 20


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default); NaN for no samples."""
    if not xs:
        return math.nan
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def run_order(policies: Sequence[str], repeat: int) -> list[str]:
    """Forward on even repeats, reversed on odd ones: slow drift of a shared machine then
    falls on every policy about equally (ABBA) instead of always on the last ones."""
    return list(policies) if repeat % 2 == 0 else list(reversed(policies))


def pool(repeats: Sequence[RepeatMeasures]) -> PooledMeasures:
    """One policy's per-repeat measures (as `serving._measure` makes them) pooled."""
    if not repeats:
        raise ValueError("pool: no repeats")
    ttfts = [t for m in repeats for t in m.ttfts_s]
    errors = sorted(e for m in repeats for e in m.ttr_error_s)
    abs_errors = sorted(abs(e) for e in errors)
    requests = sum(m.requests for m in repeats)
    span = sum(m.makespan_s for m in repeats)
    tokens = sum(m.output_tokens for m in repeats)
    c = sum(m.c_byte_s for m in repeats)
    model_c = sum(m.model_c_byte_s for m in repeats)
    # goodput pooled only when every repeat had an SLO (serving.slo_ttft_s)
    shares = tuple(m.goodput_share for m in repeats if m.goodput_share is not None)
    slo = len(shares) == len(repeats)
    good = sum(m.goodput_requests or 0 for m in repeats)
    return PooledMeasures(
        repeats=len(repeats),
        p95_ttft_s=round(quantile(ttfts, 0.95), 6),
        mean_ttft_s=round(sum(ttfts) / len(ttfts), 6) if ttfts else math.nan,
        output_tok_s=round(tokens / span, 3) if span > 0 else math.nan,
        c_byte_s=c,
        c_mib_s_per_req=round(c / MIB / max(1, requests), 6),
        model_c_mib_s_per_req=round(model_c / MIB / max(1, requests), 6),
        peak_locked_bytes=max(m.peak_locked_bytes for m in repeats),
        peak_reserved_bytes=max(m.peak_reserved_bytes for m in repeats),
        budget_bytes=repeats[0].budget_bytes,
        canonical=sum(m.canonical for m in repeats),
        requests=requests,
        committed=sum(m.committed for m in repeats),
        claims=sum(m.claims for m in repeats),
        deferred_claims=sum(m.deferred_claims for m in repeats),
        ttr_error_s=tuple(round(e, 6) for e in errors),
        ttr_error_abs_p50_s=round(quantile(abs_errors, 0.5), 6),
        ttr_error_abs_p95_s=round(quantile(abs_errors, 0.95), 6),
        ttu_error_s=tuple(sorted(round(e, 6) for m in repeats for e in m.ttu_error_s)),
        per_repeat=PerRepeat(
            p95_ttft_s=tuple(m.p95_ttft_s for m in repeats),
            c_mib_s_per_req=tuple(m.c_mib_s_per_req for m in repeats),
            output_tok_s=tuple(m.output_tok_s for m in repeats),
            committed=tuple(m.committed for m in repeats),
            claims=tuple(m.claims for m in repeats),
            goodput_share=shares if slo else None,
        ),
        slo_ttft_s=repeats[0].slo_ttft_s if slo else None,
        goodput_share=(round(good / requests, 6) if requests else math.nan) if slo else None,
        goodput_req_s=(round(good / span, 6) if span > 0 else math.nan) if slo else None,
    )
