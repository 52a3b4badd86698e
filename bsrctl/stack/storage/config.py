"""What deploys a storage stack, and what seed and restore return."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bsrctl.errors import BadInput
from bsrkv.registration import Registration
from bsrkv.settings import RestoreSettings

DESTINATIONS = ("verify", "mmap", "memory", "null")
L2_ADAPTERS = ("auto", "stock", "bsr_fs", "bsr_mooncake")


@dataclass(frozen=True)
class StorageStackConfig:
    """How to deploy the storage stack."""

    root_dir: Path  # L2 files in root_dir/l2, mmap destination in root_dir/dest
    registration: Registration  # geometry of the state stored and restored
    l1_capacity_bytes: int  # L1 size of each rank's StorageManager
    # W-independent restore settings: timeouts, FS load concurrency (bsr_fs if > 1), O_DIRECT
    restore: RestoreSettings = RestoreSettings()
    l2_adapter: str = "auto"  # "stock" FS adapter, "bsr_fs", or auto (bsr_fs iff concurrency > 1)
    # "bsr_mooncake": the tier is a Mooncake store at this master ("host:port"); the process
    # must run in the store's network namespace. Seeded through the adapter's store client.
    mooncake_master: str = ""
    destination: str = "verify"  # "verify" | "mmap" | "null"
    model_name: str = ""  # ObjectKey.model_name; "" = registration.model

    def __post_init__(self) -> None:
        if self.destination not in DESTINATIONS:
            raise BadInput(f"destination {self.destination!r}: one of {DESTINATIONS}")
        if self.l2_adapter not in L2_ADAPTERS:
            raise BadInput(f"l2_adapter {self.l2_adapter!r}: one of {L2_ADAPTERS}")
        if (self.l2_adapter == "bsr_mooncake") != bool(self.mooncake_master):
            raise BadInput(
                "mooncake_master: set it (host:port) exactly when l2_adapter is 'bsr_mooncake'"
            )
        if self.l1_capacity_bytes < 4096:
            raise BadInput(f"l1_capacity_bytes={self.l1_capacity_bytes}: at least 4096")


@dataclass(frozen=True)
class SeededPrefix:
    """The prefix the stack holds now: what forget() and drop_page_cache() act on."""

    salt: str
    tokens: int
    hashes: tuple[bytes, ...]


@dataclass(frozen=True)
class SeedResult:
    """What seed() wrote."""

    tokens: int  # prefix tokens seeded (chunk-aligned)
    chunks: int  # chunks in the prefix
    objects_written: int  # files written now (existing ones are reused)
    bytes_written: int  # bytes written now
    seed_s: float  # wall time


@dataclass(frozen=True)
class StorageRestoreResult:
    """One restore on the storage stack: the measures of an evidence point."""

    tokens: int  # prefix tokens requested (the seeded prefix)
    window_chunks: int  # W (0 = whole plan)
    budget_chunks: int  # B (0 on the whole-plan path)
    l1_capacity_bytes: int  # L1 per rank
    cached_tokens: int  # tokens exposed as computed
    expected_cached_tokens: int  # chunk-aligned prefix that should be exposed
    restore_pool_peak_bytes: int  # measured L1 high-water minus start usage, max over ranks
    restore_pool_peak_bytes_by_rank: dict[int, int]  # the same per rank
    l1_peak_bytes_by_rank: dict[int, int]  # absolute L1 high-water per rank during restore
    gauge_peak_bytes_by_rank: dict[int, int]  # the core's staging accounting, per rank
    rws_bound_bytes: int  # W * c_allocated + aux (0 for W = 0)
    bytes_restored: int  # bytes installed into the destination
    restore_s: float  # from the lookup (probe) of the prefix to the last byte installed
    probe_s: float  # wall time of the probe-only lookup
    retrieve_s: float  # the restore after the probe (restore_s - probe_s)
    verify_ok: bool | None  # every installed byte canonical, restore ok (None: not compared)
    verify_mismatches: int  # objects whose bytes were not canonical
    blocks_valid: int  # destination blocks valid after the restore
    blocks_total: int  # destination blocks of the request (rows x chunks)
    l1_usage_before_bytes: dict[int, int]  # per rank, at restore start
    l1_usage_after_bytes: dict[int, int]  # per rank, after the restore
    failure: str  # "" when committed, else FailureKind name and detail
    forced_local: bool  # a force-local marker made the probe report 0 external tokens
    windows_done: int  # windows installed and released
    registration_digest: str  # sha256 of the registration restored
    l1_allocation_unit_bytes: int = 1  # what LMCache's L1 rounds each object up to (runtime)
    # the L2 files of the objects not canonical, chunk by chunk (rank, group within)
    mismatched_objects: tuple[str, ...] = ()
    # when the installed bytes were compared: "install" (the "verify" destination, inside
    # restore_s), "after_timer" (a pool compared after restore_s ended), "none" ("null")
    bytes_checked: str = "none"
    bytes_check_s: float | None = None  # the after-timer compare's seconds, never sampled
    tier_integrity: str = "none"  # what the L2 tier verifies at load: an algorithm or none
    tier_rejected_objects: tuple[str, ...] = ()  # L2 files the tier refused at load as bad

    @property
    def ok(self) -> bool:
        return not self.failure

    def measures(self) -> dict[str, Any]:
        """The evidence measures of this restore (StorageMeasures field names)."""
        doc = asdict(self)
        for k, v in doc.items():
            if isinstance(v, dict):
                doc[k] = {str(r): n for r, n in v.items()}
        return doc
