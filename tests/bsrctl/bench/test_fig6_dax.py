"""Figure 6's ``--baseline dax`` parts that need no stack: its arms, last line and goals, each
request's retrieval timeline from spans, the timeline figure, and the refusals (a spec
without the flash tier, the decomposition arms)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench" / "tempokv"
_spec = importlib.util.spec_from_file_location("fig6_serving_dax", BENCH / "fig6_serving.py")
assert _spec is not None and _spec.loader is not None
fig6 = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = fig6
_spec.loader.exec_module(fig6)

from fig6 import dax  # noqa: E402
from fig6.cells import Cell, claim_checks, last_line  # noqa: E402
from fig6.timeline import draw  # noqa: E402
from fig6.where import Row, rows_of, timeline_lines  # noqa: E402

from bsrctl.trace.timeline import spans_of  # noqa: E402

ARMS = ("lmcache-dax", "tempokv")


def _cells(tk: list[tuple[float, float]], lm: list[tuple[float, float]], rate: float = 4.0):
    return [
        {"lmcache-dax": {rate: Cell(p, t, 16, 16, "")}, "tempokv": {rate: Cell(q, u, 16, 16, "")}}
        for (q, u), (p, t) in zip(tk, lm, strict=True)
    ]


def test_the_dax_arms_and_last_line() -> None:
    assert dax.ARMS == ARMS and dax.RATES == (0.2, 0.5, 1.0, 2.0, 4.0)
    cells = _cells([(0.5, 110.0)] * 3, [(1.0, 100.0)] * 3)
    line = last_line([4.0], cells, "tempokv", "lmcache-dax", "fig6-dax")
    want = "fig6-dax tput tempokv/lmcache-dax @4=1.1 [1.1, 1.1] "
    assert line == want + "p95 tempokv/lmcache-dax @4=0.5 [0.5, 0.5]"


def test_goals_read_the_per_rate_claims() -> None:
    rates = [2.0, 4.0]
    ahead = _cells(
        [(0.5, 110.0), (0.52, 108.0), (0.48, 112.0), (0.5, 109.0), (0.51, 111.0), (0.49, 110.0)],
        [(1.0, 100.0)] * 6,
        4.0,
    )  # fmt: skip (6: decisive)
    for c, a in zip(ahead, _cells([(1.0, 100.0)] * 6, [(1.0, 100.0)] * 6, 2.0), strict=True):
        for arm in ARMS:
            c[arm].update(a[arm])
    checks = claim_checks(rates, ahead, "tempokv", "lmcache-dax")
    got = dax.goal_lines(rates, ahead, checks)
    assert got[0] == "goal never decidedly behind: met"
    assert got[1].startswith("goal p95 decidedly ahead at the two highest rates: {'@2': ")
    assert got[1].endswith("(not met)")  # @2 ties: not decidedly ahead (p95 <= holds)
    assert "'@2': 'FAIL'" in got[1] and "'@4': 'PASS'" in got[1]
    behind = _cells([(2.0, 50.0), (2.1, 52.0), (1.9, 51.0), (2.0, 49.0), (2.05, 50.5),
                     (1.95, 51.5)], [(1.0, 100.0)] * 6)  # fmt: skip
    got = dax.goal_lines([4.0], behind, claim_checks([4.0], behind, "tempokv", "lmcache-dax"))
    assert got[0].startswith("goal never decidedly behind: NOT met: tput_tempokv/lmcache-dax_@4")
    few = behind[:3]  # as far behind, but 3 repeats decide nothing
    got = dax.goal_lines([4.0], few, claim_checks([4.0], few, "tempokv", "lmcache-dax"))
    assert got[0] == "goal never decidedly behind: met, vacuously: 3 repeats decide no claim"


def test_paper_magnitudes_are_fig6s() -> None:
    assert dax.paper_line() == (
        "paper (Fig. 6, tempokv/lmcache-dax, best over r = 0.2-4 rps): NarrativeQA: tput up "
        "to 1.278, p95 down to 0.520; LooGLE: tput up to 1.155, p95 down to 0.676"
    )


def _rec(name: str, a_ms: int, b_ms: int, rid: str) -> dict:
    return {"name": name, "service": "x", "start_ns": a_ms * 10**6, "end_ns": b_ms * 10**6,
            "attributes": {"request_id": f"cmpl-{rid}-0"}}  # fmt: skip


def test_each_requests_retrieval_timeline_from_its_spans(tmp_path: Path) -> None:
    a, b, c = "bsrq-" + "a" * 16, "bsrq-" + "b" * 16, "bsrq-" + "c" * 16
    spans = spans_of([
        _rec("client.request", 1000, 3000, a), _rec("client.ttft", 1000, 1900, a),
        _rec("bsr.stock_retrieve", 1200, 1700, a),  # DAX: 0.5 s of faults
        _rec("client.request", 1250, 3000, b), _rec("client.ttft", 1250, 2600, b),
        _rec("tempokv.hold", 1300, 2000, b), _rec("bsr.stock_retrieve", 2100, 2150, b),
        _rec("client.request", 1500, 1600, "bsrq-" + "d" * 16),  # another cell's
    ])  # fmt: skip
    rows = rows_of(spans, [a, b, c])  # c: its spans were lost
    assert rows == [Row(a, 0.0, 0.2, 0.0, 0.5, 0.9), Row(b, 0.25, 0.85, 0.7, 0.05, 1.35)]
    assert [r.flash_wait_s for r in rows] == [0.5, 0.75]
    lines = timeline_lines("tempokv", 4.0, rows)
    assert lines[0].startswith("timeline tempokv @4 rps (2 requests): retrieve start after "
                               "arrival median 0.525 ")  # fmt: skip
    assert lines[3] == "| 0 | 0.00 | 0.200 | 0.000 | 0.500 | 0.500 | 0.900 |"
    svg = draw({"lmcache-dax": rows[:1], "tempokv": rows[1:]}, 4.0, tmp_path / "t.svg")
    assert svg.read_text().startswith("<svg") and "lmcache-dax" in svg.read_text()


def test_dax_without_a_flash_tier_and_decomposition_arms_are_refused(monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["fig6", "--baseline", "dax", str(fig6.DEFAULT_SPEC)])
    assert fig6.main() == 2
    assert "serving.fast_tier: --baseline dax needs it" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["fig6", "--baseline", "dax", "--adapter-arm"])
    try:
        fig6.main()
    except SystemExit as e:
        assert e.code == 2
    assert "--baseline fs only" in capsys.readouterr().err


def test_a_demand_ratio_is_the_flash_tiers_and_positive(monkeypatch, capsys) -> None:
    import pytest

    for argv in (["--demand-ratio", "0.5"], ["--baseline", "dax", "--demand-ratio", "0"]):
        monkeypatch.setattr(sys, "argv", ["fig6", *argv])
        with pytest.raises(SystemExit) as e:
            fig6.main()
        assert e.value.code == 2
        assert "--baseline dax only, each > 0" in capsys.readouterr().err


def test_a_cell_records_the_hosts_cpu() -> None:
    a, b = (100, 1000, 2), (400, 1400, 2)  # 300 busy jiffies of 400
    got = dax.host_busy(a, b)
    assert (got["cpu_busy"], got["cpus"]) == (0.75, 2) and got["loadavg_1m"] >= 0
    busy, total, cpus = dax.host_cpu()
    assert 0 <= busy <= total and cpus >= 1


def test_the_benchs_headroom_is_each_arms_own_per_rate() -> None:
    from fig6.headroom import Headroom, arm_headroom

    a, b = "bsrq-" + "a" * 16, "bsrq-" + "b" * 16
    spans = spans_of([
        # LMCache-DAX's request: arrives at 1.0 s, waits 0.2 s, faults 1.2-1.6 s, done at 1.7 s
        _rec("client.request", 1000, 1700, a), _rec("bsr.stock_retrieve", 1200, 1600, a),
        # TempoKV's: arrives at 5.0 s, its server (pid 9) stages 5.1-5.5 s, retrieve 5.5-5.6 s
        _rec("client.request", 5000, 5800, b), _rec("bsr.stock_retrieve", 5500, 5600, b),
        {**_rec("tempokv.stage", 5100, 5500, b), "pid": 9, "attributes": {"op": 0}},
    ])  # fmt: skip
    cells = [{"lmcache-dax": {4.0: Cell(1.0, 1.0, 1, 1, "", request_ids=(a,))},
              "tempokv": {4.0: Cell(1.0, 1.0, 1, 1, "", request_ids=(b,))}}]  # fmt: skip
    got = arm_headroom(spans, cells, [4.0], ARMS, {9: "tempokv"})
    rounded = {arm: [Headroom(*(round(x, 9) for x in (h.span_s, h.reading_s, h.idle_wait_s,
                                                      h.engine_s))) for h in by[4.0]]
               for arm, by in got.items()}  # fmt: skip
    assert rounded == {
        "lmcache-dax": [Headroom(0.6, 0.4, 0.2, 0.1)],
        "tempokv": [Headroom(0.6, 0.5, 0.1, 0.2)],
    }
