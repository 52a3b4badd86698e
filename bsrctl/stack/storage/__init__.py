"""The "storage" stack: LMCache's StorageManager in-process (real L1 + real filesystem L2),
one per TP rank (as in the paper's deployment, one LMCache per rank), and a destination
paged-KV pool, driven by the BSR core. No model: runs BSR at paper geometry (16,408,576
bytes per chunk, 512K tokens, tens of GB on disk) on one machine.

API (what ladder / sweep / law on ``--stack storage`` call)::

    stack = deploy(StorageStackConfig(root_dir=..., registration=dsv4_flash_mtp_off(),
                                      l1_capacity_bytes=1 << 30))
    seed = stack.seed(prefix_tokens=131072, salt="s0")   # chunks -> L2 files (+L1 optional)
    stack.forget()                                      # delete the prefix from every L1
    res = stack.restore(window_chunks=32, budget_chunks=32)   # -> StorageRestoreResult
    res.measures()                                     # evidence "measures" of the point
    stack.restore(window_chunks=0)                      # stock whole-plan single-shot path
    stack.teardown()

- ``seed`` writes every (chunk, rank, group) object of the prefix as an LMCache FS-adapter
  file (same names the adapter reads) with canonical bytes, deterministic from (salt,
  chunk hash, rank, tensor); chunk hashes are prefix-chained from the salt, so a longer
  prefix with the same salt reuses the shorter one's files. ``drop_cache=True`` fsyncs and
  drops the files from the page cache (``posix_fadvise DONTNEED``) so the next reads come
  from the device. ``into_l1=True`` also writes the objects into L1.
- ``restore`` probes (probe-only: nothing staged), composes the plan and restores it with
  the BSR core into a fresh destination: ``"verify"`` (default) checks each installed window
  against regenerated canonical bytes and keeps no copy, ``"mmap"`` copies into a
  file-backed pool under ``root_dir/dest`` and ``"memory"`` into an anonymous one (the
  timed passes' production path), both compared with the canonical bytes after the
  restore's timer stopped (``bytes_check_s``, never part of ``restore_s``), ``"null"``
  only counts bytes (benchmarks). Mismatches are named by their L2 files.
  ``restore_pool_peak_bytes`` is *measured*: the high-water mark of each rank's L1 allocator
  (read right after every L1 allocation) minus that rank's L1 usage when the restore
  started, max over ranks. ``gauge_peak_bytes_by_rank`` is the core's own accounting.
- integrity: ``restore.checksum`` on the ``bsr_fs`` FS adapter verifies each object's
  ``checksum_algorithm`` sidecar at load (``seed`` writes them as the adapter does); a
  corrupted object is a miss (the restore fails closed) named in
  ``tier_rejected_objects``. The stock FS adapter and the Mooncake tier verify nothing:
  ``tier_integrity`` says ``"none"``.
- ``restore`` is ``run(job(...))``: ``job`` builds the request, the core's config, the
  per-rank storage and the destination; ``run`` probes and restores it. Faults are no part
  of it: ``restore_with_fault(stack, FaultSpec("drop_key", window=k), W, B)`` (module
  ``faults``) runs the same job with its storage or destination wrapped: ``drop_key``
  deletes one object of window k from L2 and L1 after the probe (a real missing key),
  ``"timeout"`` makes window k's wait report a timeout (the prefetch itself still runs and
  is drained), ``"install_error"`` makes the destination raise while installing window k.
- ``deploy(config)`` is the one constructor; ``StorageTarget.deploy`` (the target of
  sweep / ladder / law, the failure matrix's storage cells, bench/restore_bandwidth.py)
  builds every stack through it, from a ``TargetSpec``.

Modules: ``config`` (StorageStackConfig, SeedResult, StorageRestoreResult), ``faults``
(FaultSpec, restore_with_fault), ``canonical`` (CanonicalKV), ``destinations``
(PoolDestination), ``ranks`` (PerRankStorage, L1HighWater), ``files`` (L2 object files),
``stack`` (StorageStack, RestoreJob, deploy).
"""

from bsrctl.stack.storage.canonical_kv import CanonicalKV
from bsrctl.stack.storage.config import (
    DESTINATIONS,
    L2_ADAPTERS,
    SeedResult,
    StorageRestoreResult,
    StorageStackConfig,
)
from bsrctl.stack.storage.destinations import PoolDestination
from bsrctl.stack.storage.faults import (
    FAULT_KINDS,
    FaultSpec,
    InjectedInstallError,
    restore_with_fault,
)
from bsrctl.stack.storage.ranks import L1HighWater, PerRankStorage
from bsrctl.stack.storage.stack import RestoreJob, StorageStack, StorageStackFactory, deploy

__all__ = [
    "DESTINATIONS",
    "FAULT_KINDS",
    "L2_ADAPTERS",
    "CanonicalKV",
    "FaultSpec",
    "InjectedInstallError",
    "L1HighWater",
    "PerRankStorage",
    "PoolDestination",
    "RestoreJob",
    "SeedResult",
    "StorageRestoreResult",
    "StorageStack",
    "StorageStackConfig",
    "StorageStackFactory",
    "deploy",
    "restore_with_fault",
]
