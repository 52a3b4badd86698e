"""Failure-matrix cells on the in-process storage stack (real L1 + FS L2 per TP rank).

The CPU engine cannot serve TP = 2 with the connector cheaply, so the one-rank cell runs
here: two ranks, one StorageManager each; the chosen rank's object of window k is deleted
from its L2 and L1 after the probe (a real missing key), the restore runs, then the same
request is admitted again (force-local must report 0 external tokens and clear), then a
follow-up restore of a reseeded prefix must commit in full with canonical bytes. Chunks are
``stack.lmcache.chunk_size`` tokens, as on the serving stack.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from bsrctl.evidence import Point
from bsrctl.evidence.verdict import Check, check
from bsrctl.experiments.failmatrix.spec import CellSpec, FailMatrixSpec
from bsrctl.registration import tiny_llama_cpu
from bsrctl.settings import RestoreSettings
from bsrctl.stack.storage import FaultSpec, StorageRestoreResult, StorageStack, StorageStackConfig

StorageStackFactory = Callable[[StorageStackConfig], StorageStack]


def run_storage_cell(
    spec: FailMatrixSpec,
    cell: CellSpec,
    run_dir: Path,
    make_stack: StorageStackFactory = StorageStack,
) -> Point:
    """`make_stack` builds the stack from its config (the tests pass one whose restore is
    broken on purpose, to see the cell FAIL)."""
    s = spec.storage
    t_cell = time.monotonic()
    reg = tiny_llama_cpu(chunk_tokens=spec.stack.lmcache.chunk_size, tp_size=s.tp_ranks)
    config = StorageStackConfig(
        root_dir=Path(run_dir) / "storage" / cell.id,
        registration=reg,
        l1_capacity_bytes=s.l1_capacity_bytes,
        restore=RestoreSettings.of(spec.restore, 0),
        destination="verify",
    )
    stack = make_stack(config)
    salt = f"{spec.workload.salt}/{cell.id}"
    rid = f"fm-{cell.id}"
    try:
        stack.seed(s.prefix_tokens, salt)
        kind = "drop_key" if cell.fault == "rank_keys_dropped" else "timeout"
        fault = FaultSpec(kind, window=cell.window, rank=cell.rank)
        t0 = time.monotonic()
        failed = stack.restore(s.window_chunks, fault=fault, request_id=rid)
        fallback_s = time.monotonic() - t0
        again = stack.restore(s.window_chunks, request_id=rid)  # the next admission
        markers_left = len(stack.markers)
        stack.seed(s.prefix_tokens, salt)  # put back what the fault deleted
        follow = stack.restore(s.window_chunks, request_id=f"{rid}-followup")
        healthy = stack.health()
    finally:
        stack.teardown(remove_files=True)
    checks = storage_checks(cell, failed, again, follow, healthy, markers_left, fallback_s,
                            time.monotonic() - t_cell)  # fmt: skip
    return Point(
        id=cell.id,
        params={**cell.model_dump(), "stack": "storage", "tp_ranks": s.tp_ranks},
        measures={
            "tokens": failed.tokens,
            "window_chunks": s.window_chunks,
            "cached_tokens": failed.cached_tokens,
            "expected_cached_tokens": 0,
            "time_to_fallback_s": round(fallback_s, 4),
            "failed_restore": failed.measures(),
            "next_admission": {"forced_local": again.forced_local, "cached": again.cached_tokens},
            "follow_up": {"cached_tokens": follow.cached_tokens, "failure": follow.failure},
        },
        checks=tuple(checks),
    )


def storage_checks(
    cell: CellSpec,
    failed: StorageRestoreResult,
    again: StorageRestoreResult,
    follow: StorageRestoreResult,
    healthy: bool,
    markers_left: int,
    fallback_s: float,
    cell_s: float,
) -> list[Check]:
    c, full = failed.cached_tokens, failed.expected_cached_tokens
    rank_named = cell.fault != "rank_keys_dropped" or f"rank {cell.rank}" in failed.failure
    out = [
        check(
            "cached_prefix_all_or_nothing",
            c == 0 and bool(failed.failure),
            f"cached {c} of {full}; failure {failed.failure or 'none (the fault did not strike)'}"
            + ("" if 0 == c or c == full else ": partial prefix exposed"),
        ),
        check(
            "no_valid_block_after_failure",
            failed.blocks_valid == 0 and rank_named,
            f"{failed.blocks_valid} of {failed.blocks_total} destination blocks valid after the "
            f"failed restore ({failed.windows_done} windows had been installed); failure names "
            f"rank {cell.rank}: {rank_named}",
        ),
        check(
            "canonical_output",
            failed.verify_mismatches == 0 and follow.verify_ok is True,
            f"installed bytes not canonical: {failed.verify_mismatches}; follow-up verified "
            f"{follow.verify_ok}",
        ),
        check(
            "force_local",
            again.forced_local and again.cached_tokens == 0 and markers_left == 0,
            f"next admission forced local {again.forced_local}, external {again.cached_tokens}; "
            f"markers left after admission {markers_left}",
        ),
        check(
            "post_request_health",
            healthy and follow.ok and follow.cached_tokens == follow.expected_cached_tokens,
            f"StorageManagers healthy {healthy}; follow-up restore {follow.failure or 'committed'}"
            f" {follow.cached_tokens}/{follow.expected_cached_tokens} tokens",
        ),
        check(
            "bounded_time",
            cell_s <= cell.bound_s,
            f"fallback {fallback_s:.3f} s, cell {cell_s:.1f} s, bound {cell.bound_s:.0f} s",
        ),
        check(
            "processes_accounted",
            True,
            "in-process stack: no process started; every StorageManager closed",
        ),
    ]
    return out
