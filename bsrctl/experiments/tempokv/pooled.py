"""A serving policy grid run R times on one stack: each policy's repeats pooled into one
row, and the run order of the repeats.

Pooling is over requests, not over per-repeat summaries: p95 and mean TTFT over every
request of every repeat, throughput as all output tokens over all makespans, C as the whole
sampled byte-time over all requests. A p95 of 8 requests is nearly the slowest request; R
repeats give the percentile R times the samples. The per-repeat values stay beside the pooled
ones so a reader sees whether an ordering flips between repeats."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

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


PER_REPEAT = ("p95_ttft_s", "c_mib_s_per_req", "output_tok_s", "committed", "claims")


def pool(repeats: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One policy's per-repeat measures (as `serving._measure` writes them) pooled."""
    if not repeats:
        raise ValueError("pool: no repeats")
    ttfts = [t for m in repeats for t in m["ttfts_s"]]
    errors = sorted(e for m in repeats for e in m["ttr_error_s"])
    abs_errors = sorted(abs(e) for e in errors)
    requests = sum(int(m["requests"]) for m in repeats)
    span = sum(float(m["makespan_s"]) for m in repeats)
    tokens = sum(int(m["output_tokens"]) for m in repeats)
    c = sum(float(m["c_byte_s"]) for m in repeats)
    model_c = sum(float(m["model_c_byte_s"]) for m in repeats)
    return {
        "repeats": len(repeats),
        "p95_ttft_s": round(quantile(ttfts, 0.95), 6),
        "mean_ttft_s": round(sum(ttfts) / len(ttfts), 6) if ttfts else math.nan,
        "output_tok_s": round(tokens / span, 3) if span > 0 else math.nan,
        "c_byte_s": c,
        "c_mib_s_per_req": round(c / MIB / max(1, requests), 6),
        "model_c_mib_s_per_req": round(model_c / MIB / max(1, requests), 6),
        "peak_locked_bytes": max(int(m["peak_locked_bytes"]) for m in repeats),
        "peak_reserved_bytes": max(int(m["peak_reserved_bytes"]) for m in repeats),
        "budget_bytes": int(repeats[0]["budget_bytes"]),
        "canonical": sum(int(m["canonical"]) for m in repeats),
        "requests": requests,
        "committed": sum(int(m["committed"]) for m in repeats),
        "claims": sum(int(m["claims"]) for m in repeats),
        "deferred_claims": sum(int(m["deferred_claims"]) for m in repeats),
        "ttr_error_s": [round(e, 6) for e in errors],
        "ttr_error_abs_p50_s": round(quantile(abs_errors, 0.5), 6),
        "ttr_error_abs_p95_s": round(quantile(abs_errors, 0.95), 6),
        "ttu_error_s": sorted(round(e, 6) for m in repeats for e in m.get("ttu_error_s", ())),
        "per_repeat": {k: [m[k] for m in repeats] for k in PER_REPEAT + _goodput(repeats)},
        **_pooled_goodput(repeats, requests, span),
    }


def _goodput(repeats: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    return ("goodput_share",) if all("goodput_share" in m for m in repeats) else ()


def _pooled_goodput(
    repeats: Sequence[Mapping[str, Any]], requests: int, span: float
) -> dict[str, Any]:
    """Goodput over every request of every repeat (with an SLO: ``serving.slo_ttft_s``)."""
    if not _goodput(repeats):
        return {}
    good = sum(int(m["goodput_requests"]) for m in repeats)
    return {
        "slo_ttft_s": repeats[0]["slo_ttft_s"],
        "goodput_share": round(good / requests, 6) if requests else math.nan,
        "goodput_req_s": round(good / span, 6) if span > 0 else math.nan,
    }
