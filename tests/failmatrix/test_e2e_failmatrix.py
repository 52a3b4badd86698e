"""End to end on the real serving stack: ONE deployment for the whole module, loaded with the
TEST-ONLY mutant server module (with no mutation it is the real module). A cell first PASSes
unmutated (the rig is fair), then each serving cell of matrices/cpu.yaml runs against a
deliberately broken restore and must FAIL on the check that sees the break."""

from __future__ import annotations

from pathlib import Path

import pytest

from bsrctl.evidence.verdict import Verdict
from bsrctl.experiments.failmatrix import ServingRig, load_matrix
from bsrctl.stack.process import pids_alive

from .serving_mutants import MUTANT_SERVER, set_mutations

pytestmark = pytest.mark.e2e
MATRICES = Path(__file__).parents[2] / "matrices"

# cell -> (mutations, a check that must FAIL)
BREAKS = {
    "window-timeout": (["skip_invalidation"], "no_valid_block_after_failure"),
    "object-corrupted": (["skip_invalidation"], "no_valid_block_after_failure"),
    "object-truncated": (["skip_force_local"], "force_local"),
    "l1-exhausted": (["partial_lookup", "skip_invalidation"], "cached_prefix_all_or_nothing"),
    "mooncake-down-before-request": (["partial_lookup"], "cached_prefix_all_or_nothing"),
    "mooncake-killed-mid-restore": (["skip_invalidation"], "no_valid_block_after_failure"),
    "mooncake-down-fs-emptied": (
        ["ghost_hits", "skip_invalidation"],
        "no_valid_block_after_failure",
    ),
}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory):
    try:
        import mooncake  # noqa: F401
    except Exception as exc:
        pytest.skip(f"mutant module or mooncake unavailable ({exc!r})")
    spec, _ = load_matrix(MATRICES / "cpu.yaml")
    run_dir = tmp_path_factory.mktemp("failmatrix-e2e")
    r = ServingRig(spec, run_dir, lambda _: None, MUTANT_SERVER)
    try:
        r.prepare([c for c in spec.cells if c.stack == "serving"])
        yield r
    finally:
        r.close()
        pids = [p for part in r.stack.launched for p in [part.pid, *part._children] if p]
        assert pids_alive(pids) == [], f"left running: {pids_alive(pids)}"


def cell(rig: ServingRig, cid: str):
    return next(c for c in rig.spec.cells if c.id == cid)


def test_rig_is_fair_unmutated_cell_passes(rig: ServingRig) -> None:
    set_mutations(rig, [])
    point = rig.run_cell(cell(rig, "window-timeout"))
    assert point.verdict == Verdict.PASS, [c for c in point.checks if c.verdict != "PASS"]
    assert point.measures["cached_tokens"] == 0
    assert point.measures["recovered_delta"] >= 1


@pytest.mark.parametrize("cid", list(BREAKS))
def test_cell_fails_against_a_broken_restore(rig: ServingRig, cid: str) -> None:
    mutations, must_fail = BREAKS[cid]
    set_mutations(rig, [])  # setup seeds with the real restore; the break comes after it
    try:
        point = rig.run_cell(cell(rig, cid), after_seed=lambda: set_mutations(rig, mutations))
    finally:
        set_mutations(rig, [])
    failed = {c.name: c.detail for c in point.checks if c.verdict == Verdict.FAIL}
    assert point.verdict == Verdict.FAIL
    assert must_fail in failed, {c.name: (c.verdict, c.detail) for c in point.checks}
