"""Repeated restore points (``sweep.repeats``): rotated rounds, samples and intervals of the
timed measures, byte measures identical across repeats (a repeat whose peak moved FAILs
naming it), and BSR against the whole plan judged over the paired repeats. The pure parts
on synthetic measures; the sweeps on the real storage stack (small geometry, seconds)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from bsrctl import stats
from bsrctl.evidence.verdict import Verdict
from bsrctl.experiments.restore.repeats import (
    identical_check,
    merged_checks,
    repeated_point,
    rounds,
)
from bsrctl.experiments.restore.spec import SweepSpec
from bsrctl.experiments.restore.sweep import whole_plan_ratios
from bsrctl.stack.target import RestoreMeasures

C = 262_144


def test_rounds_rotate_by_one_after_the_warmup() -> None:
    assert list(rounds(3, 3, 1)) == [
        (-1, [0, 1, 2]),
        (0, [1, 2, 0]),
        (1, [2, 0, 1]),
        (2, [0, 1, 2]),
    ]
    assert list(rounds(2, 1, 0)) == [(0, [0, 1])]  # one measurement: the order it always had


def test_defaults_sweep_five_with_one_warmup_round_law_and_ladder_one() -> None:
    from bsrctl.experiments.restore.spec import LadderSpec, LawSpec

    sw = SweepSpec(sizes_tokens=[256])
    assert (sw.repeats, sw.warmup_rounds) == (5, 1)
    assert SweepSpec(sizes_tokens=[256], repeats=1).warmup_rounds == 0
    assert SweepSpec(sizes_tokens=[256], repeats=3, warmup=0).warmup_rounds == 0
    law = LawSpec(tokens=1024)
    assert (law.repeats, law.warmup_rounds) == (1, 0)
    lad = LadderSpec(sizes_tokens=[256], rungs_bytes=[1 << 20])
    assert (lad.repeats, lad.warmup_rounds) == (1, 0)


def _m(restore_s: float, peak: int = 2 * C, **kw: Any) -> RestoreMeasures:
    return RestoreMeasures(
        tokens=1024, window_chunks=2, l1_capacity_bytes=8 << 20, restore_pool_peak_bytes=peak,
        rws_bound_bytes=2 * C, cached_tokens=1024, expected_cached_tokens=1024,
        bytes_restored=4 * C, restore_s=restore_s, probe_s=0.001, healthy=True, **kw,
    )  # fmt: skip


def test_one_repeat_is_the_point_it_always_was() -> None:
    p = repeated_point("n1024-w2", {"tokens": 1024}, [_m(0.5)], "storage").to_json()
    assert "samples" not in p and "intervals" not in p and "repeats" not in p
    assert p["measures"]["restore_s"] == 0.5
    assert "repeats_identical" not in [c["name"] for c in p["checks"]]


def test_repeats_keep_medians_samples_and_intervals() -> None:
    ms = [_m(0.5), _m(0.2), _m(0.4)]
    p = repeated_point("n1024-w2", {"tokens": 1024}, ms, "storage").to_json()
    assert p["repeats"] == 3
    assert p["samples"] == {"restore_s": [0.5, 0.2, 0.4], "probe_s": [0.001] * 3}
    assert p["measures"]["restore_s"] == 0.4 and p["measures"]["probe_s"] == 0.001
    iv = stats.median_ci([0.5, 0.2, 0.4], 0)
    assert p["intervals"] == {"restore_s": [iv.lo, iv.hi], "probe_s": [0.001, 0.001]}
    assert p["checks"][-1]["name"] == "repeats_identical"
    assert p["checks"][-1]["verdict"] == "PASS"


def test_a_peak_that_moves_between_repeats_fails_naming_it() -> None:
    c = identical_check([_m(0.5), _m(0.5, peak=3 * C), _m(0.5)])
    assert c.verdict == Verdict.FAIL
    assert c.detail == (
        f"differ between the 3 repeats: restore_pool_peak_bytes per repeat "
        f"[{2 * C}, {3 * C}, {2 * C}]"
    )


def test_a_check_failing_in_one_repeat_fails_the_point_naming_the_repeat() -> None:
    got = {c.name: c for c in merged_checks([_m(0.1), _m(0.1, peak=9 * C)], "storage")}
    assert got["bounded_restore"].verdict == Verdict.FAIL
    assert got["bounded_restore"].detail.startswith(f"repeat 1: peak {9 * C} B > ")


def _pt(n: int, w: int, key: str, xs: list[float]) -> dict[str, Any]:
    return {"params": {"tokens": n, "window_chunks": w}, "measures": {key: xs[0]},
            "samples": {key: xs}}  # fmt: skip


@pytest.mark.parametrize(
    ("bsr", "bound", "verdict"),
    [
        ([1.0, 1.01, 0.99, 1.02, 1.0], 1.10, "PASS"),  # every pair at ~1.0 <= 1.10
        ([1.5, 1.52, 1.49, 1.51, 1.5], 1.10, "FAIL"),  # every pair at ~1.5 > 1.10
        ([0.9, 1.3, 1.0, 1.25, 1.05], 1.10, "UNKNOWN"),  # pairs on both sides of 1.10
    ],
)
def test_whole_plan_ratio_is_judged_on_paired_repeats(bsr, bound, verdict) -> None:
    whole = [_pt(4096, 0, "ttft_s", [1.0] * 5)]
    rows, checks = whole_plan_ratios([_pt(4096, 4, "ttft_s", bsr)], whole, "serving", bound)
    (check,) = checks
    assert (check.name, str(check.verdict)) == ("whole_plan_ratio_n4096", verdict)
    row = rows[4096]
    iv = stats.paired_ratio_ci(bsr, [1.0] * 5, 0)
    assert (row["ratio"], row["interval"], row["repeats"]) == (iv.estimate, [iv.lo, iv.hi], 5)
    assert f"[{iv.lo:.4g}, {iv.hi:.4g}] over 5 paired repeats" in check.detail
    if verdict == "UNKNOWN":
        assert row["repeats_to_decide"] > 5 and "repeats would decide it" in check.detail
    rows, checks = whole_plan_ratios([_pt(4096, 4, "ttft_s", bsr)], whole, "serving", None)
    assert checks == [] and rows[4096]["judged"] is False  # reported, not judged


# ---- on the storage stack ------------------------------------------------------------------

lmcache = pytest.importorskip("lmcache")

from bsrctl.evidence import load_evidence  # noqa: E402
from bsrctl.experiments.restore.sweep import run_sweep  # noqa: E402
from bsrctl.stack import storage_target  # noqa: E402


def _spec(small_spec, repeats: str) -> Path:
    p = small_spec()
    text = p.read_text()
    assert "  repeats: 1  #" in text
    p.write_text(text.replace("  repeats: 1  #", f"  {repeats}  #"))
    return p


def _doc(out: Path) -> dict[str, Any]:
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return load_evidence(run / "evidence.json")


def _record_calls(monkeypatch) -> list[tuple[int, int]]:
    calls: list[tuple[int, int]] = []
    real = storage_target.StorageTarget.measure

    def measure(self, prompt, window_chunks, cold=True):  # noqa: ANN001, ANN202
        calls.append((prompt.tokens, window_chunks))
        return real(self, prompt, window_chunks, cold)

    monkeypatch.setattr(storage_target.StorageTarget, "measure", measure)
    return calls


def test_storage_sweep_with_three_repeats(small_spec, tmp_path: Path, monkeypatch) -> None:
    calls = _record_calls(monkeypatch)
    out = tmp_path / "out"
    assert run_sweep(_spec(small_spec, "repeats: 3"), out, "storage", quiet=True) == Verdict.PASS
    arms = [(n, w) for n in (1024, 2048, 4096) for w in (2, 0)]
    rotated = [arms[k:] + arms[:k] for k in range(4)]  # warm-up round, then 3 rotated ones
    assert calls == [a for order in rotated for a in order]
    doc = _doc(out)
    assert [p["id"] for p in doc["points"]] == [f"n{n}-w{w}" for n, w in arms]
    for p in doc["points"]:
        n, w = p["params"]["tokens"], p["params"]["window_chunks"]
        assert p["repeats"] == 3 and set(p["samples"]) == {"restore_s", "probe_s"}
        assert all(len(v) == 3 for v in p["samples"].values())
        assert set(p["intervals"]) == {"restore_s", "probe_s"}
        for k, xs in p["samples"].items():
            iv = stats.median_ci(xs, 0)
            assert p["measures"][k] == iv.estimate and p["intervals"][k] == [iv.lo, iv.hi]
        m = p["measures"]
        assert m["restore_pool_peak_bytes"] == (2 * C if w else (n // 256) * C)
        assert m["bytes_restored"] == (n // 256) * C and m["cached_tokens"] == n
        ident = next(c for c in p["checks"] if c["name"] == "repeats_identical")
        assert ident["verdict"] == "PASS" and "over 3 repeats" in ident["detail"]
        assert p["verdict"] == "PASS"
    ratios = doc["summary"]["whole_plan_ratio_by_tokens"]
    assert sorted(ratios) == ["1024", "2048", "4096"]  # JSON keys
    for n, r in ratios.items():
        pts = {p["id"]: p for p in doc["points"]}
        a, b = pts[f"n{n}-w2"]["samples"]["restore_s"], pts[f"n{n}-w0"]["samples"]["restore_s"]
        iv = stats.paired_ratio_ci(a, b, 0)
        assert (r["metric"], r["repeats"], r["ratio"]) == ("restore_s", 3, iv.estimate)
        assert r["judged"] is False
    names = [c["name"] for c in doc["summary"]["checks"]]
    assert names == ["peak_independent_of_n", "whole_plan_grows_with_n"]  # no bound: unjudged
    md = (out / doc["run_id"] / "summary.md").read_text()
    assert "Restore time, median [95 % CI] over 3 repeats: N = 1024 W = 2 " in md
    assert "restore_s W / whole plan at N = 1024: " in md
    assert "| repeats |" in md.splitlines()[md.splitlines().index("## Points") + 2]


def test_a_repeat_whose_peak_differs_fails_the_point(
    small_spec, tmp_path: Path, monkeypatch
) -> None:
    real = storage_target.StorageTarget.measure
    seen: list[int] = []

    def measure(self, prompt, window_chunks, cold=True):  # noqa: ANN001, ANN202
        m = real(self, prompt, window_chunks, cold)
        if (prompt.tokens, window_chunks) == (2048, 2):
            seen.append(1)
            if len(seen) == 2:  # the point's second measured repeat stages one chunk more
                return dataclasses.replace(m, restore_pool_peak_bytes=3 * C)
        return m

    monkeypatch.setattr(storage_target.StorageTarget, "measure", measure)
    out = tmp_path / "out"
    spec = _spec(small_spec, "repeats: 3\n  warmup: 0")
    assert run_sweep(spec, out, "storage", quiet=True) == Verdict.FAIL
    pts = {p["id"]: p for p in _doc(out)["points"]}
    bad = pts["n2048-w2"]
    ident = next(c for c in bad["checks"] if c["name"] == "repeats_identical")
    assert ident == {
        "name": "repeats_identical",
        "verdict": "FAIL",
        "detail": f"differ between the 3 repeats: restore_pool_peak_bytes per repeat "
        f"[{2 * C}, {3 * C}, {2 * C}]",
    }
    assert bad["verdict"] == "FAIL"
    bounded = next(c for c in bad["checks"] if c["name"] == "bounded_restore")
    assert bounded["verdict"] == "FAIL" and bounded["detail"].startswith("repeat 1: ")
    assert {pid for pid, p in pts.items() if p["verdict"] == "FAIL"} == {"n2048-w2"}


@pytest.mark.parametrize(("bound", "verdict"), [(1000.0, "PASS"), (1e-6, "FAIL")])
def test_whole_plan_bound_judges_the_storage_sweep(
    small_spec, tmp_path: Path, bound: float, verdict: str
) -> None:
    spec = _spec(small_spec, f"repeats: 3\n  warmup: 0\n  whole_plan_max_ratio: {bound}")
    out = tmp_path / "out"
    run_sweep(spec, out, "storage", quiet=True)
    doc = _doc(out)
    judged = {c["name"]: c["verdict"] for c in doc["summary"]["checks"]}
    assert judged == {
        "peak_independent_of_n": "PASS",
        "whole_plan_grows_with_n": "PASS",
        **{f"whole_plan_ratio_n{n}": verdict for n in (1024, 2048, 4096)},
    }
    assert doc["verdict"] == verdict
