"""Failure-matrix cells on the in-process storage stack (real L1 + FS L2 per TP rank).

The CPU engine cannot serve TP = 2 with the connector cheaply, so the one-rank cell runs
here: two ranks, one StorageManager each; the chosen rank's object of window k is deleted
from its L2 and L1 after the probe (a real missing key), the restore runs, then the same
request is admitted again (force-local must report 0 external tokens and clear), then a
follow-up restore of a reseeded prefix must commit in full with canonical bytes. Chunks are
``stack.lmcache.chunk_size`` tokens, as on the serving stack; the geometry is the matrix's
``storage.registration``. The stack is deployed as every storage stack is, by
``StorageTarget``; once it is torn down, nothing it started may be left (threads, child
processes, its L1 segments in /dev/shm).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import resource_tracker
from pathlib import Path

import psutil

from bsrctl.evidence import Point
from bsrctl.evidence.verdict import Check, check
from bsrctl.experiments.failmatrix.spec import FIELD_REPORTS, STORE_FAULTS, CellSpec, FailMatrixSpec
from bsrctl.experiments.failmatrix.storage_spec import storage_registration, target_spec
from bsrctl.experiments.failmatrix.store_faults import run_store_cell
from bsrctl.specs import TargetSpec
from bsrctl.stack.storage import (
    FaultSpec,
    StorageRestoreResult,
    StorageStackFactory,
    restore_with_fault,
)
from bsrctl.stack.storage.target import StorageTarget
from bsrctl.trace.collect import COLLECTOR
from bsrkv.settings import RestoreSettings

SHM = Path("/dev/shm")
LEFTOVER_WAIT_S = 5.0  # how long a thread or child of a closed stack may take to end

__all__ = ["StorageStackFactory", "run_storage_cell", "storage_checks", "storage_registration"]


@dataclass(frozen=True)
class Census:
    """The threads and child processes of this process at one moment."""

    threads: frozenset[threading.Thread]
    children: frozenset[int]

    @classmethod
    def now(cls) -> Census:
        kids = frozenset(p.pid for p in psutil.Process().children(recursive=True))
        return cls(frozenset(threading.enumerate()), kids)


@dataclass(frozen=True)
class Leftovers:
    """What a torn-down stack left running or mapped."""

    threads: tuple[str, ...]  # names of threads started since the census, still alive
    children: tuple[int, ...]  # PIDs of child processes started since, still alive
    segments: tuple[str, ...]  # the stack's L1 segments still in /dev/shm

    @property
    def none(self) -> bool:
        return not (self.threads or self.children or self.segments)


def leftovers(before: Census, segments: Sequence[str], wait_s: float | None = None) -> Leftovers:
    """Threads and children started since ``before`` that do not end within ``wait_s``
    (default LEFTOVER_WAIT_S; the interpreter's shared-memory resource tracker, started once
    per process, excepted), and those of ``segments`` that /dev/shm still holds."""
    deadline = time.monotonic() + (LEFTOVER_WAIT_S if wait_s is None else wait_s)
    threads = [t for t in threading.enumerate() if t not in before.threads]
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)  # noqa: SLF001
    now = psutil.Process().children(recursive=True)
    kids = [p for p in now if p.pid not in before.children and p.pid != tracker]
    _gone, alive = psutil.wait_procs(kids, timeout=max(0.0, deadline - time.monotonic()))
    return Leftovers(
        threads=tuple(sorted(t.name for t in threads if t.is_alive())),
        children=tuple(sorted(p.pid for p in alive)),
        segments=tuple(s for s in segments if (SHM / s).exists()),
    )


@dataclass(frozen=True)
class CellRun:
    """What one storage cell measured."""

    failed: StorageRestoreResult  # the restore the fault struck
    again: StorageRestoreResult  # the same request admitted again
    follow: StorageRestoreResult  # a follow-up restore of the reseeded prefix
    healthy: bool  # every StorageManager healthy after the follow-up
    markers_left: int  # force-local markers still set after the next admission
    fallback_s: float  # wall time of the failed restore
    left: Leftovers  # what the torn-down stack left behind


def run_storage_cell(
    spec: FailMatrixSpec,
    cell: CellSpec,
    run_dir: Path,
    make_stack: StorageStackFactory | None = None,
) -> Point:
    """`make_stack` builds the stack from its config (the tests pass one whose restore or
    teardown is broken on purpose, to see the cell FAIL)."""
    if cell.fault in STORE_FAULTS:  # the tier on a size-capped tmpfs
        return run_store_cell(spec, cell, run_dir, make_stack)
    t_cell = time.monotonic()
    run = _run(spec, cell, Path(run_dir) / "storage" / cell.id, make_stack)
    s = spec.storage
    failed = run.failed
    return Point(
        id=cell.id,
        params={**cell.model_dump(), "stack": "storage", "tp_ranks": s.tp_ranks},
        measures={
            "covers": FIELD_REPORTS.get(cell.fault, ""),
            "tokens": failed.tokens,
            "window_chunks": s.window_chunks,
            "cached_tokens": failed.cached_tokens,
            "expected_cached_tokens": 0,
            "time_to_fallback_s": round(run.fallback_s, 4),
            "failed_restore": failed.measures(),
            "next_admission": {
                "forced_local": run.again.forced_local,
                "cached": run.again.cached_tokens,
            },
            "follow_up": {"cached_tokens": run.follow.cached_tokens, "failure": run.follow.failure},
        },  # fmt: skip
        checks=tuple(storage_checks(cell, run, time.monotonic() - t_cell)),
    )


def _run(
    spec: FailMatrixSpec, cell: CellSpec, root: Path, make_stack: StorageStackFactory | None
) -> CellRun:
    """Deploy, fault, admit again, reseed and follow up, tear down; then the census."""
    tspec = target_spec(spec, root)
    # the span collector is the run's, not the stack's: held across the census
    with COLLECTOR.holding(tspec.stack.trace):
        return _census_run(spec, cell, root, make_stack, tspec)


def _census_run(
    spec: FailMatrixSpec,
    cell: CellSpec,
    root: Path,
    make_stack: StorageStackFactory | None,
    tspec: TargetSpec,
) -> CellRun:
    s = spec.storage
    before = Census.now()
    target = StorageTarget(tspec, root, make_stack=make_stack)
    stack = target.deploy(s.l1_capacity_bytes, RestoreSettings.of(spec.restore, 0))
    segments = [stack.l1_segment(r) for r in range(target.reg.tp_size)]
    salt = f"{spec.workload.salt}/{cell.id}"
    rid = f"fm-{cell.id}"
    try:
        stack.seed(s.prefix_tokens, salt)
        kind = "drop_key" if cell.fault == "rank_keys_dropped" else "timeout"
        fault = FaultSpec(kind, window=cell.window, rank=cell.rank)
        t0 = time.monotonic()
        failed = restore_with_fault(stack, fault, s.window_chunks, request_id=rid)
        fallback_s = time.monotonic() - t0
        again = stack.restore(s.window_chunks, request_id=rid)  # the next admission
        markers_left = len(stack.markers)
        stack.seed(s.prefix_tokens, salt)  # put back what the fault deleted
        follow = stack.restore(s.window_chunks, request_id=f"{rid}-followup")
        healthy = stack.health()
    finally:
        target.teardown(remove_files=True)
    left = leftovers(before, segments)
    return CellRun(failed, again, follow, healthy, markers_left, fallback_s, left)


def storage_checks(cell: CellSpec, run: CellRun, cell_s: float) -> list[Check]:
    failed, again, follow = run.failed, run.again, run.follow
    c, full = failed.cached_tokens, failed.expected_cached_tokens
    rank_named = cell.fault != "rank_keys_dropped" or f"rank {cell.rank}" in failed.failure
    left = run.left
    return [
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
            again.forced_local and again.cached_tokens == 0 and run.markers_left == 0,
            f"next admission forced local {again.forced_local}, external {again.cached_tokens}; "
            f"markers left after admission {run.markers_left}",
        ),
        check(
            "post_request_health",
            run.healthy and follow.ok and follow.cached_tokens == follow.expected_cached_tokens,
            f"StorageManagers healthy {run.healthy}; follow-up restore "
            f"{follow.failure or 'committed'} {follow.cached_tokens}/"
            f"{follow.expected_cached_tokens} tokens",
        ),
        check(
            "bounded_time",
            cell_s <= cell.bound_s,
            f"fallback {run.fallback_s:.3f} s, cell {cell_s:.1f} s, bound {cell.bound_s:.0f} s",
        ),
        check(
            "processes_accounted",
            left.none,
            f"in-process stack torn down; left running: threads {list(left.threads)}, child "
            f"processes {list(left.children)}; L1 segments left in /dev/shm "
            f"{list(left.segments)}",
        ),
    ]
