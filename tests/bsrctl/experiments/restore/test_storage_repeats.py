"""Repeated restore points (``sweep.repeats``): an accuracy pass with the oracle, then rotated
timed rounds on the production path, samples and intervals of the timed measures only, byte
measures identical across passes (a pass whose peak moved FAILs naming it), oracle checks
from the accuracy pass only, and BSR against the whole plan judged over the paired timed
repeats. The pure parts on synthetic measures; the sweeps on the real storage stack (small
geometry, seconds)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from bsrctl import stats
from bsrctl.evidence.schema import PointDoc
from bsrctl.evidence.verdict import Verdict
from bsrctl.experiments.restore.repeats import (
    Pass,
    identical_check,
    merged_checks,
    repeated_point,
    rounds,
)
from bsrctl.experiments.restore.spec import SweepSpec
from bsrctl.experiments.restore.sweep import whole_plan_ratios
from bsrctl.stack.contracts.measures import StorageMeasures

C = 262_144


def test_rounds_accuracy_then_warmup_then_timed_each_kind_rotated_by_its_index() -> None:
    A, W, T = Pass.ACCURACY, Pass.WARMUP, Pass.TIMED
    assert list(rounds(3, 4, 2)) == [
        (A, 0, [0, 1, 2]),
        (W, 0, [0, 1, 2]),
        (W, 1, [1, 2, 0]),
        (T, 0, [0, 1, 2]),
        (T, 1, [1, 2, 0]),
        (T, 2, [2, 0, 1]),
        (T, 3, [0, 1, 2]),
    ]
    # one timed pass: its points complete in arm order
    assert list(rounds(2, 1, 0)) == [(A, 0, [0, 1]), (T, 0, [0, 1])]
    assert [k.oracle for k, _, _ in rounds(1, 2, 1)] == [True, False, False, False]


def test_defaults_sweep_six_with_one_warmup_round_law_and_ladder_one() -> None:
    from bsrctl.experiments.restore.spec import LadderSpec, LawSpec

    sw = SweepSpec(sizes_tokens=[256])
    assert (sw.repeats, sw.warmup_rounds) == (6, 1)
    assert SweepSpec(sizes_tokens=[256], repeats=1).warmup_rounds == 0
    assert SweepSpec(sizes_tokens=[256], repeats=3, warmup=0).warmup_rounds == 0
    law = LawSpec(tokens=1024)
    assert (law.repeats, law.warmup_rounds) == (1, 0)
    lad = LadderSpec(sizes_tokens=[256], rungs_bytes=[1 << 20])
    assert (lad.repeats, lad.warmup_rounds) == (1, 0)


def _m(restore_s: float, peak: int = 2 * C, **kw: Any) -> StorageMeasures:
    return StorageMeasures(
        tokens=1024, window_chunks=2, l1_capacity_bytes=8 << 20, restore_pool_peak_bytes=peak,
        rws_bound_bytes=2 * C, cached_tokens=1024, expected_cached_tokens=1024,
        bytes_restored=4 * C, restore_s=restore_s, probe_s=0.001, healthy=True, **kw,
    )  # fmt: skip


# the accuracy pass compares while installing, a timed pass after its timer
ACC = {"verify_ok": True, "verify_mismatches": 0, "bytes_checked": "install"}
TIMED = {"verify_ok": True, "verify_mismatches": 0, "bytes_checked": "after_timer"}


def test_no_timed_pass_is_the_accuracy_pass_alone() -> None:
    p = repeated_point("n1024-w2", {"tokens": 1024}, _m(0.5, **ACC), []).to_json()
    assert "samples" not in p and "intervals" not in p and "repeats" not in p
    assert p["measures"]["restore_s"] == 0.5
    assert "repeats_identical" not in [c["name"] for c in p["checks"]]


def test_samples_come_from_the_timed_passes_only() -> None:
    ms = [_m(0.5, **TIMED), _m(0.2, **TIMED), _m(0.4, **TIMED)]
    p = repeated_point("n1024-w2", {"tokens": 1024}, _m(9.0, **ACC), ms).to_json()
    assert (p["repeats"], p["sample_path"]) == (3, "production")
    assert p["samples"] == {"restore_s": [0.5, 0.2, 0.4], "probe_s": [0.001] * 3}
    assert p["accuracy_pass"] == {"restore_s": 9.0, "probe_s": 0.001}  # never sampled
    assert p["measures"]["restore_s"] == 0.4 and p["measures"]["probe_s"] == 0.001
    iv = stats.median_ci([0.5, 0.2, 0.4], 0)
    assert p["intervals"] == {"restore_s": [iv.lo, iv.hi], "probe_s": [0.001, 0.001]}
    checks = {c["name"]: c for c in p["checks"]}
    # the bytes judged on every pass: all canonical, the accuracy pass's detail stands
    assert checks["canonical_bytes"]["verdict"] == "PASS"
    assert "compared while installing" in checks["canonical_bytes"]["detail"]
    assert p["checks"][-1]["name"] == "repeats_identical"
    assert p["checks"][-1]["verdict"] == "PASS"
    one = repeated_point("p", {}, _m(9.0, **ACC), [_m(0.5, **TIMED)]).to_json()
    assert one["samples"]["restore_s"] == [0.5] and "restore_s" not in one["intervals"]


def test_a_peak_that_moves_between_passes_fails_naming_it() -> None:
    c = identical_check([_m(0.5), _m(0.5, peak=3 * C), _m(0.5)])
    assert c.verdict == Verdict.FAIL
    assert c.detail == (
        f"differ between the 3 passes: restore_pool_peak_bytes per pass [{2 * C}, {3 * C}, {2 * C}]"
    )


def test_a_check_failing_in_one_timed_pass_fails_the_point_naming_the_pass() -> None:
    got = {c.name: c for c in merged_checks(_m(0.1, **ACC), [_m(0.1, **TIMED, peak=9 * C)])}
    assert got["bounded_restore"].verdict == Verdict.FAIL
    assert got["bounded_restore"].detail.startswith(f"timed pass 1: peak {9 * C} B > ")


def test_every_pass_s_bytes_are_judged_a_timed_mismatch_names_its_pass_and_objects() -> None:
    names = ("a.data", "b.data")
    bad = {**ACC, "verify_ok": False, "verify_mismatches": 2, "mismatched_objects": names}
    got = {c.name: c for c in merged_checks(_m(0.1, **bad), [_m(0.1, **TIMED)])}
    assert got["canonical_bytes"].verdict == Verdict.FAIL  # a mismatch in the accuracy pass
    timed_bad = {**bad, "bytes_checked": "after_timer"}
    got = {c.name: c for c in merged_checks(_m(0.1, **ACC), [_m(0.1, **TIMED)] * 2 + [
        _m(0.1, **timed_bad)])}  # fmt: skip
    assert got["canonical_bytes"].verdict == Verdict.FAIL
    assert got["canonical_bytes"].detail == (
        "timed pass 3: storage stack has no model: canonical_output replaced by byte "
        f"verification; {4 * C} B installed, compared after the timer, 2 object(s) not "
        "canonical: a.data, b.data"
    )


def test_a_detail_names_eight_objects_the_point_keeps_every_one() -> None:
    from bsrctl.experiments.restore.acceptance import canonical_bytes

    objs = tuple(f"o{i}.data" for i in range(10))
    c = canonical_bytes(False, 10, 4 * C, objs, "after_timer", objs[:1])
    assert (c.verdict, c.detail) == (
        Verdict.FAIL,
        f"storage stack has no model: canonical_output replaced by byte verification; {4 * C} "
        f"B installed, compared after the timer, 10 object(s) not canonical: "
        f"{', '.join(objs[:8])} (+2 more in the point's evidence); the tier refused 1 "
        "object(s) at load as corrupted: o0.data",
    )
    bad = {**TIMED, "verify_ok": False, "verify_mismatches": 10, "mismatched_objects": objs}
    timed = [_m(0.1, **TIMED), _m(0.1, **bad)]
    p = repeated_point("p", {}, _m(0.1, **ACC), timed).to_json()
    assert p["timed_bad_objects"] == {
        "timed pass 2": {"mismatched_objects": list(objs), "tier_rejected_objects": []}
    }


def test_the_install_read_back_is_the_accuracy_pass_s_alone(monkeypatch) -> None:
    import bsrctl.experiments.restore.repeats as rp
    from bsrctl.evidence.verdict import check as mk

    acc, timed = _m(0.1, **ACC), _m(0.1, **TIMED)

    def judge(m):  # noqa: ANN001, ANN202 - a timed pass's read-back would FAIL, unjudged
        ok = m is acc
        return (mk("install_readback", ok, "acc" if ok else "timed"),)

    monkeypatch.setattr(rp, "judge", judge)
    (c,) = merged_checks(acc, [timed])
    assert (c.name, c.verdict, c.detail) == ("install_readback", Verdict.PASS, "acc")


def _pt(n: int, w: int, key: str, xs: list[float]) -> PointDoc:
    params = {"tokens": n, "window_chunks": w}
    return PointDoc(id=f"n{n}-w{w}", params=params, measures={key: xs[0]},
                    samples={key: xs}, checks=[], verdict="PASS")  # fmt: skip


@pytest.mark.parametrize(
    ("bsr", "bound", "verdict"),
    [
        ([1.0, 1.01, 0.99, 1.02, 1.0, 1.03], 1.10, "PASS"),  # every pair at ~1.0 <= 1.10
        ([1.5, 1.52, 1.49, 1.51, 1.5, 1.48], 1.10, "FAIL"),  # every pair at ~1.5 > 1.10
        ([0.9, 1.3, 1.0, 1.25, 1.05, 1.2], 1.10, "UNKNOWN"),  # pairs on both sides of 1.10
        ([1.5, 1.52, 1.49, 1.51, 1.5], 1.10, "UNKNOWN"),  # as far over, but 5 repeats
    ],
)
def test_whole_plan_ratio_is_judged_on_paired_repeats(bsr, bound, verdict) -> None:
    n = len(bsr)
    whole = [_pt(4096, 0, "ttft_s", [1.0] * n)]
    rows, checks = whole_plan_ratios([_pt(4096, 4, "ttft_s", bsr)], whole, "serving", bound)
    (check,) = checks
    assert (check.name, str(check.verdict)) == ("whole_plan_ratio_n4096", verdict)
    row = rows[4096]
    iv = stats.paired_ratio_ci(bsr, [1.0] * n, 0)
    assert (row["ratio"], row["interval"], row["repeats"]) == (iv.estimate, [iv.lo, iv.hi], n)
    assert f"[{iv.lo:.4g}, {iv.hi:.4g}] over {n} paired repeats" in check.detail
    if verdict == "UNKNOWN":
        assert row["repeats_to_decide"] >= 6 and "repeats" in check.detail
    rows, checks = whole_plan_ratios([_pt(4096, 4, "ttft_s", bsr)], whole, "serving", None)
    assert checks == [] and rows[4096]["judged"] is False  # reported, not judged


# ---- on the storage stack ------------------------------------------------------------------

lmcache = pytest.importorskip("lmcache")

from bsrctl.evidence import load_evidence  # noqa: E402
from bsrctl.experiments.restore.sweep import run_sweep  # noqa: E402
from bsrctl.stack.storage import target as storage_target  # noqa: E402


def _spec(small_spec, repeats: str) -> Path:
    p = small_spec()
    text = p.read_text()
    assert "  repeats: 1  #" in text
    p.write_text(text.replace("  repeats: 1  #", f"  {repeats}  #"))
    return p


def _doc(out: Path) -> dict[str, Any]:
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return load_evidence(run / "evidence.json")


def _record_calls(monkeypatch) -> list[tuple[int, int, bool]]:
    calls: list[tuple[int, int, bool]] = []
    real = storage_target.StorageTarget.measure

    def measure(self, prompt, window_chunks, cold=True, oracle=True):  # noqa: ANN001, ANN202
        calls.append((prompt.tokens, window_chunks, oracle))
        return real(self, prompt, window_chunks, cold, oracle)

    monkeypatch.setattr(storage_target.StorageTarget, "measure", measure)
    return calls


def test_storage_sweep_with_three_repeats(small_spec, tmp_path: Path, monkeypatch) -> None:
    calls = _record_calls(monkeypatch)
    out = tmp_path / "out"
    assert run_sweep(_spec(small_spec, "repeats: 3"), out, "storage", quiet=True) == Verdict.PASS
    arms = [(n, w) for n in (1024, 2048, 4096) for w in (2, 0)]
    # the accuracy round, a warm-up round, then 3 timed rounds rotated by their index
    rotated = [arms[k:] + arms[:k] for k in (0, 0, 0, 1, 2)]
    assert calls == [(*a, k == 0) for k, order in enumerate(rotated) for a in order]
    doc = _doc(out)
    assert [p["id"] for p in doc["points"]] == [f"n{n}-w{w}" for n, w in arms]
    for p in doc["points"]:
        n, w = p["params"]["tokens"], p["params"]["window_chunks"]
        timed = {"restore_s", "probe_s", "retrieve_s"}
        assert p["repeats"] == 3 and set(p["samples"]) == timed
        assert p["sample_path"] == "production" and set(p["accuracy_pass"]) == timed
        assert all(len(v) == 3 for v in p["samples"].values())
        assert set(p["intervals"]) == timed
        # restore_s spans the lookup too: the probe and the retrieve after it
        spans = (p["samples"][k] for k in ("restore_s", "probe_s", "retrieve_s"))
        for a, b, c in zip(*spans, strict=True):
            assert a >= b and a >= c
        for k, xs in p["samples"].items():
            iv = stats.median_ci(xs, 0)
            assert p["measures"][k] == iv.estimate and p["intervals"][k] == [iv.lo, iv.hi]
        m = p["measures"]
        assert m["restore_pool_peak_bytes"] == (2 * C if w else (n // 256) * C)
        assert m["bytes_restored"] == (n // 256) * C and m["cached_tokens"] == n
        ident = next(c for c in p["checks"] if c["name"] == "repeats_identical")
        assert ident["verdict"] == "PASS" and "over 4 passes" in ident["detail"]
        verified = next(c for c in p["checks"] if c["name"] == "canonical_bytes")
        assert verified["verdict"] == "PASS"  # from the accuracy pass's byte compare
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
    lines = md.splitlines()
    head = lines[lines.index("## Points") + 2]
    assert "| restore (timed) |" in head and head.endswith("| restore (accuracy pass) | passes |")
    assert lines[lines.index("## Points") + 4].endswith(" | 1 accuracy + 3 timed |")
    assert "Times are from the timed passes on the production path" in md


def test_a_repeat_whose_peak_differs_fails_the_point(
    small_spec, tmp_path: Path, monkeypatch
) -> None:
    real = storage_target.StorageTarget.measure
    seen: list[int] = []

    def measure(self, prompt, window_chunks, cold=True, oracle=True):  # noqa: ANN001, ANN202
        m = real(self, prompt, window_chunks, cold, oracle)
        if (prompt.tokens, window_chunks) == (2048, 2):
            seen.append(1)
            if len(seen) == 3:  # the point's second timed pass stages one chunk more
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
        "detail": f"differ between the 4 passes: restore_pool_peak_bytes per pass "
        f"[{2 * C}, {2 * C}, {3 * C}, {2 * C}]",
    }
    assert bad["verdict"] == "FAIL"
    bounded = next(c for c in bad["checks"] if c["name"] == "bounded_restore")
    assert bounded["verdict"] == "FAIL" and bounded["detail"].startswith("timed pass 2: ")
    assert {pid for pid, p in pts.items() if p["verdict"] == "FAIL"} == {"n2048-w2"}


@pytest.mark.parametrize(("bound", "verdict"), [(1000.0, "PASS"), (1e-6, "FAIL")])
def test_whole_plan_bound_judges_the_storage_sweep(
    small_spec, tmp_path: Path, bound: float, verdict: str
) -> None:
    spec = _spec(small_spec, f"repeats: 6\n  warmup: 0\n  whole_plan_max_ratio: {bound}")
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
