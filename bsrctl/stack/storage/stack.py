"""The deployed storage stack: one StorageManager per TP rank over the L2 directory; seed,
forget (``seeding``) and restore the prefix of a salt."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.config import StorageManagerConfig
from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import _object_key_to_filename
from lmcache.v1.distributed.storage_manager import StorageManager

from bsrctl.errors import BadInput
from bsrctl.registration.l1 import allocation_unit
from bsrctl.stack.launch import extensions, shm_ledger
from bsrctl.stack.storage import l2
from bsrctl.stack.storage.canonical_kv import CanonicalKV
from bsrctl.stack.storage.config import (
    SeededPrefix,
    StorageRestoreResult,
    StorageStackConfig,
)
from bsrctl.stack.storage.destinations import PoolDestination
from bsrctl.stack.storage.ranks import L1HighWater, PerRankStorage
from bsrctl.stack.storage.seeding import PrefixSeeding
from bsrctl.trace.collect import COLLECTOR
from bsrctl.trace.spans import trace_local_restore
from bsrkv.restore import (
    BoundedRestorer,
    ForceLocalMarkers,
    RestoreConfig,
    RestoreDestination,
    RestoreOutcome,
    RestoreRequest,
    RestoreStorage,
    RowId,
    RowKeys,
)
from bsrkv.trace.spans import Stopwatch


@dataclass(frozen=True)
class RestoreJob:
    """One restore, before it runs: the request, the core's config, the storage it stages
    from, the pool it fills (measured and closed after) and the destination the core
    installs into (the pool, unless a fault wraps it)."""

    request: RestoreRequest[ObjectKey]
    config: RestoreConfig
    storage: RestoreStorage
    pool: PoolDestination
    destination: RestoreDestination


class StorageStack(PrefixSeeding):
    """A deployed storage stack. Build with ``deploy(config)``; always ``teardown()``."""

    # what a restore's seconds (and its byte check's, apart) are read from
    clock: Callable[[], float] = staticmethod(time.monotonic)

    def __init__(self, config: StorageStackConfig) -> None:
        self.config = config
        # what the L2 tier checks of each object at load (module l2); the FS tier's sidecars
        # are seeded for it (module seeding)
        self.tier_integrity = l2.tier_integrity(config)
        self.checksum = (
            extensions.fs_checksum(self.tier_integrity) if self.tier_integrity != "none" else None
        )
        self.registration = config.registration
        self.model_name = config.model_name or config.registration.model.replace("@", "_")
        self.l2_dir = Path(config.root_dir) / "l2"
        self.dest_dir = Path(config.root_dir) / "dest"
        self.l2_dir.mkdir(parents=True, exist_ok=True)
        self.layouts = extensions.layout_descs(self.registration)
        self.managers: dict[int, StorageManager] = {}
        self.high_water: dict[int, L1HighWater] = {}
        self.seeded: SeededPrefix | None = None
        self.last_outcome: RestoreOutcome | None = None  # the core's outcome of the last restore
        self.markers = ForceLocalMarkers()  # force-local markers outlive single restores
        # On record before LMCache creates the L1 pools: a SIGKILLed run leaks none of them.
        self.shm_key = f"storage-{os.getpid()}-{id(self):x}"
        shm_ledger.record(
            self.shm_key,
            [self.l1_segment(r) for r in range(self.registration.tp_size)],
            [os.getpid()],
            Path(config.root_dir),
        )
        try:
            for rank in range(self.registration.tp_size):
                self.managers[rank] = StorageManager(self._sm_config(rank))
                self.high_water[rank] = L1HighWater(self.managers[rank])
        except BaseException:
            self.teardown()
            raise

    # ---- deployment ----

    @property
    def fault_control(self) -> Path:
        """Rules written here before deploy put the FS tier behind the fault adapter (drop
        or delay loads by real means); no file, no wrapper: the stack runs as stock."""
        return Path(self.config.root_dir) / "faults-fs.json"

    @property
    def mooncake(self) -> bool:
        return self.config.l2_adapter == "bsr_mooncake"

    @property
    def mooncake_prefix(self) -> str:
        return f"bsrctl-storage-{self.model_name}"

    def _l2_config(self, rank: int) -> Any:
        name = f"storage-fs-{id(self):x}-{rank}"
        return l2.adapter_config(
            self.config, self.l2_dir, self.mooncake_prefix, self.fault_control, name
        )

    def l1_segment(self, rank: int) -> str:
        """The /dev/shm name of a rank's L1 pool (LMCache prefixes ``lmcache_l1_pool_``)."""
        return f"lmcache_l1_pool_bsrctl_storage_{os.getpid()}_{id(self):x}_{rank}"

    def _sm_config(self, rank: int) -> StorageManagerConfig:
        return l2.manager_config(
            self.config.l1_capacity_bytes, self.l1_segment(rank), self._l2_config(rank)
        )

    def versions(self) -> dict[str, str]:
        from importlib.metadata import version

        return {"lmcache": version("lmcache"), "bsrctl": version("bsrctl")}

    def describe(self) -> dict[str, Any]:
        """``stack`` block of an evidence record."""
        c = self.config
        return {
            "kind": "storage",
            "versions": self.versions(),
            "registration": self.registration.to_dict(),
            "l1_capacity_bytes": c.l1_capacity_bytes,
            "use_odirect": c.restore.use_odirect,
            "load_concurrency": c.restore.load_concurrency,
            "l2_adapter": l2.fs_adapter_kind(c),
            "tier_integrity": self.tier_integrity,
            "destination": c.destination,
            # the FS tier ran behind the fault adapter, with these rules at deploy
            **(
                {"fault_control": json.loads(self.fault_control.read_text())}
                if self.fault_control.is_file()
                else {}
            ),
        }

    # ---- keys ----

    def key_of(self, chunk_hash: bytes, rank: int, group: int) -> ObjectKey:
        tp = self.registration.tp_size
        kv_rank = ObjectKey.ComputeKVRank(tp, rank, tp, rank)
        return ObjectKey(
            chunk_hash=chunk_hash,
            model_name=self.model_name,
            kv_rank=kv_rank,
            object_group_id=group,
        )

    def request(self, request_id: str, hashes: Sequence[bytes]) -> RestoreRequest[ObjectKey]:
        """Every required (rank, group) row of a prefix with these chunk hashes."""
        reg = self.registration
        rows = tuple(
            RowKeys(
                RowId(rank, g.index),
                tuple(self.key_of(h, rank, g.index) for h in hashes),
                reg.group_bytes_per_chunk(g.index),
            )
            for rank in range(reg.tp_size)
            for g in reg.groups
        )
        return RestoreRequest(request_id, rows, reg.chunk_tokens)

    def path_of(self, key: ObjectKey) -> Path:
        return self.l2_dir / _object_key_to_filename(key)

    def l1_usage_bytes(self) -> dict[int, int]:
        return {r: sm.get_l1_usage()[0] for r, sm in self.managers.items()}

    def l1_allocation_unit(self) -> int:
        """What LMCache's L1 rounds every object up to (the same on every rank)."""
        return max(allocation_unit(sm) for sm in self.managers.values())

    def object_name(self, rank: int, group: int, chunk: int) -> str:
        """An object of the seeded prefix by the name of its L2 file."""
        assert self.seeded is not None
        return self.path_of(self.key_of(self.seeded.hashes[chunk], rank, group)).name

    def in_prefix_order(self, names: Sequence[str]) -> list[str]:
        """Object file names of the seeded prefix, chunk by chunk (rank, group within)."""
        if not names or self.seeded is None:
            return sorted(names)
        reg, n = self.registration, len(self.seeded.hashes)
        where = {
            self.object_name(r, g.index, c): (c, r, g.index)
            for c in range(n)
            for r in range(reg.tp_size)
            for g in reg.groups
        }
        return sorted(names, key=lambda x: (where.get(x, (n, 0, 0)), x))

    def tier_rejected(self) -> list[str]:
        """Every object the L2 tier refused at load as bad (bsr_fs: checksum or size
        mismatch), by file name, since deploy; [] from a tier that verifies nothing. Read
        through the fault wrapper when the tier runs behind it."""
        out: list[str] = []
        for sm in self.managers.values():
            for _desc, adapter in sm.l2_adapters():
                tier = getattr(adapter, "inner", adapter)
                out += getattr(tier, "corrupt_keys", list)()
        return out

    def health(self) -> bool:
        return all(sm.report_status().get("is_healthy", False) for sm in self.managers.values())

    # ---- restore ----

    def restore(
        self,
        window_chunks: int,
        budget_chunks: int = 0,
        *,
        pipeline: bool = True,
        request_id: str = "",
        destination: str | None = None,
    ) -> StorageRestoreResult:
        """Probe and restore the seeded prefix with W = ``window_chunks`` (0: whole plan)."""
        job = self.job(
            window_chunks,
            budget_chunks,
            pipeline=pipeline,
            request_id=request_id,
            destination=destination,
        )
        return self.run(job)

    def job(
        self,
        window_chunks: int,
        budget_chunks: int = 0,
        *,
        pipeline: bool = True,
        request_id: str = "",
        destination: str | None = None,
    ) -> RestoreJob:
        """What one restore of the seeded prefix runs on (``run`` runs it); ``faults``
        places a fault by replacing its storage or destination."""
        if self.seeded is None:
            raise BadInput("restore before seed: call seed(prefix_tokens, salt) first")
        seeded = self.seeded
        rid = request_id or f"storage-{seeded.salt}-{seeded.tokens}-w{window_chunks}"
        settings = self.config.restore.with_window(window_chunks, budget_chunks)
        request = self.request(rid, seeded.hashes)
        pool = self.destination(request, seeded.salt, destination)
        storage = self.rank_storage(window_chunks)
        return RestoreJob(request, settings.core_config(pipeline=pipeline), storage, pool, pool)

    def rank_storage(self, window_chunks: int = 1) -> PerRankStorage:
        """Every rank's StorageManager behind one RestoreStorage: windows (W > 0) staged as
        ``restore.window_staging`` says, the whole plan (W = 0) by LMCache's prefetch."""
        drain_s = max(60.0, self.config.restore.window_timeout_s)
        staging = self.config.restore.window_staging if window_chunks else "prefetch"
        return PerRankStorage(
            {
                r: extensions.restore_storage(sm, self.layouts, drain_s, staging)
                for r, sm in self.managers.items()
            }
        )

    def make_restorer(
        self, config: RestoreConfig, storage: RestoreStorage | None = None
    ) -> BoundedRestorer:
        """A BoundedRestorer over ``storage`` (default: every rank's StorageManager), sharing
        the stack's markers.

        One restorer owns one admission budget: use one restorer from several threads to
        restore several requests under a common B.
        """
        store = storage if storage is not None else self.rank_storage(config.window_chunks)
        return BoundedRestorer(store, config, markers=self.markers)

    def destination(
        self, request: RestoreRequest[ObjectKey], salt: str, mode: str | None = None
    ) -> PoolDestination:
        """A fresh destination for ``request`` whose canonical bytes come from ``salt``."""
        canon = CanonicalKV(self.registration, salt)
        hashes = canon.chunk_hashes(request.num_chunks)
        return PoolDestination(
            mode or self.config.destination, canon, request, hashes, self.dest_dir
        )

    def run(self, job: RestoreJob) -> StorageRestoreResult:
        """Probe and restore the job's request into its destination; closes its pool."""
        try:
            return self._run(self.make_restorer(job.config, job.storage), job)
        finally:
            job.pool.close()

    def _run(self, restorer: BoundedRestorer, job: RestoreJob) -> StorageRestoreResult:
        reg, cfg, request, pool = self.registration, restorer.config, job.request, job.pool
        before = self.l1_usage_bytes()
        rejected_before = len(self.tier_rejected())
        probe_ns = time.time_ns()
        t0 = self.clock()
        plan = restorer.probe(request)
        t1 = self.clock()
        for hw in self.high_water.values():
            hw.reset()
        anchor = Stopwatch()
        outcome: RestoreOutcome = restorer.restore(plan, job.destination)
        t2 = self.clock()
        end_ns = time.time_ns()
        # The installed bytes of a pool that kept them, compared after the timer stopped:
        # the check is timed apart and never enters restore_s ("verify" compared while
        # installing: the accuracy pass's oracle, inside its span).
        after_timer = pool.compares and pool.mode != "verify"
        checked = ("after_timer" if after_timer else "install") if pool.compares else "none"
        pool.compare_pool()
        t3 = self.clock()
        rejected = self.in_prefix_order(self.tier_rejected()[rejected_before:])
        self.last_outcome = outcome
        # the run's timeline (a no-op tracer when the run collects nothing)
        trace_local_restore(
            COLLECTOR.tracer(), request.request_id, probe_ns, anchor, outcome, end_ns
        )
        if plan.forced_local:
            # No external tokens were reported: the request is admitted for local prefill,
            # which clears its marker (the engine's successful RUNNING admission).
            restorer.on_admitted(request.request_id)
        peak_abs = {r: hw.peak_bytes for r, hw in self.high_water.items()}
        peak = {r: peak_abs[r] - before[r] for r in peak_abs}
        verify = (pool.mismatches == 0 and outcome.ok) if pool.compares else None
        failure = "" if outcome.ok else f"{outcome.failure.name}: {outcome.detail}"
        bad = sorted(pool.mismatched, key=lambda rc: (rc[1], rc[0].rank, rc[0].group))
        unit = self.l1_allocation_unit()
        return StorageRestoreResult(
            tokens=self.seeded.tokens if self.seeded else 0,
            window_chunks=cfg.window_chunks,
            budget_chunks=outcome.budget_chunks,
            l1_capacity_bytes=self.config.l1_capacity_bytes,
            cached_tokens=outcome.cached_tokens,
            expected_cached_tokens=request.num_chunks * reg.chunk_tokens,
            restore_pool_peak_bytes=max(peak.values(), default=0),
            restore_pool_peak_bytes_by_rank=peak,
            l1_peak_bytes_by_rank=peak_abs,
            gauge_peak_bytes_by_rank=restorer.gauge.peak_bytes(),
            rws_bound_bytes=reg.rws_bound_bytes(cfg.window_chunks, unit)
            if cfg.window_chunks
            else 0,
            l1_allocation_unit_bytes=unit,
            bytes_restored=outcome.bytes_restored,
            restore_s=t2 - t0,
            probe_s=t1 - t0,
            retrieve_s=t2 - t1,
            verify_ok=verify,
            verify_mismatches=pool.mismatches,
            mismatched_objects=tuple(self.object_name(r.rank, r.group, c) for r, c in bad),
            bytes_checked=checked,
            bytes_check_s=t3 - t2 if after_timer else None,
            tier_integrity=self.tier_integrity,
            tier_rejected_objects=tuple(rejected),
            blocks_valid=pool.blocks_valid,
            blocks_total=pool.blocks_total,
            l1_usage_before_bytes=before,
            l1_usage_after_bytes=self.l1_usage_bytes(),
            failure=failure,
            forced_local=plan.forced_local,
            windows_done=outcome.windows_done,
            registration_digest=reg.digest(),
        )

    def drop(self, key: ObjectKey, rank: int) -> None:
        """Delete one of ``rank``'s objects from L2 and from its L1 (a real missing key)."""
        self.path_of(key).unlink(missing_ok=True)
        self.managers[rank].delete_l1_keys([key], force=True)

    def reset_peaks(self) -> None:
        for hw in self.high_water.values():
            hw.reset()

    # ---- teardown ----

    def teardown(self, remove_files: bool = False) -> None:
        """Close every StorageManager (frees L1 shared memory); optionally delete root_dir."""
        for sm in self.managers.values():
            try:
                sm.close()
            except Exception:  # keep closing the others
                pass
        self.managers.clear()
        self.high_water.clear()
        shm_ledger.release(self.shm_key)
        if remove_files:
            shutil.rmtree(self.config.root_dir, ignore_errors=True)


StorageStackFactory = Callable[[StorageStackConfig], StorageStack]


def deploy(config: StorageStackConfig) -> StorageStack:
    """Start one StorageManager per TP rank over the L2 directory under ``config.root_dir``."""
    return StorageStack(config)
