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
  file-backed pool under ``root_dir/dest``, ``"null"`` only counts bytes (benchmarks).
  ``restore_pool_peak_bytes`` is *measured*: the high-water mark of each rank's L1 allocator
  (read right after every L1 allocation) minus that rank's L1 usage when the restore
  started, max over ranks. ``gauge_peak_bytes_by_rank`` is the core's own accounting.
- ``faults``: ``FaultSpec("drop_key", window=k)`` deletes one object of window k from L2
  and L1 after the probe (a real missing key), ``"timeout"`` makes window k's wait report a
  timeout (the prefetch itself still runs and is drained), ``"install_error"`` makes the
  destination raise while installing window k.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
from lmcache.v1.distributed.config import (
    EvictionConfig,
    L1ManagerConfig,
    L1MemoryManagerConfig,
    StorageManagerConfig,
)
from lmcache.v1.distributed.l2_adapters.config import L2AdaptersConfig
from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import (
    FSL2AdapterConfig,
    _object_key_to_filename,
)
from lmcache.v1.distributed.storage_manager import StorageManager

from bsrctl.errors import BadInput
from bsrctl.lmcache_ext.storage import LMCacheRestoreStorage, layout_descs
from bsrctl.registration import Registration
from bsrctl.restore import (
    BoundedRestorer,
    ForceLocalMarkers,
    RestoreConfig,
    RestoreOutcome,
    RestoreRequest,
    RowId,
    RowKeys,
    StageResult,
    Window,
)
from bsrctl.settings import RestoreSettings

DESTINATIONS = ("verify", "mmap", "null")
L2_ADAPTERS = ("auto", "stock", "bsr_fs")
FAULT_KINDS = ("drop_key", "timeout", "install_error")


@dataclass(frozen=True)
class StorageStackConfig:
    """How to deploy the storage stack."""

    root_dir: Path  # L2 files in root_dir/l2, mmap destination in root_dir/dest
    registration: Registration  # geometry of the state stored and restored
    l1_capacity_bytes: int  # L1 size of each rank's StorageManager
    # W-independent restore settings: timeouts, FS load concurrency (bsr_fs if > 1), O_DIRECT
    restore: RestoreSettings = RestoreSettings()
    l2_adapter: str = "auto"  # "stock" FS adapter, "bsr_fs", or auto (bsr_fs iff concurrency > 1)
    destination: str = "verify"  # "verify" | "mmap" | "null"
    model_name: str = ""  # ObjectKey.model_name; "" = registration.model

    def __post_init__(self) -> None:
        if self.destination not in DESTINATIONS:
            raise BadInput(f"destination {self.destination!r}: one of {DESTINATIONS}")
        if self.l2_adapter not in L2_ADAPTERS:
            raise BadInput(f"l2_adapter {self.l2_adapter!r}: one of {L2_ADAPTERS}")
        if self.l1_capacity_bytes < 4096:
            raise BadInput(f"l1_capacity_bytes={self.l1_capacity_bytes}: at least 4096")


@dataclass(frozen=True)
class FaultSpec:
    """One injected fault of a restore."""

    kind: str  # "drop_key" | "timeout" | "install_error"
    window: int  # window index j where it strikes
    rank: int = 0  # rank whose object is dropped (drop_key)
    group: int = 0  # group whose object is dropped (drop_key)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise BadInput(f"fault kind {self.kind!r}: one of {FAULT_KINDS}")


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
    rws_bound_bytes: int  # W * c + aux (0 for W = 0)
    bytes_restored: int  # bytes installed into the destination
    restore_s: float  # wall time of the windowed restore (after the probe)
    probe_s: float  # wall time of the probe-only lookup
    verify_ok: bool | None  # every installed byte canonical (None: destination doesn't verify)
    verify_mismatches: int  # objects whose bytes were not canonical
    blocks_valid: int  # destination blocks valid after the restore
    blocks_total: int  # destination blocks of the request (rows x chunks)
    l1_usage_before_bytes: dict[int, int]  # per rank, at restore start
    l1_usage_after_bytes: dict[int, int]  # per rank, after the restore
    failure: str  # "" when committed, else FailureKind name and detail
    forced_local: bool  # a force-local marker made the probe report 0 external tokens
    windows_done: int  # windows installed and released
    registration_digest: str  # sha256 of the registration restored

    @property
    def ok(self) -> bool:
        return not self.failure

    def measures(self) -> dict[str, Any]:
        """The evidence measures of this restore (RestoreMeasures field names)."""
        doc = asdict(self)
        for k, v in doc.items():
            if isinstance(v, dict):
                doc[k] = {str(r): n for r, n in v.items()}
        return doc


# ---- canonical bytes ------------------------------------------------------------------


class CanonicalKV:
    """Deterministic KV contents: bytes of (salt, chunk hash, rank, tensor)."""

    _M = np.uint64(0x9E3779B97F4A7C15)

    def __init__(self, reg: Registration, salt: str) -> None:
        self.reg = reg
        self.salt = salt
        self._iota: dict[int, np.ndarray] = {}

    def chunk_hashes(self, num_chunks: int) -> list[bytes]:
        """Prefix-chained 16-byte chunk hashes (like LMCache's token-prefix hashes)."""
        out, h = [], hashlib.sha256(f"bsrctl/{self.reg.model}/{self.salt}".encode()).digest()
        for i in range(num_chunks):
            h = hashlib.sha256(h + i.to_bytes(8, "little")).digest()
            out.append(h[:16])
        return out

    def _tensor(self, chunk_hash: bytes, rank: int, name: str, nbytes: int) -> np.ndarray:
        d = hashlib.sha256(
            b"%s|%s|%d|%s" % (self.salt.encode(), chunk_hash, rank, name.encode())
        ).digest()
        s0, s1 = np.frombuffer(d[:16], dtype=np.uint64)
        n8 = (nbytes + 7) // 8
        iota = self._iota.get(n8)
        if iota is None:
            iota = self._iota[n8] = np.arange(n8, dtype=np.uint64)
        with np.errstate(over="ignore"):
            x = (iota + s0) * self._M
            x ^= x >> np.uint64(29)
            x ^= s1
        return x.view(np.uint8)[:nbytes]

    def object_bytes(self, chunk_hash: bytes, rank: int, group: int) -> np.ndarray:
        """One storage object: the group's tensors of one chunk on one rank, concatenated."""
        parts = [
            self._tensor(chunk_hash, rank, t.name, t.nbytes) for t in self.reg.group_tensors(group)
        ]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


# ---- destinations ---------------------------------------------------------------------


class InjectedInstallError(RuntimeError):
    """Raised by a destination at the window a FaultSpec names."""


class PoolDestination:
    """A request's destination blocks: one per (row, chunk); valid bit per block.

    mode "verify": compare each installed object with canonical bytes, keep nothing.
    mode "mmap": copy into a file-backed pool (rows x chunks x object bytes).
    mode "null": count bytes only.
    """

    def __init__(
        self,
        mode: str,
        canon: CanonicalKV,
        request: RestoreRequest[ObjectKey],
        chunk_hashes: Sequence[bytes],
        dest_dir: Path,
        fail_window: int = -1,
    ) -> None:
        self.mode = mode
        self.canon = canon
        self.rows = {r.row: i for i, r in enumerate(request.rows)}
        self.row_bytes = {r.row: r.chunk_bytes for r in request.rows}
        self.hashes = list(chunk_hashes)
        self.fail_window = fail_window
        n = request.num_chunks
        self.valid = {r.row: bytearray(n) for r in request.rows}
        self.mismatches = 0
        self._lock = threading.Lock()
        self._pool: np.memmap | None = None
        self._offsets: dict[RowId, int] = {}
        if mode == "mmap" and n:
            dest_dir.mkdir(parents=True, exist_ok=True)
            off = 0
            for r in request.rows:
                self._offsets[r.row] = off
                off += r.chunk_bytes * n
            self._pool = np.memmap(
                dest_dir / f"{request.request_id}.pool", np.uint8, "w+", shape=(off,)
            )

    def install(
        self,
        request_id: str,
        window: Window,
        objects: Mapping[RowId, Sequence[Any]],
        num_chunks: int,
    ) -> int:
        if window.index == self.fail_window:
            raise InjectedInstallError(f"injected install error in window {window.index}")
        done = 0
        for row, objs in objects.items():
            size = self.row_bytes[row]
            for i in range(num_chunks):
                chunk = window.chunk_start + i
                buf = np.frombuffer(objs[i].byte_array, dtype=np.uint8)
                if buf.size != size:
                    raise ValueError(
                        f"{row} chunk {chunk}: object of {buf.size} bytes, expected {size}"
                    )
                if self.mode == "verify":
                    want = self.canon.object_bytes(self.hashes[chunk], row.rank, row.group)
                    if not np.array_equal(buf, want):
                        with self._lock:
                            self.mismatches += 1
                elif self.mode == "mmap" and self._pool is not None:
                    at = self._offsets[row] + chunk * size
                    self._pool[at : at + size] = buf
                self.valid[row][chunk] = 1
                done += size
        return done

    def sync(self, request_id: str) -> None:
        if self._pool is not None:
            self._pool.flush()

    def mark_invalid(self, request_id: str) -> None:
        for bits in self.valid.values():
            bits[:] = bytes(len(bits))

    @property
    def blocks_valid(self) -> int:
        return sum(sum(b) for b in self.valid.values())

    @property
    def blocks_total(self) -> int:
        return sum(len(b) for b in self.valid.values())

    def close(self) -> None:
        if self._pool is not None:
            path = Path(self._pool.filename)
            del self._pool
            self._pool = None
            path.unlink(missing_ok=True)


# ---- per-rank storage ------------------------------------------------------------------


@dataclass
class _RankTickets:
    parts: dict[int, Any]  # rank -> LMCacheTicket
    rows: tuple[RowId, ...]  # request row order
    window: Window
    result: StageResult | None = None


class PerRankStorage:
    """RestoreStorage over one StorageManager per TP rank: rows go to their rank's manager."""

    def __init__(
        self, per_rank: Mapping[int, LMCacheRestoreStorage], timeout_window: int = -1
    ) -> None:
        self.per_rank = dict(per_rank)
        self.timeout_window = timeout_window  # window whose wait reports a timeout (fault)

    def _split(self, request: RestoreRequest[ObjectKey]) -> dict[int, RestoreRequest[ObjectKey]]:
        by: dict[int, list[RowKeys[ObjectKey]]] = {}
        for r in request.rows:
            by.setdefault(r.row.rank, []).append(r)
        return {
            k: RestoreRequest(request.request_id, tuple(v), request.chunk_tokens)
            for k, v in by.items()
        }

    def probe(self, request: RestoreRequest[ObjectKey]) -> list[list[bool]]:
        hits: dict[RowId, list[bool]] = {}
        for rank, sub in self._split(request).items():
            for r, bits in zip(sub.rows, self.per_rank[rank].probe(sub), strict=True):
                hits[r.row] = list(bits)
        return [hits[r] for r in request.row_ids]

    def stage(self, request: RestoreRequest[ObjectKey], window: Window) -> _RankTickets:
        parts: dict[int, Any] = {}
        try:
            for rank, sub in self._split(request).items():
                parts[rank] = self.per_rank[rank].stage(sub, window)
        except Exception:
            for rank, t in parts.items():
                self.per_rank[rank].release(t)
            raise
        return _RankTickets(parts, request.row_ids, window)

    def wait(self, ticket: _RankTickets, timeout_s: float) -> StageResult | None:
        if ticket.window.index == self.timeout_window:
            return None
        deadline = time.monotonic() + timeout_s
        hits: dict[RowId, tuple[bool, ...]] = {}
        by_rank: dict[int, int] = {}
        for rank, t in ticket.parts.items():
            res = self.per_rank[rank].wait(t, max(0.0, deadline - time.monotonic()))
            if res is None:
                return None
            hits.update(zip(t.rows, res.hits, strict=True))
            for k, v in res.staged_bytes_by_rank.items():
                by_rank[k] = by_rank.get(k, 0) + v
        ticket.result = StageResult(tuple(hits[r] for r in ticket.rows), by_rank)
        return ticket.result

    @contextmanager
    def read(self, ticket: _RankTickets, num_chunks: int) -> Iterator[dict[RowId, Sequence[Any]]]:
        out: dict[RowId, Sequence[Any]] = {}
        for rank, t in ticket.parts.items():
            with self.per_rank[rank].read(t, num_chunks) as objs:
                out.update(objs)
        yield {r: out[r] for r in ticket.rows}

    def release(self, ticket: _RankTickets) -> None:
        errors = []
        for rank, t in ticket.parts.items():
            try:
                self.per_rank[rank].release(t)
            except Exception as e:  # release every rank, then report
                errors.append(e)
        if errors:
            raise errors[0]


# ---- L1 high-water -------------------------------------------------------------------------


class L1HighWater:
    """Exact L1 high-water mark of one StorageManager: read after every L1 allocation.

    Wraps the (private) L1 memory manager's ``allocate``; LMCache calls it under the L1
    manager's lock, so the usage read right after it is the level that allocation reached.
    """

    def __init__(self, sm: StorageManager) -> None:
        self._mm = sm._l1_manager._memory_manager  # noqa: SLF001 - measurement hook
        self._orig = self._mm.allocate
        self._lock = threading.Lock()
        self.peak_bytes = self._mm.get_memory_usage()[0]

        def allocate(layout_desc: MemoryLayoutDesc, count: int) -> Any:
            res = self._orig(layout_desc, count)
            used = self._mm.get_memory_usage()[0]
            with self._lock:
                self.peak_bytes = max(self.peak_bytes, used)
            return res

        self._mm.allocate = allocate

    def reset(self) -> int:
        with self._lock:
            self.peak_bytes = self._mm.get_memory_usage()[0]
            return self.peak_bytes


# ---- the stack -------------------------------------------------------------------------------


@dataclass
class _Seeded:
    salt: str
    tokens: int
    hashes: list[bytes] = field(default_factory=list)


class StorageStack:
    """A deployed storage stack. Build with ``deploy(config)``; always ``teardown()``."""

    def __init__(self, config: StorageStackConfig) -> None:
        self.config = config
        self.registration = config.registration
        self.model_name = config.model_name or config.registration.model.replace("@", "_")
        self.l2_dir = Path(config.root_dir) / "l2"
        self.dest_dir = Path(config.root_dir) / "dest"
        self.l2_dir.mkdir(parents=True, exist_ok=True)
        self.layouts = layout_descs(self.registration)
        self.managers: dict[int, StorageManager] = {}
        self.high_water: dict[int, L1HighWater] = {}
        self.seeded: _Seeded | None = None
        self.markers = ForceLocalMarkers()  # force-local markers outlive single restores
        try:
            for rank in range(self.registration.tp_size):
                self.managers[rank] = StorageManager(self._sm_config(rank))
                self.high_water[rank] = L1HighWater(self.managers[rank])
        except BaseException:
            self.teardown()
            raise

    # ---- deployment ----

    def _l2_config(self) -> Any:
        c = self.config.restore
        kind = self.config.l2_adapter
        if kind == "auto":
            kind = "bsr_fs" if c.load_concurrency > 1 else "stock"
        if kind == "stock":
            if c.load_concurrency != 1:
                raise BadInput(
                    "load_concurrency > 1 needs l2_adapter 'bsr_fs' "
                    "(the stock FS adapter loads serially)"
                )
            return FSL2AdapterConfig(base_path=str(self.l2_dir), use_odirect=c.use_odirect)
        try:
            from bsrctl.lmcache_ext.adapters.fs import BsrFSL2AdapterConfig
        except ImportError as e:
            raise BadInput(f"l2_adapter 'bsr_fs' unavailable ({e}); use l2_adapter 'stock'") from e
        return BsrFSL2AdapterConfig(
            base_path=str(self.l2_dir),
            use_odirect=c.use_odirect,
            load_concurrency=c.load_concurrency,
        )

    def _sm_config(self, rank: int) -> StorageManagerConfig:
        shm = f"bsrctl_storage_{os.getpid()}_{id(self):x}_{rank}"
        l1 = L1ManagerConfig(
            L1MemoryManagerConfig(
                size_in_bytes=self.config.l1_capacity_bytes, use_lazy=False, shm_name=shm
            )
        )
        return StorageManagerConfig(
            l1_manager_config=l1,
            eviction_config=EvictionConfig("LRU"),
            l2_adapter_config=L2AdaptersConfig([self._l2_config()]),
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
            "destination": c.destination,
        }

    # ---- keys ----

    def _key(self, chunk_hash: bytes, rank: int, group: int) -> ObjectKey:
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
                tuple(self._key(h, rank, g.index) for h in hashes),
                reg.group_bytes_per_chunk(g.index),
            )
            for rank in range(reg.tp_size)
            for g in reg.groups
        )
        return RestoreRequest(request_id, rows, reg.chunk_tokens)

    def path_of(self, key: ObjectKey) -> Path:
        return self.l2_dir / _object_key_to_filename(key)

    # ---- seed / forget ----

    def seed(
        self, prefix_tokens: int, salt: str, into_l1: bool = False, drop_cache: bool = False
    ) -> SeedResult:
        """Write the prefix's objects into L2 (reusing existing files), optionally into L1."""
        t0 = time.monotonic()
        reg = self.registration
        n = reg.num_chunks(prefix_tokens)
        canon = CanonicalKV(reg, salt)
        hashes = canon.chunk_hashes(n)
        written = nbytes = 0
        for h in hashes:
            for rank in range(reg.tp_size):
                for g in reg.groups:
                    key = self._key(h, rank, g.index)
                    path = self.path_of(key)
                    data = None
                    if not path.exists():
                        data = canon.object_bytes(h, rank, g.index)
                        _write_file(path, data, drop_cache)
                        written += 1
                        nbytes += data.size
                    if into_l1:
                        self._write_l1(
                            rank,
                            g.index,
                            key,
                            data if data is not None else canon.object_bytes(h, rank, g.index),
                        )
        self.seeded = _Seeded(salt, n * reg.chunk_tokens, hashes)
        return SeedResult(n * reg.chunk_tokens, n, written, nbytes, time.monotonic() - t0)

    def _write_l1(self, rank: int, group: int, key: ObjectKey, data: np.ndarray) -> None:
        sm = self.managers[rank]
        objs = sm.reserve_write([key], self.layouts[group])
        if key not in objs:
            return  # resident already, or L1 full: L2 holds it
        np.frombuffer(objs[key].byte_array, dtype=np.uint8)[:] = data
        sm.finish_write([key])

    def forget(self) -> int:
        """Delete the seeded prefix from every rank's L1 (L2 keeps it). Returns keys deleted."""
        if self.seeded is None:
            return 0
        deleted = 0
        for rank, sm in self.managers.items():
            keys = [
                self._key(h, rank, g.index)
                for h in self.seeded.hashes
                for g in self.registration.groups
            ]
            for i in range(0, len(keys), 4096):
                deleted += sm.delete_l1_keys(keys[i : i + 4096], force=False)[0]
        return deleted

    def drop_page_cache(self) -> int:
        """posix_fadvise(DONTNEED) every L2 file of the seeded prefix. Returns files dropped."""
        if self.seeded is None:
            return 0
        count = 0
        for h in self.seeded.hashes:
            for rank in range(self.registration.tp_size):
                for g in self.registration.groups:
                    count += _drop_file_cache(self.path_of(self._key(h, rank, g.index)))
        return count

    def l1_usage_bytes(self) -> dict[int, int]:
        return {r: sm.get_l1_usage()[0] for r, sm in self.managers.items()}

    def health(self) -> bool:
        return all(sm.report_status().get("is_healthy", False) for sm in self.managers.values())

    # ---- restore ----

    def restore(
        self,
        window_chunks: int,
        budget_chunks: int = 0,
        *,
        pipeline: bool = True,
        fault: FaultSpec | None = None,
        request_id: str = "",
        destination: str | None = None,
    ) -> StorageRestoreResult:
        """Probe and restore the seeded prefix with W = ``window_chunks`` (0: whole plan)."""
        if self.seeded is None:
            raise BadInput("restore before seed: call seed(prefix_tokens, salt) first")
        seeded = self.seeded
        rid = request_id or f"storage-{seeded.salt}-{seeded.tokens}-w{window_chunks}"
        settings = self.config.restore.with_window(window_chunks, budget_chunks)
        config = settings.core_config(pipeline=pipeline)
        restorer = self.make_restorer(config, fault)
        request = self.request(rid, seeded.hashes)
        fail_window = fault.window if fault and fault.kind == "install_error" else -1
        dest = self.destination(request, seeded.salt, destination, fail_window)
        try:
            return self._run(restorer, request, dest, fault)
        finally:
            dest.close()

    def make_restorer(
        self, config: RestoreConfig, fault: FaultSpec | None = None
    ) -> BoundedRestorer:
        """A BoundedRestorer over every rank's StorageManager, sharing the stack's markers.

        One restorer owns one admission budget: use one restorer from several threads to
        restore several requests under a common B.
        """
        drain_s = max(60.0, self.config.restore.window_timeout_s)
        per_rank = {
            r: LMCacheRestoreStorage(sm, self.layouts, drain_timeout_s=drain_s)
            for r, sm in self.managers.items()
        }
        timeout_window = fault.window if fault and fault.kind == "timeout" else -1
        return BoundedRestorer(
            PerRankStorage(per_rank, timeout_window), config, markers=self.markers
        )

    def destination(
        self,
        request: RestoreRequest[ObjectKey],
        salt: str,
        mode: str | None = None,
        fail_window: int = -1,
    ) -> PoolDestination:
        """A fresh destination for ``request`` whose canonical bytes come from ``salt``."""
        canon = CanonicalKV(self.registration, salt)
        hashes = canon.chunk_hashes(request.num_chunks)
        return PoolDestination(
            mode or self.config.destination, canon, request, hashes, self.dest_dir, fail_window
        )

    def _run(
        self,
        restorer: BoundedRestorer,
        request: RestoreRequest[ObjectKey],
        dest: PoolDestination,
        fault: FaultSpec | None,
    ) -> StorageRestoreResult:
        reg, cfg = self.registration, restorer.config
        before = self.l1_usage_bytes()
        t0 = time.monotonic()
        plan = restorer.probe(request)
        t1 = time.monotonic()
        if fault and fault.kind == "drop_key":
            self._drop_key(plan.prefix_chunks, cfg.window_chunks, fault)
        for hw in self.high_water.values():
            hw.reset()
        outcome: RestoreOutcome = restorer.restore(plan, dest)
        t2 = time.monotonic()
        if plan.forced_local:
            # No external tokens were reported: the request is admitted for local prefill,
            # which clears its marker (the engine's successful RUNNING admission).
            restorer.on_admitted(request.request_id)
        peak_abs = {r: hw.peak_bytes for r, hw in self.high_water.items()}
        peak = {r: peak_abs[r] - before[r] for r in peak_abs}
        verify = None if dest.mode != "verify" else (dest.mismatches == 0 and outcome.ok)
        failure = "" if outcome.ok else f"{outcome.failure.name}: {outcome.detail}"
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
            rws_bound_bytes=reg.rws_bound_bytes(cfg.window_chunks) if cfg.window_chunks else 0,
            bytes_restored=outcome.bytes_restored,
            restore_s=t2 - t1,
            probe_s=t1 - t0,
            verify_ok=verify,
            verify_mismatches=dest.mismatches,
            blocks_valid=dest.blocks_valid,
            blocks_total=dest.blocks_total,
            l1_usage_before_bytes=before,
            l1_usage_after_bytes=self.l1_usage_bytes(),
            failure=failure,
            forced_local=plan.forced_local,
            windows_done=outcome.windows_done,
            registration_digest=reg.digest(),
        )

    def _drop_key(self, prefix_chunks: int, window_chunks: int, fault: FaultSpec) -> None:
        """Delete one object of window ``fault.window`` from L2 and L1 (a real missing key)."""
        w = window_chunks or prefix_chunks
        chunk = fault.window * w
        if self.seeded is None or chunk >= prefix_chunks:
            raise BadInput(
                f"fault window {fault.window} is beyond the plan ({prefix_chunks} chunks, W={w})"
            )
        key = self._key(self.seeded.hashes[chunk], fault.rank, fault.group)
        self.path_of(key).unlink(missing_ok=True)
        self.managers[fault.rank].delete_l1_keys([key], force=True)

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
        if remove_files:
            shutil.rmtree(self.config.root_dir, ignore_errors=True)


def deploy(config: StorageStackConfig) -> StorageStack:
    """Start one StorageManager per TP rank over the L2 directory under ``config.root_dir``."""
    return StorageStack(config)


# ---- file helpers ------------------------------------------------------------------------------


def _write_file(path: Path, data: np.ndarray, drop_cache: bool) -> None:
    """Write an L2 object file atomically (tmp + rename), as the FS adapter would."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        mv = memoryview(data)
        while mv:
            mv = mv[os.write(fd, mv) :]
        if drop_cache:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _drop_file_cache(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return 1
    finally:
        os.close(fd)
