"""Storage-stack cells (in-process, two TP ranks, seconds): the one-rank fault and a window
timeout PASS on the real core, and FAIL against each deliberately broken restore."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from bsrctl.evidence import load_evidence
from bsrctl.evidence.verdict import Verdict
from bsrctl.experiments.failmatrix import load_matrix, run_matrix, run_storage_cell
from bsrctl.experiments.failmatrix import storage as storage_cells
from bsrctl.registration import declared
from bsrctl.registration.tiny import tiny_llama_cpu
from bsrctl.report.failmatrix import render

from .storage_mutants import close_leaked, mutant_stack

os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")
MATRICES = Path(__file__).parents[3] / "matrices"

EXTRA = """\
  - id: storage-window-timeout
    fault: storage_window_timeout
    at: during_window
    window: 2
    expect: recompute
    bound_s: 60
"""


# Not tiny-llama: one group, one 64 x uint8 tensor per token (16 KiB per 256-token chunk)
SMALL = """\
  registration:
    model: fm-small
    chunk_tokens: 256
    tp_size: 2
    groups: [{index: 0, name: kv}]
    tensors: [{name: kv, shape: [T, 64], dtype: uint8, group: 0}]
"""


def load(tmp_path: Path, chunk_size: int = 256, registration: str = ""):
    p = tmp_path / "m.yaml"
    text = (MATRICES / "cpu.yaml").read_text().replace("window_timeout_s: 5", "window_timeout_s: 1")
    text = text.replace("  lmcache:\n", f"  lmcache:\n    chunk_size: {chunk_size}\n")
    text = re.sub(r"^storage: .*\n", "storage:\n" + registration, text, flags=re.M)
    p.write_text(text + EXTRA)
    return load_matrix(p)[0]


@pytest.fixture
def spec(tmp_path: Path):
    return load(tmp_path)


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
    (accounted,) = [c for c in point.checks if c.name == "processes_accounted"]
    assert accounted.detail == (
        "in-process stack torn down; left running: threads [], child processes []; "
        "L1 segments left in /dev/shm []"
    )


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
    point = run_storage_cell(spec, cell(spec, cid), tmp_path, mutant_stack(mutation))
    assert point.verdict == Verdict.FAIL
    bad = {c.name for c in point.checks if c.verdict == Verdict.FAIL}
    assert check in bad, point.checks


def test_one_rank_failure_names_the_rank(spec, tmp_path: Path) -> None:
    point = run_storage_cell(spec, cell(spec, "one-rank-restore-fault"), tmp_path)
    failed = point.measures["failed_restore"]
    assert failed["failure"].startswith("MISSING_KEY")
    assert "rank 1" in failed["failure"] and "rank 0" not in failed["failure"]
    assert failed["blocks_valid"] == 0 and failed["windows_done"] == 1
    assert failed["blocks_total"] == 2 * 16  # 2 ranks x 4096 / 256 chunks


def test_storage_cells_use_the_stacks_chunk_size(tmp_path: Path) -> None:
    """128-token chunks: twice the chunks and windows of the same prefix, and a window that
    only exists at that size is where the fault strikes."""
    spec = load(tmp_path, chunk_size=128)
    assert spec.storage_windows() == 2 * load(tmp_path).storage_windows() == 16
    rank = cell(spec, "one-rank-restore-fault").model_copy(update={"window": 9})
    point = run_storage_cell(spec, rank, tmp_path)
    assert point.verdict == Verdict.PASS, [c for c in point.checks if c.verdict != "PASS"]
    failed = point.measures["failed_restore"]
    assert (failed["windows_done"], failed["blocks_total"]) == (9, 2 * 32)


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
    assert "| one-rank-remote-restore-fault | rank_keys_dropped |  | during_window k=1 |" in md
    assert render(doc) == md  # the report re-renders it from the evidence alone


def test_report_renders_a_failing_run_byte_for_byte(tmp_path: Path) -> None:
    """A storage stack broken on purpose: FAIL rows and "Not passing" lines, the substitute
    recorded in the summary, and summary.md still rendered from the evidence alone."""
    out = tmp_path / "out"
    verdict = run_matrix(
        MATRICES / "paper.yaml", out, "storage", lambda _: None,
        storage_stack=mutant_stack("skip_force_local"),
    )  # fmt: skip
    assert verdict == Verdict.FAIL
    (run,) = out.iterdir()
    doc = load_evidence(run / "evidence.json")
    assert doc["summary"]["substitutes_test_only"]["storage_stack"].endswith("make")
    md = (run / "summary.md").read_text()
    assert "- one-rank-remote-restore-fault / force_local: FAIL: " in md
    assert render(doc) == md


def test_processes_accounted_fails_when_a_manager_is_left_open(
    spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A teardown that leaves rank 1's StorageManager open: its threads still run and its L1
    segment is still in /dev/shm, and the check says so; every other check still PASSes."""
    monkeypatch.setattr(storage_cells, "LEFTOVER_WAIT_S", 0.5)  # they never end: wait less
    try:
        point = run_storage_cell(
            spec, cell(spec, "one-rank-restore-fault"), tmp_path, mutant_stack("leak_manager")
        )
    finally:
        assert close_leaked() == 1
    assert point.verdict == Verdict.FAIL
    bad = [c for c in point.checks if c.verdict != Verdict.PASS]
    assert [c.name for c in bad] == ["processes_accounted"]
    detail = bad[0].detail
    assert "child processes []" in detail and "threads []" not in detail
    assert "_loop" in detail  # LMCache's store / prefetch / eviction loop threads
    segments = detail.split("L1 segments left in /dev/shm ")[1]
    assert segments.startswith("['lmcache_l1_pool_bsrctl_storage_") and segments.endswith("_1']")


def test_storage_cells_use_the_matrix_registration(tmp_path: Path) -> None:
    """`storage.registration` reaches the cells: a declared 16 KiB-per-chunk geometry, not
    tiny-llama's, is what is seeded, restored and recorded."""
    spec = load(tmp_path, registration=SMALL)
    small = declared.parse(spec.storage.registration, "registration")
    assert small.bytes_per_chunk == 256 * 64 != tiny_llama_cpu(tp_size=2).bytes_per_chunk
    assert storage_cells.storage_registration(spec) == small
    (tmp_path / "default").mkdir()
    default = load(tmp_path / "default")
    assert storage_cells.storage_registration(default) == tiny_llama_cpu(tp_size=2)
    point = run_storage_cell(spec, cell(spec, "one-rank-restore-fault"), tmp_path)
    assert point.verdict == Verdict.PASS, [c for c in point.checks if c.verdict != "PASS"]
    failed = point.measures["failed_restore"]
    assert failed["registration_digest"] == small.digest()
    assert failed["blocks_total"] == 2 * 16  # 2 ranks x 16 chunks of one group
    out = tmp_path / "out"
    assert run_matrix(tmp_path / "m.yaml", out, "storage", lambda _: None,
                      only=["one-rank-restore-fault"]) == Verdict.PASS  # fmt: skip
    (run,) = out.iterdir()
    assert load_evidence(run / "evidence.json")["stack"]["registration"] == small.to_dict()
