"""Store faults on the in-process storage stack: the FS L2 on a size-capped tmpfs, so a
store fails by the kernel's own ENOSPC, in the real adapter's write (no wrapper can fail a
write inside LMCache's stock adapter; the filesystem can).

- ``store_failed_midway`` (LMCache #4991: a store that failed part way is still found by
  lookups and later hits return garbage): chunks before ``chunk`` are stored through the
  StorageManager (L1 write -> store controller -> adapter), then a filler leaves exactly
  ``fail_after_bytes`` free, so the store of ``chunk``'s first object writes that many bytes
  and fails. The checks: that object is absent from the tier (no final file, no temporary
  file) and never found by the adapter's lookup; the next restore of the whole prefix
  exposes exactly the chunks stored before it, byte-exact (the rest is recomputed); with
  the filler gone, the prefix stores and restores whole.
- ``disk_full``: a prefix A is stored, the filesystem is filled, a prefix B is stored: every
  store of B fails cleanly (no file, no lookup hit) while A restores whole, byte-exact; B
  restores 0; with the filler gone B stores and restores whole.

Stores go one object at a time and are waited for, so the failing object is determined.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bsrctl.errors import StackFailed
from bsrctl.evidence import Point
from bsrctl.evidence.verdict import Check, check
from bsrctl.experiments.failmatrix.spec import FIELD_REPORTS, CellSpec, FailMatrixSpec
from bsrctl.experiments.failmatrix.storage_spec import storage_registration
from bsrctl.stack.storage import StorageStack, StorageStackConfig, StorageStackFactory, deploy
from bsrctl.stack.storage.canonical_kv import CanonicalKV
from bsrctl.stack.storage.config import SeededPrefix
from bsrkv.settings import RestoreSettings

PAGE = 4096
STORE_WAIT_S = 10.0  # one object's store through the store controller
LOOKUP_WAIT_S = 5.0
IDLE_S = 0.05  # a store controller idle this long has finished the store it was given


@dataclass(frozen=True)
class StoreProbe:
    """One object's state in the tier after its store was attempted."""

    name: str  # its file name in the tier
    final_bytes: int | None  # size of the object's file (None: no file)
    expected_bytes: int
    lookup_found: bool  # the adapter's lookup-and-lock found it


@dataclass
class StoreRun:
    """What one store cell measured (restores: cached tokens, expected, verified)."""

    adapter: str
    free_before_bytes: int  # the tmpfs's free bytes when the failing store began
    failed: list[StoreProbe]  # the objects whose store hit ENOSPC
    stored_ok: int  # objects whose store completed
    tmp_left: list[str]  # temporary files left in the tier
    restores: dict[str, dict[str, Any]] = field(default_factory=dict)
    restored: tuple[int, list[StoreProbe]] = (0, [])  # the stores once space was freed
    healthy: bool = False
    error: str = ""  # the cell could not run as specified (UNKNOWN)


def _restore_doc(stack: StorageStack, w: int, rid: str, expect_chunks: int) -> dict[str, Any]:
    stack.forget()  # L1 forgets: the restore reads the tier (a failed store's L1 copy too)
    r = stack.restore(w, request_id=rid)
    return {
        "cached_tokens": r.cached_tokens,
        "expected_tokens": expect_chunks * stack.registration.chunk_tokens,
        "verify_ok": r.verify_ok,
        "verify_mismatches": r.verify_mismatches,
        "failure": r.failure,
    }


class StoreRig:
    """A storage stack over a tmpfs of ``size`` bytes; prefixes stored through L1."""

    def __init__(self, stack: StorageStack) -> None:
        self.stack = stack
        self.reg = stack.registration

    def keys(self, salt: str, chunks: range) -> Iterator[tuple[int, int, int, bytes, Any]]:
        canon = CanonicalKV(self.reg, salt)
        hashes = canon.chunk_hashes(chunks.stop)
        for c in chunks:
            for rank in range(self.reg.tp_size):
                for g in self.reg.groups:
                    key = self.stack.key_of(hashes[c], rank, g.index)
                    yield c, rank, g.index, hashes[c], key

    def store(self, salt: str, chunks: range) -> tuple[int, list[StoreProbe]]:
        """Store the chunks' objects one at a time; (stored, the probes of those that failed)."""
        ok, failed = 0, []
        for item in self.keys(salt, chunks):
            n, f = self.store_one(salt, item)
            ok, failed = ok + n, failed + f
        return ok, failed

    def store_one(self, salt: str, item: tuple[int, int, int, bytes, Any]):
        """One object through L1 and the store controller; (1, []) stored, (0, [probe])."""
        _c, rank, g, h, key = item
        data = CanonicalKV(self.reg, salt).object_bytes(h, rank, g)
        self.stack._write_l1(rank, g, key, data)  # noqa: SLF001
        size = self.reg.group_bytes_per_chunk(g)
        self._wait_stored(rank, self.stack.path_of(key), size)
        probe = self.probe(rank, key, size)
        ok = probe.final_bytes == probe.expected_bytes and probe.lookup_found
        return (1, []) if ok else (0, [probe])

    def seeded(self, salt: str, chunks: int) -> None:
        """What the next restore requests: the salt's first ``chunks`` chunks."""
        hashes = CanonicalKV(self.reg, salt).chunk_hashes(chunks)
        self.stack.seeded = SeededPrefix(salt, chunks * self.reg.chunk_tokens, tuple(hashes))

    def _wait_stored(self, rank: int, path: Path, size: int) -> None:
        """Until the object's file is whole, or the store controller stayed idle for
        IDLE_S (it pops a key before it counts the task in flight: one idle look can
        come between the two)."""
        sm = self.stack.managers[rank]
        deadline = time.monotonic() + STORE_WAIT_S
        idle_since: float | None = None
        while time.monotonic() < deadline:
            if path.exists() and path.stat().st_size == size:
                return
            ctl = list(sm.report_status()["store_controllers"].values())
            if all(s["pending_keys_count"] == 0 and s["in_flight_task_count"] == 0 for s in ctl):
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since >= IDLE_S:
                    return
            else:
                idle_since = None
            time.sleep(0.005)
        raise StackFailed(f"rank {rank}: store not finished within {STORE_WAIT_S} s")

    def probe(self, rank: int, key: Any, expected: int) -> StoreProbe:
        path = self.stack.path_of(key)
        size = path.stat().st_size if path.exists() else None
        return StoreProbe(path.name, size, expected, self.lookup(rank, key))

    def lookup(self, rank: int, key: Any) -> bool:
        """The rank's L2 adapter's own lookup-and-lock of one key (unlocked after)."""
        (_desc, adapter), *_ = self.stack.managers[rank].l2_adapters()
        task = adapter.submit_lookup_and_lock_task([key], self.stack.layouts)
        deadline = time.monotonic() + LOOKUP_WAIT_S
        result = adapter.query_lookup_and_lock_result(task)
        while result is None and time.monotonic() < deadline:
            time.sleep(0.001)
            result = adapter.query_lookup_and_lock_result(task)
        if result is None:
            raise StackFailed(f"L2 lookup not answered within {LOOKUP_WAIT_S} s")
        found = bool(result.get_indices_list())
        if found:
            adapter.submit_unlock([key])
        return found

    def tmp_files(self) -> list[str]:
        return sorted(p.name for p in self.stack.l2_dir.iterdir() if p.suffix == ".tmp")


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: Path, leave_bytes: int) -> int:
    """Write a filler file so that ``leave_bytes`` stay free (0: until ENOSPC). Returns the
    free bytes after."""
    want = max(0, free_bytes(path.parent) - leave_bytes)
    with open(path, "wb") as f:
        try:
            while want > 0:
                n = min(want, 1 << 20)
                f.write(b"\0" * n)
                f.flush()
                want -= n
        except OSError:  # ENOSPC: full, as asked for leave_bytes = 0
            pass
    return free_bytes(path.parent)


@contextmanager
def tmpfs(path: Path, size_bytes: int) -> Iterator[Path]:
    """A private tmpfs of ``size_bytes`` mounted at ``path`` (root), unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    size = -(-size_bytes // PAGE) * PAGE
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                   check=True, capture_output=True, timeout=10)  # fmt: skip
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False, capture_output=True, timeout=10)


def run_store_cell(
    spec: FailMatrixSpec,
    cell: CellSpec,
    run_dir: Path,
    make_stack: StorageStackFactory | None = None,
) -> Point:
    """One store-fault cell; ``make_stack`` replaces the stack (the tests' broken adapters)."""
    t_cell = time.monotonic()
    reg = storage_registration(spec)
    root = Path(run_dir) / "storage" / cell.id
    chunks = -(-spec.storage.prefix_tokens // reg.chunk_tokens)
    per_chunk = sum(-(-reg.group_bytes_per_chunk(g.index) // PAGE) * PAGE for g in reg.groups)
    size = 2 * chunks * reg.tp_size * per_chunk + (1 << 20)  # two prefixes and slack
    restore = RestoreSettings.of(spec.restore, 0).model_copy(update={"load_concurrency": 1})
    config = StorageStackConfig(root_dir=root, registration=reg,
                                l1_capacity_bytes=spec.storage.l1_capacity_bytes,
                                restore=restore, l2_adapter=cell.adapter)  # fmt: skip
    mounted = False
    try:
        with tmpfs(root / "l2", size):
            mounted = True
            run = _run(spec, cell, config, chunks, make_stack or deploy)
    except (OSError, subprocess.SubprocessError) as exc:
        if mounted:
            raise
        run = StoreRun(cell.adapter, 0, [], 0, [], error=f"no tmpfs for the tier: {exc}")
    unmounted = not os.path.ismount(root / "l2")
    cell_s = time.monotonic() - t_cell
    return Point(
        id=cell.id,
        params={**cell.model_dump(), "stack": "storage", "tp_ranks": reg.tp_size},
        measures={
            "covers": FIELD_REPORTS.get(cell.fault, ""),
            "adapter": run.adapter,
            "free_before_failing_store_bytes": run.free_before_bytes,
            "failed_stores": [dataclasses.asdict(p) for p in run.failed],
            "stored_ok": run.stored_ok,
            "restores": run.restores,
            "cell_s": round(cell_s, 3),
        },
        checks=tuple(store_checks(cell, run, cell_s, unmounted)),
    )


def _run(spec: FailMatrixSpec, cell: CellSpec, config: StorageStackConfig, chunks: int,
         make: StorageStackFactory) -> StoreRun:  # fmt: skip
    stack = make(config)
    w = spec.storage.window_chunks
    salt = f"{spec.workload.salt}/{cell.id}"
    filler = stack.l2_dir / "filler.bin"
    rig = StoreRig(stack)
    try:
        if cell.fault == "store_failed_midway":
            k = min(cell.chunk, chunks)
            ok, _ = rig.store(salt, range(k))
            free = fill(filler, cell.fail_after_bytes)
            # one object: the chunk's first, which must fail after fail_after_bytes
            first = next(rig.keys(salt, range(k, k + 1)))
            n_ok, failed = rig.store_one(salt, first)
            run = StoreRun(cell.adapter, free, failed, ok + n_ok, rig.tmp_files())
            rig.seeded(salt, chunks)
            run.restores["next_request"] = _restore_doc(stack, w, "next", k)
            filler.unlink()
            run.restored = rig.store(salt, range(k, chunks))
            run.restores["after_space_freed"] = _restore_doc(stack, w, "freed", chunks)
        else:
            ok, _ = rig.store(f"{salt}/A", range(chunks))
            free = fill(filler, 0)
            n_ok, failed = rig.store(f"{salt}/B", range(chunks))
            run = StoreRun(cell.adapter, free, failed, ok + n_ok, rig.tmp_files())
            rig.seeded(f"{salt}/A", chunks)
            run.restores["earlier_prefix"] = _restore_doc(stack, w, "A", chunks)
            rig.seeded(f"{salt}/B", chunks)
            run.restores["next_request"] = _restore_doc(stack, w, "B", 0)
            filler.unlink()
            run.restored = rig.store(f"{salt}/B", range(chunks))
            run.restores["after_space_freed"] = _restore_doc(stack, w, "B-freed", chunks)
        run.healthy = stack.health()
        return run
    finally:
        stack.teardown(remove_files=False)


def store_checks(cell: CellSpec, run: StoreRun, cell_s: float, unmounted: bool) -> list[Check]:
    """The named checks of a store cell, pure over what it measured."""
    if run.error:
        return [check("fault_injected", None, run.error)]
    out: list[Check] = []
    midway = cell.fault == "store_failed_midway"
    if midway:
        placed = run.free_before_bytes == cell.fail_after_bytes and len(run.failed) == 1
        out.append(check("fault_injected", True if placed else None,
                         f"{run.free_before_bytes} bytes free when the store of chunk "
                         f"{cell.chunk} began (asked {cell.fail_after_bytes}); "
                         f"{len(run.failed)} store(s) failed"))  # fmt: skip
    else:
        placed = run.free_before_bytes < PAGE and bool(run.failed) and run.stored_ok > 0
        out.append(check("fault_injected", True if placed else None,
                         f"{run.free_before_bytes} bytes free before prefix B; "
                         f"{len(run.failed)} store(s) of B failed"))  # fmt: skip
    visible = [p for p in run.failed if p.final_bytes is not None or p.lookup_found]
    out.append(
        check(
            "failed_store_never_found",
            bool(run.failed) and not visible and not run.tmp_left,
            f"{len(run.failed)} failed store(s) ({run.adapter}); visible after failure: "
            + (
                ", ".join(
                    f"{p.name} {p.final_bytes}/{p.expected_bytes} B found {p.lookup_found}"
                    for p in visible
                )
                or "none"
            )  # fmt: skip
            + f"; temporary files left {run.tmp_left}",
        )
    )
    for name, r in run.restores.items():
        exact = r["cached_tokens"] == r["expected_tokens"]
        canonical = r["verify_mismatches"] == 0 and (r["verify_ok"] is not False)
        out.append(
            check(
                f"restore_{name}",
                exact and canonical and (r["expected_tokens"] == 0 or not r["failure"]),
                f"cached {r['cached_tokens']} (expected {r['expected_tokens']}); verified "
                f"{r['verify_ok']}, mismatches {r['verify_mismatches']}; "
                f"{r['failure'] or 'committed'}",
            )
        )
    out.append(check("post_request_health", run.healthy, f"StorageManagers healthy {run.healthy}"))
    out.append(check("bounded_time", cell_s <= cell.bound_s,
                     f"cell {cell_s:.1f} s, bound {cell.bound_s:.0f} s"))  # fmt: skip
    out.append(check("processes_accounted", unmounted, f"tier tmpfs unmounted {unmounted}"))
    return out
