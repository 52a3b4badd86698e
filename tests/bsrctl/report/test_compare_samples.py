"""`bsrctl compare` on distributions: with samples a move beyond the bound is flagged only
when significant (Mann-Whitney U, α = 0.05), with the interval and the noise floor printed;
single samples keep the bound alone, marked. Rates measured on seeded synthetic samples:
each arm's restore_s is 20 ms × lognormal(0, σ), 10 repeats per run, 200 run pairs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from bsrctl.cli import app
from bsrctl.report.compare import Bound, compare, render

SIGMA_QUIET = 0.1  # a quiet machine: run-to-run CV of a storage-stack timing ~10 %
SIGMA_LOADED = 0.2  # a busy one


def doc(run_id: str, samples: dict[str, list[float]], bytes_: int = 1 << 20) -> dict:
    points = []
    for pid, xs in samples.items():
        points.append({
            "id": pid, "verdict": "PASS", "params": {}, "checks": [],
            "measures": {"restore_s": float(np.median(xs)), "restore_pool_peak_bytes": bytes_},
            "samples": {"restore_s": [float(x) for x in xs]},
        })  # fmt: skip
    return {"run_id": run_id, "kind": "sweep", "spec_sha256": "a" * 64, "points": points}


def flagged(sigma: float, shift: float, bound: float, pairs: int = 200, n: int = 10) -> int:
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(pairs):
        base = 0.02 * rng.lognormal(0.0, sigma, n)
        new = 0.02 * shift * rng.lognormal(0.0, sigma, n)
        c = compare(doc("br-e1-000000000001", {"p": base}), doc("br-e1-000000000002", {"p": new}),
                    [Bound("restore_s", bound)])  # fmt: skip
        hits += c.regressed
    return hits


def test_false_alarms_over_200_aa_pairs() -> None:
    # bound 0: significance alone decides. Only a worsening is flagged, so about half of
    # α's 5 % two-sided: 4 of 200 (2 %), within the issue's 6 % (12 of 200).
    assert flagged(SIGMA_QUIET, 1.0, 0.0) == 4


def test_a_30_pct_shift_is_caught_at_10_repeats() -> None:
    assert flagged(SIGMA_QUIET, 1.3, 10.0) == 200  # 100 %
    # The same gate on σ = 0.2 catches 142 of 200 (71 %): Mann-Whitney's power at 10
    # repeats, not a defect; 20 repeats catch 194 (measured, not asserted here).
    assert flagged(SIGMA_LOADED, 1.3, 10.0) == 142


def write(tmp_path: Path, d: dict) -> Path:
    folder = tmp_path / d["run_id"]
    folder.mkdir()
    (folder / "evidence.json").write_text(json.dumps({"schema": "bsrctl.evidence/1", **d}))
    return folder


def test_a_sane_bound_gates_runs_with_samples(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)

    def run(run_id: str, factor: float) -> Path:
        pts = {p: 0.02 * factor * rng.lognormal(0, SIGMA_QUIET, 10) for p in ("n4096", "n8192")}
        return write(tmp_path, doc(run_id, pts))

    base, again, slow = (
        run("br-e1-00000000000a", 1),
        run("br-e1-00000000000b", 1),
        run("br-e1-00000000000c", 2),
    )
    gate = ["--fail-on", "restore_s:20", "--fail-on", "restore_pool_peak_bytes:0"]
    res = CliRunner().invoke(app, ["compare", str(base), str(again), *gate])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[-1] == "no regression beyond a bound"
    floor = [s for s in lines if s.startswith("- restore_s: ±")]
    assert len(floor) == 1 and "largest shift" in floor[0] and "new/base" in floor[0]
    res = CliRunner().invoke(app, ["compare", str(base), str(slow), *gate])
    assert res.exit_code == 1, res.output
    regs = [s for s in res.output.splitlines() if s.startswith("REGRESSION")]
    assert [s.split()[3] for s in regs] == ["n4096:", "n8192:"]
    for line in regs:  # names the metric, the shift and its significance, and the floor
        assert re.fullmatch(
            r"REGRESSION restore_s at n\d+: [\d.]+ ms → [\d.]+ ms \(\+[\d.]+%\), worse by "
            r"\+[\d.]+% > bound 20%; significant: Mann-Whitney p=\S+ \(α=0.05\), new/base "
            r"[\d.]+ \[[\d.]+, [\d.]+\], noise floor ±[\d.]+%",
            line,
        ), line


def test_beyond_the_bound_but_not_significant_is_not_flagged() -> None:
    base = doc("br-e1-000000000001", {"p": [0.010, 0.030, 0.012, 0.028]})
    new = doc("br-e1-000000000002", {"p": [0.026, 0.028, 0.011, 0.032]})
    c = compare(base, new, [Bound("restore_s", 5)])
    assert c.regressions == () and len(c.within_noise) == 1
    text = render(c)
    assert "within noise restore_s at p: worse by +35.0% > bound 5% but not significant" in text
    assert text.splitlines()[-1] == "no regression beyond a bound"


def test_single_samples_say_they_cannot_test() -> None:
    one = {"p": [0.010]}
    c = compare(doc("br-e1-000000000001", one), doc("br-e1-000000000002", {"p": [0.020]}),
                [Bound("restore_s", 20)])  # fmt: skip
    ((d, _),) = c.regressions  # the bound alone decides, as before samples
    assert not d.testable
    assert "Single samples: cannot test significance for restore_pool_peak_bytes, restore_s " \
        "at 1 point(s): their bound alone decides" in render(c)  # fmt: skip
