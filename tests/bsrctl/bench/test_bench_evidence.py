"""Benches write evidence (kind ``bench``, through the one run lifecycle): the bandwidth
bench's tier results and the TTFT bench's rounds become points with samples, and
`bsrctl verify`, `compare` and `report` work on the run. Synthetic results, no stack."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bandwidth.common import GIB, Lookup, Rounds, Sample, TierResult, table
from bandwidth.summary import tier_points
from typer.testing import CliRunner

from bsrctl import stats
from bsrctl.cli import app
from bsrctl.evidence import EvidenceWriter, Verdict, load_evidence
from bsrctl.evidence.verdict import Check
from bsrctl.experiments.bench import bench_point, run_bench

PASSES = [1.0, 1.2, 0.9, 1.1, 1.0]


def _tier(scale: float, peak: list[int] | None = None) -> TierResult:
    rounds = Rounds()
    raw = iter(PASSES)
    rounds.add("raw O_DIRECT readers=1", lambda: Sample(next(raw) * scale * 2, GIB))
    bsr = iter(zip(PASSES, peak or [4096] * 5, strict=True))
    rounds.add(
        "bsr W=8 B=16",
        lambda: (lambda s, p: Sample(s * scale, GIB, peak=p, first_s=0.01))(*next(bsr)),
    )
    rounds.run(5)
    return TierResult.of(65536, table(lambda _l: None, rounds), "raw", Lookup(0.001, 0.004), rounds)


def _run(out: Path, res: TierResult) -> Path:
    def body(w: EvidenceWriter) -> tuple[dict[str, Any], list[Check]]:
        for p in tier_points("fs", [res]):
            w.add_point(p)
        return {}, []

    args = {"tokens": [65536], "repeat": 5}
    verdict, run_dir = run_bench("restore_bandwidth", out, args, {"kind": "storage"}, body)
    assert verdict == Verdict.PASS
    return run_dir


def test_bandwidth_tier_points_keep_every_pass(tmp_path: Path) -> None:
    run = _run(tmp_path / "a", _tier(1.0))
    doc = load_evidence(run / "evidence.json")
    assert (doc["kind"], doc["complete"], doc["verdict"]) == ("bench", True, "PASS")
    assert doc["run_id"].startswith("br-bench-")
    assert doc["spec"] == {"bench": "restore_bandwidth", "tokens": [65536], "repeat": 5}
    pts = {p["id"]: p for p in doc["points"]}
    assert list(pts) == ["fs/n65536/raw O_DIRECT readers=1", "fs/n65536/bsr W=8 B=16"]
    bsr = pts["fs/n65536/bsr W=8 B=16"]
    assert bsr["samples"] == {"pass_s": PASSES, "first_window_s": [0.01] * 5}
    iv = stats.median_ci(PASSES, 0)
    assert bsr["measures"]["pass_s"] == 1.0 and bsr["intervals"]["pass_s"] == [iv.lo, iv.hi]
    assert bsr["measures"]["peak_bytes"] == 4096 and bsr["measures"]["gib_s"] == 1.0
    assert [(c["name"], c["verdict"]) for c in bsr["checks"]] == [("peak_identical", "PASS")]
    raw = pts["fs/n65536/raw O_DIRECT readers=1"]
    assert raw["samples"] == {"pass_s": [2 * x for x in PASSES]}
    assert [(c["name"], c["verdict"]) for c in raw["checks"]] == [("measured", "PASS")]
    md = (run / "summary.md").read_text()
    assert md.startswith(f"# {doc['run_id']} (bench restore_bandwidth): PASS")
    iv_raw = stats.median_ci([2 * x for x in PASSES], 0)
    row = f"| fs/n65536/raw O_DIRECT readers=1 | PASS | 5 | 2 [{iv_raw.lo:.4g}, {iv_raw.hi:.4g}] |"
    assert row in md


def test_a_staging_peak_that_moves_fails_the_mode(tmp_path: Path) -> None:
    run = _run_any(tmp_path / "a", _tier(1.0, peak=[4096, 4096, 8192, 4096, 4096]))
    doc = load_evidence(run / "evidence.json")
    bsr = next(p for p in doc["points"] if p["id"].endswith("bsr W=8 B=16"))
    assert bsr["checks"] == [{"name": "peak_identical", "verdict": "FAIL",
                              "detail": "staging peak per round [4096.0, 4096.0, 8192.0, 4096.0, "
                                        "4096.0] B"}]  # fmt: skip
    assert doc["verdict"] == "FAIL"


def _run_any(out: Path, res: TierResult) -> Path:
    def body(w: EvidenceWriter) -> tuple[dict[str, Any], list[Check]]:
        for p in tier_points("fs", [res]):
            w.add_point(p)
        return {}, []

    return run_bench("restore_bandwidth", out, {"repeat": 5}, {"kind": "storage"}, body)[1]


def test_verify_and_compare_work_on_bench_runs(tmp_path: Path) -> None:
    base = _run(tmp_path / "a", _tier(1.0))
    same = _run(tmp_path / "b", _tier(1.0))
    slow = _run(tmp_path / "c", _tier(1.5))
    cli = CliRunner()
    res = cli.invoke(app, ["verify", str(base)])
    assert res.exit_code == 0, res.output
    (base / "summary.md").write_text("edited\n")
    res = cli.invoke(app, ["verify", str(base)])
    assert res.exit_code == 1 and "summary.md" in res.output
    res = cli.invoke(app, ["compare", str(same), str(slow), "--fail-on", "pass_s:20"])
    assert res.exit_code == 1, res.output
    lines = [s for s in res.output.splitlines() if s.startswith("REGRESSION")]
    assert len(lines) == 2 and all(s.startswith("REGRESSION pass_s at fs/n65536/") for s in lines)
    assert all(
        "(+50.0%)" in s
        and "significant: Mann-Whitney p=0.012 (α=0.05), new/base 1.5 [1.25, 1.8]" in s
        for s in lines
    )
    res = cli.invoke(app, ["compare", str(same), str(_run(tmp_path / "d", _tier(1.0))),
                           "--fail-on", "pass_s:20"])  # fmt: skip
    assert res.exit_code == 0, res.output


def test_ttft_bench_points_and_ratios() -> None:
    import ttft_restore

    from bsrctl.evidence.verdict import check

    labels = [m.label for m in ttft_restore.MODES]
    assert labels == ["W=0", "W=4", "W=16", "W=4 prefetch", "W=16 prefetch", "recompute"]
    ttft = {"W=0": [1.0] * 3, "W=4": [1.2, 1.3, 1.25], "W=16": [1.1, 1.1, 1.2],
            "W=4 prefetch": [1.5] * 3, "W=16 prefetch": [1.3] * 3,
            "recompute": [3.0, 3.1, 2.9]}  # fmt: skip
    timed = {
        k: {"ttft_s": v, "restore_s": [x / 2 for x in v] if k != "recompute" else [],
            "first_window_s": [0.01, 0.02, 0.01] if k not in ("W=0", "recompute") else []}
        for k, v in ttft.items()
    }  # fmt: skip
    peaks: dict[str, list[int | None]] = {k: [] if k == "recompute" else [100] * 4 for k in ttft}
    peaks["W=16"] = [400, 400, 400, 401]  # one pass staged more: peak_identical FAILs
    ok = check("install_readback", True, "16 of 16 windows read back, 0 mismatches")
    pts = ttft_restore.points(16384, timed, peaks, {"W=4": [ok]})
    got = {p.id: p.to_json() for p in pts}
    assert list(got) == [f"ttft/{k}" for k in labels]
    assert got["ttft/W=4"]["params"]["window_staging"] == "direct"
    assert got["ttft/W=4 prefetch"]["params"]["window_staging"] == "prefetch"
    assert all(p["sample_path"] == "production" for p in got.values())
    assert set(got["ttft/W=0"]["samples"]) == {"ttft_s", "restore_s"}  # no window at W = 0
    assert got["ttft/W=4"]["samples"]["first_window_s"] == [0.01, 0.02, 0.01]
    assert [c["name"] for c in got["ttft/W=4"]["checks"]] == ["install_readback",
                                                               "peak_identical"]  # fmt: skip
    assert got["ttft/W=4"]["measures"]["restore_pool_peak_bytes"] == 100
    assert got["ttft/W=16"]["verdict"] == "FAIL"
    assert got["ttft/W=16"]["measures"]["restore_pool_peak_bytes"] is None
    assert got["ttft/recompute"]["samples"] == {"ttft_s": [3.0, 3.1, 2.9]}
    ratios = ttft_restore.ratio_table(timed)
    assert ratios["W=4/ttft_s"] == stats.paired_ratio_ci([1.2, 1.3, 1.25], [1.0] * 3, 0)
    assert ratios["W=16/restore_s"] == stats.paired_ratio_ci([0.55, 0.55, 0.6], [0.5] * 3, 0)
    assert ratios["whole-plan/recompute"] == stats.paired_ratio_ci([1.0] * 3, [3.0, 3.1, 2.9], 0)
    assert sorted(ratios) == sorted(
        [f"{k}/{w}" for k in labels[1:5] for w in ("ttft_s", "restore_s")]
        + ["whole-plan/recompute"]
    )


def test_ttft_bench_fixed_cost_is_the_intercept_of_w4_against_w16_windows() -> None:
    """A window of 1 MiB (W = 4) and of 4 MiB (W = 16): t = a + b * MiB, so a = (4 t4 - t16) / 3
    per round, per phase and for the window's own work (fetch + install + sync)."""
    import ttft_restore

    def win(fetch: float, install: float, sync: float) -> dict[str, float]:
        return {"fetch_s": fetch, "install_s": install, "sync_s": sync}

    # per round: fetch 2 ms + 1 ms/MiB, install 0.5 ms + 2 ms/MiB, sync 0.1 ms flat
    w4 = [win(0.003, 0.0025, 0.0001)] * 3
    w16 = [win(0.006, 0.0085, 0.0001)] * 3
    got = ttft_restore.fixed_costs(w4, w16)
    fixed = {k: round(v[0].estimate, 9) for k, v in got.items()}
    assert fixed == {"fetch_s": 2.0, "install_s": 0.5, "sync_s": 0.1, "window": 2.6}
    per_mib = {k: round(v[1].estimate, 9) for k, v in got.items()}
    assert per_mib == {"fetch_s": 1.0, "install_s": 2.0, "sync_s": 0.0, "window": 3.0}
    assert [round(x, 9) for x in got["window"][2]] == [2.6] * 3  # the per-round values


def test_bench_point_without_samples_is_unknown() -> None:
    p = bench_point("m", {}, {"pass_s": []})
    assert str(p.verdict) == "UNKNOWN"
