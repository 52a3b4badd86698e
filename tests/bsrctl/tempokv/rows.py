"""Typed serving measures for tests: every field set, a test overrides what it is about."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bsrctl.tempokv.measures import PerRepeat, PooledMeasures, RepeatMeasures

REPEAT = RepeatMeasures(
    ttfts_s=(1.0,), makespan_s=1.0, output_tokens=4, p95_ttft_s=1.0, mean_ttft_s=1.0,
    output_tok_s=4.0, c_byte_s=0.0, c_mib_s_per_req=0.0, model_c_byte_s=0.0,
    model_c_mib_s_per_req=0.0, peak_locked_bytes=100, peak_reserved_bytes=200,
    budget_bytes=1000, canonical=1, requests=1, committed=1, deferred_claims=0, claims=2,
    reports_dropped_since_start={}, retrievals={}, ttr_error_s=(), ttr_error_abs_p50_s=0.0,
    ttr_error_abs_p95_s=0.0, ttu_error_s=(),
)  # fmt: skip


def repeat(**over: Any) -> RepeatMeasures:
    return replace(REPEAT, **over)


def pooled(p95s: list[float], cs: list[float], **over: Any) -> PooledMeasures:
    """A pooled row whose per-repeat p95 TTFT and C are ``p95s`` and ``cs``, pooled values
    their means, 8 requests per repeat."""
    n = len(p95s)
    row = PooledMeasures(
        repeats=n, p95_ttft_s=sum(p95s) / n, mean_ttft_s=1.0, output_tok_s=10.0, c_byte_s=0.0,
        c_mib_s_per_req=sum(cs) / n, model_c_mib_s_per_req=0.0, peak_locked_bytes=100,
        peak_reserved_bytes=200, budget_bytes=1000, canonical=8 * n, requests=8 * n,
        committed=n, claims=n, deferred_claims=0, ttr_error_s=(), ttr_error_abs_p50_s=0.0,
        ttr_error_abs_p95_s=0.0, ttu_error_s=(),
        per_repeat=PerRepeat(p95_ttft_s=tuple(p95s), c_mib_s_per_req=tuple(cs),
                             output_tok_s=(10.0,) * n, committed=(1,) * n, claims=(1,) * n),
    )  # fmt: skip
    return replace(row, **over)
