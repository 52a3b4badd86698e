"""summary.md is rendered from the finished evidence alone: `bsrctl.report.tempokv.render`
on a run's evidence.json gives back, byte for byte, the summary.md the run wrote."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bsrctl.evidence import load_evidence
from bsrctl.experiments.tempokv import run_tempokv
from bsrctl.report.tempokv import render

LADDERS = Path(__file__).resolve().parents[2] / "ladders"


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
