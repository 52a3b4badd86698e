"""The serving run's per-policy measures, pooled over repeats, and the run checks' verdicts
with their per-repeat outcomes: exact values from made-up results (no stack)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bsrctl.evidence import Verdict
from bsrctl.tempokv.experiments.pooled import MIB, pool
from bsrctl.tempokv.experiments.serving import _measure, _run_checks
from bsrctl.tempokv.measures import PooledMeasures, point_measures
from bsrkv.tempokv import wire
from tests.bsrctl.tempokv.rows import pooled


class Writer:
    def __init__(self) -> None:
        self.points: list = []

    def add_point(self, point) -> None:
        self.points.append(point)


def _result(sent: float, first: float, done: float, out: tuple[int, ...]) -> SimpleNamespace:
    return SimpleNamespace(sent_s=sent, first_token_s=first, done_s=done, output_token_ids=out)


STATUS = wire.StatusReply.from_json({
    "policy": "tempokv", "timed": True, "budget_bytes": 10_000, "attempts": 2,
    "c_byte_s": 3.0 * MIB, "model_c_byte_s": 1.5 * MIB, "peak_locked_bytes": 4096,
    "peak_reserved_bytes": 8192, "samples": 10, "claims": {"a": [], "b": []},
    "deferred_claims": 1, "retrievals": {"a": "READY"},
    "ttr": [
        {"claim": "a", "ttr_est_s": 0.2, "stage_ready_s": 0.25, "ttu_est_s": 0.1,
         "retrieval_s": 0.4},
        {"claim": "b", "ttr_est_s": 0.3, "stage_ready_s": None, "ttu_est_s": None,
         "retrieval_s": None},
    ],
    "stages": [{"op": 1, "bytes": 4096, "start_s": 0.1, "done_s": 0.2, "missed": 0}],
    "observed_stock_reads": {"count": 0, "bytes": 0, "outcomes": {}, "reads": []},
    "locked_bytes_now": 0, "reports_dropped": {"tempokv_reports_after_lookup": 1},
})  # fmt: skip


def test_measures_are_exact_and_pool() -> None:
    results = [_result(0.0, 0.5, 1.0, (1, 2)), _result(0.5, 1.5, 3.0, (3, 4, 5))]
    canonical = [(1, 2), (3, 4, 9)]  # the second output differs
    w = Writer()
    m = _measure("tempokv", 1, results, canonical, STATUS, 10_000, w, [True, True])
    assert m.ttfts_s == (0.5, 1.0) and m.makespan_s == 3.0 and m.output_tokens == 5
    assert m.c_mib_s_per_req == 1.5 and m.model_c_byte_s == 1.5 * MIB
    assert (m.canonical, m.requests, m.committed, m.claims) == (1, 2, 2, 2)
    assert m.ttr_error_s == (0.05,) and m.ttu_error_s == (0.3,)
    (point,) = w.points
    assert point.id == "serving/r1/tempokv" and point.params["repeat"] == 1
    assert {c.name: c.verdict for c in point.checks}["canonical_output"] is Verdict.FAIL
    # the point keeps the measures as JSON (no SLO, no flash tier: their keys left out)
    assert point.measures == {**m.to_json(), "guards": None}
    assert "slo_ttft_s" not in point.measures and "flash_read_bytes" not in point.measures
    assert point_measures(point.measures) == (m, None)
    # the evidence keeps the status's lists as the server sent them
    raw = STATUS.to_json()
    assert point.extra["extra"] == {k: raw[k] for k in ("claims", "ttr", "stages",
                                                        "observed_stock_reads")}  # fmt: skip
    assert m.reports_dropped_since_start == {"tempokv_reports_after_lookup": 1}
    assert (m.retrievals, m.deferred_claims, m.peak_locked_bytes) == (
        {"a": "READY"}, 1, 4096)  # fmt: skip
    p = pool([m, m])
    assert (p.requests, p.canonical, p.c_mib_s_per_req) == (4, 2, 1.5)
    assert p.ttu_error_s == (0.3, 0.3) and p.output_tok_s == round(10 / 6.0, 3)


def _row(p95s: list[float], cs: list[float]) -> PooledMeasures:
    return pooled(p95s, cs)


def test_checks_judge_the_paired_repeats_and_list_each_repeat() -> None:
    """Each ordering is decided by the 95 % interval of the per-repeat ratio tempokv/other
    (bsrctl.stats.ordering_verdict), not by the pooled values: one repeat the other way
    in three leaves it straddling 1 (UNKNOWN), where the pooled values alone read PASS."""
    rows = {
        "demand": _row([2.0, 1.0, 3.0], [0.1, 0.1, 0.1]),
        "immediate": _row([1.0, 1.0, 1.0], [0.5, 0.2, 0.9]),
        "tempokv": _row([1.5, 1.2, 2.0], [0.3, 0.3, 0.3]),
    }
    c, p = _run_checks(rows)
    assert (c.name, c.verdict, c.outcome) == (
        "c_below_immediate",
        Verdict.UNKNOWN,
        "could not tell",
    )
    assert c.detail.endswith("per repeat: held, failed, held (2/3)")
    assert (
        "a/b median 0.6, 95% interval [0.3333, 1.5] over 3 paired repeats straddles 1" in c.detail
    )
    assert "about 16 repeats would decide it" in c.detail  # 3 * (0.9 / 0.4)^2 = 15.2
    assert (p.name, p.verdict) == ("p95_below_demand", Verdict.UNKNOWN)  # ratios .75 1.2 .667
    assert p.detail.endswith("per repeat: held, failed, held (2/3)")
    rows["tempokv"] = _row([1.5, 0.8, 2.4], [0.25, 0.1, 0.47])  # every repeat below
    c, p = _run_checks(rows)  # three repeats, all one way: still no decision (sign test)
    assert (c.verdict, p.verdict) == (Verdict.UNKNOWN, Verdict.UNKNOWN)
    assert "lies on the claimed side, but 3 paired repeats cannot decide" in c.detail
    assert c.detail.endswith("(3/3)") and p.detail.endswith("(3/3)")
    six = {
        "demand": _row([2.0, 1.0, 3.0] * 2, [0.1] * 6),
        "immediate": _row([1.0] * 6, [0.5, 0.2, 0.9] * 2),
    }
    six["tempokv"] = _row([1.5, 0.8, 2.4] * 2, [0.25, 0.1, 0.47] * 2)  # every repeat below
    c, p = _run_checks(six)
    assert (c.verdict, p.verdict) == (Verdict.PASS, Verdict.PASS)
    assert c.outcome == "reproduces" and "lies on the claimed side" in c.detail
    assert c.detail.endswith("(6/6)") and p.detail.endswith("(6/6)")
    six["tempokv"] = _row([2.5, 1.2, 3.5] * 2, [0.6, 0.3, 0.95] * 2)  # every repeat above
    c, p = _run_checks(six)
    assert (c.verdict, p.verdict) == (Verdict.FAIL, Verdict.FAIL)
    assert "contradicts it" in c.detail
    assert c.detail.endswith("(0/6)") and p.detail.endswith("(0/6)")


def test_one_repeat_cannot_decide_an_ordering() -> None:
    rows = {"immediate": _row([1.0], [0.5]), "tempokv": _row([0.5], [0.1])}
    (c,) = _run_checks(rows)
    assert c.verdict == Verdict.UNKNOWN and "cannot test significance" in c.detail


@pytest.mark.parametrize(
    ("a", "b", "claim", "verdict", "reproduced"),
    [
        ([1.0, 1.1, 0.9, 1.0, 1.05, 0.95], [2.0, 2.1, 2.0, 1.9, 2.0, 2.05], "a<b", "PASS", True),
        ([3.0, 3.1, 2.9, 3.0, 3.05, 2.95], [2.0, 2.1, 2.0, 1.9, 2.0, 2.05], "a<b", "FAIL", False),
        ([1.0, 3.0, 1.0, 3.0, 1.0, 3.0], [2.0] * 6, "a<b", "UNKNOWN", None),
        (
            [3.0, 3.1, 2.9, 3.0, 3.05, 2.95],
            [2.0, 2.1, 2.0, 1.9, 2.0, 2.05],
            "a>=b",
            "PASS",
            True,
        ),  # throughput
        ([1.0, 1.1, 0.9, 1.0], [2.0, 2.1, 2.0, 1.9], "a<b", "UNKNOWN", None),  # 4: too few
        ([1.0, 1.0, 1.0], [0.0, 0.0, 0.0], "a>b", "PASS", True),  # a zero: by difference
    ],
)
def test_ordering_claims_on_synthetic_repeats(a, b, claim, verdict, reproduced) -> None:
    from bsrctl.tempokv.experiments.expectations import REPRODUCE, judge, ordering_claim
    from bsrctl.tempokv.spec import Expectation

    got = ordering_claim("x", "x", a, b, claim, "tempokv vs other")
    assert got.reproduced is reproduced and got.detail.startswith(f"tempokv vs other: {verdict}, ")
    assert str(judge(got, REPRODUCE, "s").verdict) == verdict
    # a declared deviation on top: the claim known not to hold passes only when it does not
    dev = judge(got, Expectation(expect="deviation", reason="measured: slower here"), "s")
    want = {"PASS": "FAIL", "FAIL": "PASS", "UNKNOWN": "UNKNOWN"}[verdict]
    assert str(dev.verdict) == want
