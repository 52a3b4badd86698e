"""Store-fault cells: their checks over recorded values (exact), and the real cells on a
size-capped tmpfs (root) PASS for bsr_fs and LMCache's stock FS adapter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bsrctl.experiments.failmatrix import load_matrix
from bsrctl.experiments.failmatrix.store_faults import (
    StoreProbe,
    StoreRun,
    run_store_cell,
    store_checks,
)

MATRICES = Path(__file__).parents[3] / "matrices"


def _cell(cid: str):
    spec, _ = load_matrix(MATRICES / "cpu.yaml")
    return spec, next(c for c in spec.cells if c.id == cid)


def _run(final_bytes: int | None, found: bool) -> StoreRun:
    p = StoreProbe("o.data", final_bytes, 131072, found)
    r = StoreRun("stock", 65536, [p], 4, [])
    r.restores["next_request"] = {
        "cached_tokens": 512,
        "expected_tokens": 512,
        "verify_ok": True,
        "verify_mismatches": 0,
        "failure": "",
    }
    r.healthy = True
    return r


def test_checks_pass_on_a_clean_failure() -> None:
    _spec, cell = _cell("store-failed-midway")
    got = [(c.name, c.verdict) for c in store_checks(cell, _run(None, False), 2.0, True)]
    assert got == [
        ("fault_injected", "PASS"),
        ("failed_store_never_found", "PASS"),
        ("restore_next_request", "PASS"),
        ("post_request_health", "PASS"),
        ("bounded_time", "PASS"),
        ("processes_accounted", "PASS"),
    ]


def test_a_partial_object_left_visible_fails() -> None:  # LMCache #4991's shape
    _spec, cell = _cell("store-failed-midway")
    c = store_checks(cell, _run(65536, True), 2.0, True)[1]
    assert (c.name, c.verdict) == ("failed_store_never_found", "FAIL")
    assert "o.data 65536/131072 B found True" in c.detail


@pytest.mark.process  # mount(8), umount(8)
@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")
@pytest.mark.parametrize("cid", ["store-failed-midway", "store-failed-midway-stock", "disk-full"])
def test_real_cell_passes(cid: str, tmp_path: Path) -> None:
    spec, cell = _cell(cid)
    point = run_store_cell(spec, cell, tmp_path)
    earlier = ["restore_earlier_prefix"] if cid == "disk-full" else []
    assert [c.name for c in point.checks] == [
        "fault_injected", "failed_store_never_found", *earlier, "restore_next_request",
        "restore_after_space_freed", "post_request_health", "bounded_time",
        "processes_accounted",
    ]  # fmt: skip
    assert {c.name: c.verdict for c in point.checks} == {c.name: "PASS" for c in point.checks}, [
        c.detail for c in point.checks
    ]
