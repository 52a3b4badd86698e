"""summary.md is rendered from the finished evidence alone: `bsrctl.tempokv.report.render`
on a run's evidence.json gives back, byte for byte, the summary.md the run wrote."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from bsrctl.evidence import load_evidence
from bsrctl.tempokv.experiments import run_tempokv
from bsrctl.tempokv.report import render
from tests.bsrctl.tempokv.rows import pooled

LADDERS = Path(__file__).resolve().parents[3] / "ladders"


def _tiny_grid(tmp_path: Path) -> Path:
    doc = yaml.safe_load((LADDERS / "tempokv-fig5.yaml").read_text())
    doc["workload"]["documents_tokens"] = [4096, 8192, 2048]
    doc["experiment"]["fast_tier_gib"] = [100, 25]
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("spec", ["grid", "tempokv-fig1.yaml", "tempokv-fig2.yaml"])
def test_the_summary_renders_from_the_evidence_alone(tmp_path, spec):
    path = _tiny_grid(tmp_path) if spec == "grid" else LADDERS / spec
    run_tempokv(path, tmp_path / "out", "sim", True)
    (run_dir,) = (tmp_path / "out").iterdir()
    written = (run_dir / "summary.md").read_text()
    assert render(load_evidence(run_dir / "evidence.json")) == written
    assert written.startswith(f"# {run_dir.name} (tempokv, ")


def test_an_aborted_run_still_renders(tmp_path):
    doc = {"run_id": "br-x", "verdict": "UNKNOWN", "spec": {"name": "s"}, "summary": {}}
    doc["summary"]["aborted"] = "KeyboardInterrupt: "
    assert render(doc).startswith("# br-x (tempokv, s): UNKNOWN\n\nNo figure: the run did not")


def test_the_serving_summary_shows_each_repeat_and_the_adapter_cost() -> None:
    row = pooled(
        [1.25, 1.75], [0.2, 0.3], p95_ttft_s=1.5, mean_ttft_s=1.0, output_tok_s=200.0,
        c_mib_s_per_req=0.25, peak_locked_bytes=4096, budget_bytes=8192, canonical=16,
        requests=16, committed=9, ttr_error_abs_p50_s=0.01, ttr_error_abs_p95_s=0.2,
    )  # fmt: skip
    row = replace(row, per_repeat=replace(row.per_repeat, committed=(4, 5))).to_json()
    cost = {
        "adapter_per_step": {"n": 1000, "p50_s": 0.0002, "p95_s": 0.0011, "total_s": 0.4},
        "arrival_ack_wait": {"n": 16, "max_s": 0.0135, "total_s": 0.05},
        "loop_share": 0.0225,
    }  # fmt: skip
    doc = {
        "run_id": "br-tempokv-x", "verdict": "PASS",
        "summary": {"experiment": "serving-policies", "spec_name": "s", "repeats": 2,
                    "policies": {"tempokv": row}, "adapter_cost": cost,
                    "skipped_policies": {}, "checks": []},
    }  # fmt: skip
    md = render(doc)
    assert "| tempokv | 1.500 | 1.000 | 200.0 | 0.2500 | 4096 | 8192 | 16/16 | 9 |" in md
    assert "Pooled over 2 repeats" in md
    assert "| tempokv | 1.250 / 1.750 | 0.2000 / 0.3000 | 4 / 5 |" in md
    assert (
        "0.400 s over 1000 steps (p50 0.20 ms, p95 1.10 ms), 0.050 s waiting for 16 arrival "
        "replies (max 13.5 ms): 2.25% of the measured step time." in md
    )
