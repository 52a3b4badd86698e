"""Storage-stack cells (in-process, two TP ranks, seconds): the one-rank fault and a window
timeout PASS on the real core, and FAIL against each deliberately broken restore."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bsrctl.evidence import load_evidence
from bsrctl.evidence.verdict import Verdict
from bsrctl.experiments.failmatrix import run_matrix
from bsrctl.experiments.failmatrix_spec import load_matrix
from bsrctl.experiments.failmatrix_storage import run_storage_cell

os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")
MATRICES = Path(__file__).parents[2] / "matrices"

EXTRA = """\
  - id: storage-window-timeout
    fault: storage_window_timeout
    at: during_window
    window: 2
    expect: recompute
    bound_s: 60
"""


@pytest.fixture
def spec(tmp_path: Path):
    p = tmp_path / "m.yaml"
    text = (MATRICES / "cpu.yaml").read_text().replace("window_timeout_s: 5", "window_timeout_s: 1")
    p.write_text(text + EXTRA)
    return load_matrix(p)[0]


def cell(spec, cid: str):
    return next(c for c in spec.cells if c.id == cid)


CELLS = ("one-rank-restore-fault", "storage-window-timeout")


@pytest.mark.parametrize("cid", CELLS)
def test_cell_passes_on_the_real_core(spec, tmp_path: Path, cid: str) -> None:
    point = run_storage_cell(spec, cell(spec, cid), tmp_path)
    assert point.verdict == Verdict.PASS, [c for c in point.checks if c.verdict != "PASS"]
    assert point.measures["cached_tokens"] == 0
    assert point.measures["next_admission"] == {"forced_local": True, "cached": 0}
    assert not (tmp_path / "storage" / cid).exists()  # files removed with the stack


@pytest.mark.parametrize("cid", CELLS)
@pytest.mark.parametrize(
    ("mutation", "check"),
    [
        ("skip_invalidation", "no_valid_block_after_failure"),
        ("partial_after_failure", "cached_prefix_all_or_nothing"),
        ("skip_force_local", "force_local"),
    ],
)
def test_cell_fails_against_a_broken_restore(
    spec, tmp_path: Path, cid: str, mutation: str, check: str
) -> None:
    point = run_storage_cell(spec, cell(spec, cid), tmp_path, [mutation])
    assert point.verdict == Verdict.FAIL
    bad = {c.name for c in point.checks if c.verdict == Verdict.FAIL}
    assert check in bad, point.checks


def test_one_rank_failure_names_the_rank(spec, tmp_path: Path) -> None:
    point = run_storage_cell(spec, cell(spec, "one-rank-restore-fault"), tmp_path)
    failed = point.measures["failed_restore"]
    assert failed["failure"].startswith("MISSING_KEY")
    assert "rank 1" in failed["failure"] and "rank 0" not in failed["failure"]
    assert failed["blocks_valid"] == 0 and failed["windows_done"] == 1


def test_storage_run_writes_evidence_and_summary(tmp_path: Path) -> None:
    out = tmp_path / "out"
    verdict = run_matrix(MATRICES / "paper.yaml", out, "storage", lambda _: None)
    assert verdict == Verdict.PASS
    (run,) = out.iterdir()
    doc = load_evidence(run / "evidence.json")
    assert doc["kind"] == "failmatrix" and doc["complete"] is True
    assert [p["id"] for p in doc["points"]] == ["one-rank-remote-restore-fault"]
    assert doc["summary"]["skipped_cells"] == ["remote-store-unavailable", "remote-and-ssd-absent"]
    assert doc["summary"]["table"]["one-rank-remote-restore-fault"]["force_local"] == "PASS"
    md = (run / "summary.md").read_text()
    assert "| one-rank-remote-restore-fault | rank_keys_dropped | during_window k=1 |" in md
