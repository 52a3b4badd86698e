"""The serving run's per-policy measures, pooled over repeats, and the run checks' verdicts
with their per-repeat outcomes: exact values from made-up results (no stack)."""

from __future__ import annotations

from types import SimpleNamespace

from bsrctl.evidence import Verdict
from bsrctl.experiments.tempokv.pooled import MIB, pool
from bsrctl.experiments.tempokv.serving import _measure, _run_checks
from bsrctl.tempokv import wire


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
    assert m["ttfts_s"] == [0.5, 1.0] and m["makespan_s"] == 3.0 and m["output_tokens"] == 5
    assert m["c_mib_s_per_req"] == 1.5 and m["model_c_byte_s"] == 1.5 * MIB
    assert (m["canonical"], m["requests"], m["committed"], m["claims"]) == (1, 2, 2, 2)
    assert m["ttr_error_s"] == [0.05] and m["ttu_error_s"] == [0.3]
    (point,) = w.points
    assert point.id == "serving/r1/tempokv" and point.params["repeat"] == 1
    assert {c.name: c.verdict for c in point.checks}["canonical_output"] is Verdict.FAIL
    # the evidence keeps the status's lists as the server sent them
    raw = STATUS.to_json()
    assert point.extra["extra"] == {k: raw[k] for k in ("claims", "ttr", "stages",
                                                        "observed_stock_reads")}  # fmt: skip
    assert m["reports_dropped_since_start"] == {"tempokv_reports_after_lookup": 1}
    assert (m["retrievals"], m["deferred_claims"], m["peak_locked_bytes"]) == (
        {"a": "READY"}, 1, 4096)  # fmt: skip
    p = pool([m, m])
    assert (p["requests"], p["canonical"], p["c_mib_s_per_req"]) == (4, 2, 1.5)
    assert p["ttu_error_s"] == [0.3, 0.3] and p["output_tok_s"] == round(10 / 6.0, 3)


def _row(p95s: list[float], cs: list[float]) -> dict:
    return {
        "p95_ttft_s": sum(p95s) / len(p95s), "c_mib_s_per_req": sum(cs) / len(cs),
        "requests": 8 * len(p95s),
        "per_repeat": {"p95_ttft_s": p95s, "c_mib_s_per_req": cs},
    }  # fmt: skip


def test_checks_judge_pooled_and_list_each_repeat() -> None:
    rows = {
        "demand": _row([2.0, 1.0, 3.0], [0.1, 0.1, 0.1]),
        "immediate": _row([1.0, 1.0, 1.0], [0.5, 0.2, 0.9]),
        "tempokv": _row([1.5, 1.2, 2.0], [0.3, 0.3, 0.3]),
    }
    c, p = _run_checks(rows)
    assert (c.name, c.verdict) == ("c_below_immediate", Verdict.PASS)  # 0.3 < 0.5333
    assert c.detail.endswith("per repeat: held, failed, held (2/3)")
    assert (p.name, p.verdict) == ("p95_below_demand", Verdict.PASS)  # 1.5667 < 2.0
    assert p.detail.endswith("per repeat: held, failed, held (2/3)")
    rows["tempokv"] = _row([2.5, 1.2, 3.5], [0.6, 0.3, 0.95])
    c, p = _run_checks(rows)
    assert (c.verdict, p.verdict) == (Verdict.FAIL, Verdict.FAIL)
    assert c.detail.endswith("(0/3)") and p.detail.endswith("(0/3)")
