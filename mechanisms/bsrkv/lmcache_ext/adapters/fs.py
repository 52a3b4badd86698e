"""Filesystem L2 adapter with load concurrency, optional O_DIRECT and checksum sidecars.

A subclass of LMCache 0.5.6's stock ``FSL2Adapter`` (``lmcache.v1.distributed.l2_adapters.
fs_l2_adapter``): same directory layout, same file names (one ``<key>.data`` file of raw
object bytes per ``ObjectKey``), same per-key lookup (file exists), same task/event-fd
protocol and hit bitmaps (bit i set iff object i was read completely). What changes:

- lookups: the stock checks (a key's data file exists), made on the submitting thread
  instead of one event-loop and executor round trip per key (the stock ``aiofiles`` loop).
- ``load_concurrency`` (env ``LMCACHE_FS_LOAD_CONCURRENCY`` when the field is absent, as in
  the BSR paper): the keys of load tasks are read by a pool of that many threads, instead of
  one key at a time, handed to the pool on the submitting thread (no event-loop hop). Reads
  still fill the caller's preallocated L1 objects; a key's bit is set only when its whole
  object was read (and verified), so the bitmaps are the same.
- ``use_odirect``: reads bypass the page cache (honest SSD reads). The base path must be on a
  filesystem that takes O_DIRECT (checked at start, tmpfs refuses). Unaligned destinations
  or sizes go through a page-aligned bounce buffer instead of silently falling back.
- ``checksum``: at store time a sidecar ``<key>.data.<algorithm>`` ("<hex digest> <size>";
  ``checksum_algorithm`` xxh3_128 by default, or sha256: ``adapters.checksum``) is
  written before the data file; at load the object's bytes are hashed and compared, and a
  mismatch, a missing sidecar, or a file whose size is not the object's size is a miss. The
  bad bytes only ever sat in the L1 write buffer the prefetch controller then discards
  (``finish_write_and_delete``), so a corrupted or truncated object on disk is detected
  before any byte of it is installed in an engine's KV cache.

A file whose size differs from the object's is a miss even without ``checksum``: the stock
adapter accepts an oversized file (it reads the first bytes); this one is fail-closed.
``read_ahead_size`` is accepted (stock field) but loads here read each object in one call.

Loading it into the real ``lmcache server`` (the stock ``plugin`` adapter type imports the
module and finds ``BsrFSL2AdapterConfig`` by the ``<class_name>Config`` convention)::

    LMCACHE_TRACK_USAGE=false lmcache server --host 127.0.0.1 --port 5555 \\
      --l1-size-gb 1 --eviction-policy LRU --chunk-size 256 \\
      --http-host 127.0.0.1 --http-port 8766 --disable-observability \\
      --supported-transfer-mode auto \\
      --l2-adapter '{"type": "plugin", "module_path": "bsrkv.lmcache_ext.adapters.fs",
                     "class_name": "BsrFSL2Adapter",
                     "adapter_params": {"base_path": "/run/l2", "load_concurrency": 4,
                                        "checksum": true, "checksum_algorithm": "xxh3_128",
                                        "use_odirect": false}}'

In-process (``StorageManager``) the type is also registered as ``"bsr_fs"``: build the config
with ``BsrFSL2AdapterConfig.from_dict({...})`` or ``--l2-adapter '{"type": "bsr_fs", ...}'``
in a process that imported this module first.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmcache.lmcache_native import Bitmap
from lmcache.logging import init_logger
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface, L2TaskId
from lmcache.v1.distributed.l2_adapters.config import (
    L2AdapterConfigBase,
    register_l2_adapter_type,
)
from lmcache.v1.distributed.l2_adapters.factory import register_l2_adapter_factory
from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import (
    FSL2Adapter,
    _object_key_to_filename,
)

from bsrkv.atomic import write_atomic
from bsrkv.lmcache_ext.adapters.checksum import ALGORITHMS
from bsrkv.lmcache_ext.adapters.fileio import (
    check_odirect_supported,
    odirect_aligned,
    read_buffered,
    read_odirect,
)
from bsrkv.lmcache_ext.adapters.fs_config import (
    ENV_LOAD_CONCURRENCY,
    TYPE_NAME,
    BsrFSL2AdapterConfig,
)

logger = init_logger(__name__)

__all__ = ["ENV_LOAD_CONCURRENCY", "TYPE_NAME", "BsrFSL2Adapter", "BsrFSL2AdapterConfig"]


# ---------------------------------------------------------------------------
# adapter
# ---------------------------------------------------------------------------


@dataclass
class _LoadTask:
    """One load task in flight: its keys, the bits of those read whole, reads left."""

    task_id: L2TaskId
    keys: list[ObjectKey]
    bitmap: Any  # lmcache Bitmap
    left: int  # shares not finished (under the adapter's counters lock)


class BsrFSL2Adapter(FSL2Adapter):
    """Stock FS adapter whose loads run ``load_concurrency`` keys at a time."""

    def __init__(self, config: BsrFSL2AdapterConfig, l1_memory_desc: Any = None) -> None:
        if config.use_odirect:
            check_odirect_supported(Path(config.base_path))
        super().__init__(config)
        self._fs_root = str(config.base_path)
        self._closed = False
        self._load_concurrency = config.load_concurrency
        self._checksum = config.checksum
        self._sum = config.checksum_algorithm
        self._load_pool = ThreadPoolExecutor(
            max_workers=config.load_concurrency, thread_name_prefix="bsr-fs-load"
        )
        self._store_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bsr-fs-store")
        self._counters_lock = threading.Lock()
        self._counters = {
            "loaded": 0,  # objects read whole (and verified when checksum is on)
            "missing": 0,  # no data file
            "size_mismatch": 0,  # data file size != object size (truncated or oversized)
            "checksum_missing": 0,  # checksum on, no readable sidecar
            "checksum_mismatch": 0,  # checksum on, digest or size differs: corrupted
            "read_error": 0,  # any other I/O error
            # service time: summed wall time of key reads in flight, and their bytes (tells a
            # slow device from a starved pool: read_ns / load wall = reads in flight)
            "read_ns": 0,
            "read_bytes": 0,
        }
        self._corrupt_keys: list[str] = []  # file names of objects that failed verification
        self._inflight_loads = 0
        self._peak_inflight_loads = 0  # high-water mark of concurrent key reads
        logger.info(
            "BsrFSL2Adapter base_path=%s load_concurrency=%d checksum=%s (%s) use_odirect=%s",
            config.base_path,
            config.load_concurrency,
            config.checksum,
            self._sum.algorithm,
            config.use_odirect,
        )

    # ---- status --------------------------------------------------------

    def counters(self) -> dict[str, int]:
        with self._counters_lock:
            out = dict(self._counters)
            out["peak_inflight_loads"] = self._peak_inflight_loads
            return out

    def corrupt_keys(self) -> list[str]:
        with self._counters_lock:
            return list(self._corrupt_keys)

    def report_status(self) -> dict:
        status = super().report_status()
        status.update(
            type="BsrFSL2Adapter",
            base_path=self._fs_root,
            load_concurrency=self._load_concurrency,
            checksum=self._checksum,
            checksum_algorithm=self._sum.algorithm,
            counters=self.counters(),
        )
        return status

    def close(self) -> None:
        if self._closed:  # idempotent, as the stock adapters are
            return
        self._closed = True
        super().close()
        self._load_pool.shutdown(wait=True, cancel_futures=True)
        self._store_pool.shutdown(wait=True, cancel_futures=True)

    # ---- lookup --------------------------------------------------------

    def submit_lookup_and_lock_task(
        self, keys: list[ObjectKey], group_layout_descs: dict
    ) -> L2TaskId:
        """The stock lookup's checks (bit i set iff object i's data file exists), made on
        the caller's thread before the task id is returned; the result is then reported
        through the lookup event fd as the stock adapter reports it. The stock one awaits
        ``aiofiles.os.path.exists`` key by key, a round trip through its event loop's
        default executor for every key: a 64-chunk probe spent 13 ms there on the CPU
        stack, and every hop is a GIL hand-over (bench/fs_lookup.py has both). A stat is
        microseconds on a local disk. A check that raises reports every key a miss. The
        FS adapter locks nothing (stock: ``submit_unlock`` is a no-op)."""
        with self._lock:
            task_id = self._get_next_task_id()
        bitmap = Bitmap(len(keys))
        try:
            for i in self._existing(keys):
                bitmap.set(i)
        except Exception:
            logger.exception("BsrFSL2Adapter lookup task %s failed: all misses", task_id)
        with self._lock:
            self._completed_lookup_tasks[task_id] = bitmap
        self._lookup_efd.notify()
        return task_id

    def _existing(self, keys: list[ObjectKey]) -> list[int]:
        """Indices of the keys whose data file exists."""
        root, exists, name = self._fs_root, os.path.exists, _object_key_to_filename
        return [i for i, key in enumerate(keys) if exists(os.path.join(root, name(key)))]

    # ---- load ----------------------------------------------------------

    def submit_load_task(self, keys: list[ObjectKey], objects: list[Any]) -> L2TaskId:
        """The task's keys split over the load pool (``load_concurrency`` threads, each
        reading its share in turn straight into the L1 objects); the last share to finish
        reports the bitmap through the load event fd. No event-loop hop: the stock adapter
        schedules a coroutine on its loop thread, which hands each key to an executor (two
        GIL hand-overs more per task, and a pool submission per key)."""
        with self._lock:
            task_id = self._get_next_task_id()
        shares = min(self._load_concurrency, len(keys))
        task = _LoadTask(task_id, keys, Bitmap(len(keys)), shares)
        if not keys:
            self._complete_load(task)
            return task_id
        bufs = [obj.byte_array for obj in objects]
        if len(bufs) != len(keys):
            raise ValueError(f"load task: {len(keys)} keys but {len(bufs)} objects")
        for k in range(shares):
            try:
                self._load_pool.submit(self._load_share, task, range(k, len(keys), shares), bufs)
            except RuntimeError:  # the pool is shut down (closing): that share is all misses
                logger.warning("BsrFSL2Adapter load task %s submitted after close", task_id)
                self._share_done(task)
        return task_id

    def _load_share(self, task: _LoadTask, indices: range, bufs: list[Any]) -> None:
        read = []
        for i in indices:
            try:
                if self._load_one(task.keys[i], bufs[i]):
                    read.append(i)
            except Exception:
                logger.exception("BsrFSL2Adapter load of %s failed", task.keys[i])
        with self._counters_lock:
            for i in read:
                task.bitmap.set(i)
        self._share_done(task)

    def _share_done(self, task: _LoadTask) -> None:
        with self._counters_lock:
            task.left -= 1
            done = task.left == 0
        if done:
            self._complete_load(task)

    def _complete_load(self, task: _LoadTask) -> None:
        loaded = [task.keys[i] for i in task.bitmap.get_indices_list()]
        if loaded:
            self._notify_keys_accessed(loaded)
        with self._lock:
            self._completed_load_tasks[task.task_id] = task.bitmap
        self._load_efd.notify()

    def _load_one(self, key: ObjectKey, dst: Any) -> bool:
        """Read one object into dst; True only if it is whole (and verified)."""
        with self._counters_lock:
            self._inflight_loads += 1
            self._peak_inflight_loads = max(self._peak_inflight_loads, self._inflight_loads)
        t0 = time.monotonic_ns()
        outcome, bad = "read_error", False
        try:
            outcome, bad = self._read_object(key, dst)
        finally:
            dt = time.monotonic_ns() - t0
            ok = outcome == "loaded"
            with self._counters_lock:  # one hold for every counter of this read
                self._inflight_loads -= 1
                self._counters["read_ns"] += dt
                self._counters["read_bytes"] += len(dst) if ok else 0
                self._counters[outcome] += 1
                if bad:
                    self._corrupt_keys.append(_object_key_to_filename(key))
        return ok

    def _read_object(self, key: ObjectKey, dst: Any) -> tuple[str, bool]:
        """(the counter this read lands in, whether the object on disk is bad)."""
        name = _object_key_to_filename(key)
        path = os.path.join(self._fs_root, name)  # str paths: pathlib costs more than a stat
        size = len(dst)
        expected: tuple[str, int] | None = None
        if self._checksum:
            try:
                with open(path + self._sum.suffix, encoding="ascii") as f:
                    expected = self._sum.parse(f.read())
            except (OSError, ValueError):
                expected = None
            if expected is None:
                logger.warning("no valid checksum sidecar for %s: reported as a miss", name)
                return "checksum_missing", True
        try:
            if self._use_odirect:
                num_read = read_odirect(path, dst)
            else:
                num_read = read_buffered(path, dst)
        except FileNotFoundError:
            return "missing", False
        except OSError:
            logger.exception("BsrFSL2Adapter failed to read %s", path)
            return "read_error", False
        if num_read != size:
            logger.warning(
                "size mismatch for %s: object %d bytes, file gave %s: reported as a miss",
                name,
                size,
                num_read,
            )
            return "size_mismatch", True
        if expected is not None and not self._sum.matches(dst, expected):
            logger.warning("checksum mismatch for %s (corrupted object): reported as a miss", name)
            return "checksum_mismatch", True
        return "loaded", False

    # ---- store ---------------------------------------------------------

    async def _execute_store(
        self, keys: list[ObjectKey], objects: list[Any], task_id: L2TaskId
    ) -> None:
        success = True
        stored_keys: list[ObjectKey] = []
        stored_sizes: list[int] = []
        for key, obj in zip(keys, objects, strict=True):
            try:
                size = await self._loop.run_in_executor(
                    self._store_pool, self._store_one, key, obj.byte_array
                )
            except Exception:
                logger.exception("BsrFSL2Adapter failed to store %s", key)
                success = False
                continue
            if size is not None:
                stored_keys.append(key)
                stored_sizes.append(size)
        if stored_keys:
            self._notify_keys_stored(stored_keys, stored_sizes)
        with self._lock:
            self._completed_store_tasks[task_id] = L2StoreResult(success, sum(stored_sizes))
        self._store_efd.notify()

    def _store_one(self, key: ObjectKey, buf: Any) -> int | None:
        """Write one object (sidecar first). None when it was already on disk."""
        final, tmp = self._key_to_file_and_tmp_path(key)
        sidecar = self._sidecar(final)
        if final.exists() and (not self._checksum or sidecar.exists()):
            return None
        size = len(buf)
        if self._checksum:
            write_atomic(sidecar, self._sum.line(buf).encode())
        try:
            mv = memoryview(buf).cast("B")
            if self._use_odirect and odirect_aligned(mv):
                self._write_with_odirect(tmp, mv)
            else:
                with open(tmp, "wb") as f:
                    f.write(mv)
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return size

    # ---- delete --------------------------------------------------------

    async def _execute_delete(self, keys: list[ObjectKey]) -> tuple[list[ObjectKey], list[int]]:
        deleted = await super()._execute_delete(keys)
        for key in keys:
            path = self._key_to_path(key)
            for algorithm in ALGORITHMS:  # every sidecar, whichever algorithm wrote it
                try:
                    path.with_name(path.name + "." + algorithm).unlink(missing_ok=True)
                except OSError:
                    logger.warning("could not remove the %s sidecar of %s", algorithm, key)
        return deleted

    def _sidecar(self, data_path: Path) -> Path:
        return data_path.with_name(data_path.name + self._sum.suffix)


# ---------------------------------------------------------------------------
# registration (by type name, for in-process use; the server uses type "plugin")
# ---------------------------------------------------------------------------


def _create(config: L2AdapterConfigBase, l1_memory_desc: Any = None) -> L2AdapterInterface:
    assert isinstance(config, BsrFSL2AdapterConfig)
    return BsrFSL2Adapter(config, l1_memory_desc)


def _register() -> None:
    try:
        register_l2_adapter_type(TYPE_NAME, BsrFSL2AdapterConfig)
        register_l2_adapter_factory(TYPE_NAME, _create)
    except ValueError:  # already registered in this process
        pass


_register()
