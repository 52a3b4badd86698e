"""LMCache L2 adapter over a Mooncake store (``mooncake.store.MooncakeDistributedStore``).

LMCache 0.5.6's own ``mooncake_store`` adapter needs a C++ extension the
``mooncake-transfer-engine-non-cuda`` wheel lacks; this one talks to the store through the
wheel's Python client only. It implements ``L2AdapterInterface`` like the stock FS adapter:
non-blocking submit, results popped once, one event fd per operation kind.

- Keys: ``<key_prefix>@<model>@0x<kv_rank>@<group>@<chunk hash hex>[@<salt>]`` (the stock
  FS file name without ``.data``).
- Store: ``batch_is_exist`` then ``batch_put_from`` of the keys not yet there, straight from
  the L1 objects' memory. A store task fails if any put returns non-zero.
- Lookup: ``batch_is_exist``; bit i set iff it returned exactly 1. Mooncake has no read lock:
  ``submit_unlock`` is a no-op, an object evicted after lookup is a load miss.
- Load: ``batch_get_into`` straight into the L1 objects; bit i set iff the call returned
  exactly the object's size. Every other value (0, ``-704`` missing key, ``-800`` storage
  node down, ``-900`` master down, ``-600`` size mismatch...) and any exception is a miss,
  never a hit: a failed load's bytes never become visible.
- Calls block (a get with the master down takes about 4 s), so each operation kind runs on
  its own worker threads: a slow load never holds up a lookup or a store.
- Start-up refuses to call ``setup`` (which blocks about 90 s without a master) until the
  master's RPC port accepts a TCP connection, within ``connect_timeout_s``.

The adapter process must reach the master: when the whole stack runs in one private network
namespace, so start ``lmcache server`` with the namespace's
``wrap`` (``nsenter -t <holder pid> -n --``). Loading it into the real server::

    nsenter -t <holder pid> -n -- env LMCACHE_TRACK_USAGE=false lmcache server \\
      --host 127.0.0.1 --port 5555 --l1-size-gb 1 --eviction-policy LRU --chunk-size 256 \\
      --http-host 127.0.0.1 --http-port 8766 --disable-observability \\
      --supported-transfer-mode auto \\
      --l2-adapter '{"type": "plugin", "module_path": "bsrkv.lmcache_ext.adapters.mooncake",
                     "class_name": "BsrMooncakeL2Adapter",
                     "adapter_params": {"master_server_address": "127.0.0.1:50051"}}'

In-process the type is also registered as ``"bsr_mooncake"``.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
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
from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import _FILE_EXT, _object_key_to_filename
from lmcache.v1.platform import create_event_notifier

logger = init_logger(__name__)

TYPE_NAME = "bsr_mooncake"
MIB = 1 << 20

_FIELDS: dict[str, tuple[type, Any]] = {
    # name: (type, default); default None = required
    "master_server_address": (str, None),  # "host:port" of mooncake_master's RPC
    "local_hostname": (str, "127.0.0.1"),  # this client's transfer-engine address
    "metadata_server": (str, "P2PHANDSHAKE"),
    "protocol": (str, "tcp"),  # "tcp" | "rdma"
    "rdma_devices": (str, ""),
    "global_segment_size": (int, 0),  # bytes this client contributes (0: the node does)
    "local_buffer_size": (int, 64 * MIB),  # client transfer buffer
    "replica_num": (int, 1),
    "key_prefix": (str, "bsr"),
    "load_workers": (int, 2),  # threads running batch_get_into
    "connect_timeout_s": (float, 10.0),  # wait for the master's RPC port before setup
    "register_l1": (bool, False),  # register the L1 region with the client (RDMA)
}


class BsrMooncakeL2AdapterConfig(L2AdapterConfigBase):
    def __init__(self, **values: Any) -> None:
        for name, (_, default) in _FIELDS.items():
            setattr(self, name, values.get(name, default))

    @classmethod
    def from_dict(cls, d: dict) -> BsrMooncakeL2AdapterConfig:
        generic = {"type", "affinity_tag", "shared", "eviction", "persist_enabled", "serde"}
        unknown = sorted(set(d) - set(_FIELDS) - generic)
        if unknown:
            raise ValueError(f"unknown {TYPE_NAME} fields {unknown}; known: {sorted(_FIELDS)}")
        values: dict[str, Any] = {}
        for name, (kind, default) in _FIELDS.items():
            if name not in d:
                if default is None:
                    raise ValueError(f"{name} is required (e.g. '127.0.0.1:50051')")
                continue
            value = d[name]
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
                raise ValueError(f"{name}: expected {kind.__name__}, got {value!r}")
            if kind in (int, float) and value < 0:
                raise ValueError(f"{name}: must be >= 0, got {value!r}")
            values[name] = value
        if values.get("load_workers", 2) < 1:
            raise ValueError("load_workers must be >= 1")
        address = values["master_server_address"]
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"master_server_address {address!r}: expected 'host:port'")
        return cls(**values)

    @classmethod
    def help(cls) -> str:
        lines = ["Mooncake L2 adapter (bsrkv) fields:"]
        for name, (kind, default) in _FIELDS.items():
            lines.append(
                f"- {name} ({kind.__name__}): "
                + ("required" if default is None else f"{default!r}")
            )
        return "\n".join(lines)


def mooncake_key(key: ObjectKey, prefix: str) -> str:
    return f"{prefix}@{_object_key_to_filename(key)[: -len(_FILE_EXT)]}"


def wait_tcp(address: str, timeout_s: float) -> bool:
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


class BsrMooncakeL2Adapter(L2AdapterInterface):
    """Mooncake store as an LMCache L2 tier; every non-success return code is a miss."""

    def __init__(
        self,
        config: BsrMooncakeL2AdapterConfig,
        l1_memory_desc: Any = None,
        store: Any = None,
    ) -> None:
        super().__init__(max_capacity_bytes=0)
        self._config = config
        self._prefix = config.key_prefix
        self._store = store if store is not None else self._connect(config, l1_memory_desc)
        from mooncake.store import ReplicateConfig

        self._replicate = ReplicateConfig()
        self._replicate.replica_num = config.replica_num
        self._store_efd = create_event_notifier()
        self._lookup_efd = create_event_notifier()
        self._load_efd = create_event_notifier()
        self._lock = threading.Lock()
        self._next_task_id: L2TaskId = 0
        self._done_store: dict[L2TaskId, L2StoreResult] = {}
        self._done_lookup: dict[L2TaskId, Bitmap] = {}
        self._done_load: dict[L2TaskId, Bitmap] = {}
        self._sizes: dict[str, tuple[ObjectKey, int]] = {}  # keys this adapter stored
        self._counters = {
            "stored": 0,
            "store_errors": 0,
            "lookup_hits": 0,
            "lookup_misses": 0,
            "loaded": 0,
            "load_misses": 0,
            "last_error_code": 0,
        }
        self._store_pool = ThreadPoolExecutor(1, thread_name_prefix="bsr-mc-store")
        self._lookup_pool = ThreadPoolExecutor(1, thread_name_prefix="bsr-mc-lookup")
        self._load_pool = ThreadPoolExecutor(config.load_workers, thread_name_prefix="bsr-mc-load")
        self._closed = False
        logger.info(
            "BsrMooncakeL2Adapter master=%s protocol=%s prefix=%s",
            config.master_server_address,
            config.protocol,
            config.key_prefix,
        )

    @staticmethod
    def _connect(config: BsrMooncakeL2AdapterConfig, l1_memory_desc: Any) -> Any:
        from mooncake.store import MooncakeDistributedStore

        if not wait_tcp(config.master_server_address, config.connect_timeout_s):
            raise RuntimeError(
                f"Mooncake master {config.master_server_address} not reachable within "
                f"{config.connect_timeout_s:.0f} s; start it first (and run this process in "
                "its network namespace)"
            )
        store = MooncakeDistributedStore()
        rc = store.setup(
            config.local_hostname,
            config.metadata_server,
            config.global_segment_size,
            config.local_buffer_size,
            config.protocol,
            config.rdma_devices,
            config.master_server_address,
        )
        if rc != 0:
            raise RuntimeError(f"MooncakeDistributedStore.setup returned {rc}")
        if config.register_l1 and l1_memory_desc is not None:
            ptr = getattr(l1_memory_desc, "ptr", None)
            size = getattr(l1_memory_desc, "size", None)
            if ptr is not None and size:
                rc = store.register_buffer(int(ptr), int(size))
                if rc != 0:
                    raise RuntimeError(f"register_buffer of the L1 region returned {rc}")
        return store

    # ---- event fds -----------------------------------------------------

    def get_store_event_fd(self) -> int:
        return self._store_efd.fileno()

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._lookup_efd.fileno()

    def get_load_event_fd(self) -> int:
        return self._load_efd.fileno()

    # ---- submit / query ------------------------------------------------

    def _new_task_id(self) -> L2TaskId:
        with self._lock:
            tid = self._next_task_id
            self._next_task_id += 1
            return tid

    def submit_store_task(self, keys: list[ObjectKey], objects: list[Any]) -> L2TaskId:
        tid = self._new_task_id()
        self._store_pool.submit(self._run_store, tid, keys, objects)
        return tid

    def pop_completed_store_tasks(self) -> dict[L2TaskId, L2StoreResult]:
        with self._lock:
            done, self._done_store = self._done_store, {}
        return done

    def submit_lookup_and_lock_task(self, keys: list[ObjectKey], group_layout_descs: dict) -> int:
        tid = self._new_task_id()
        self._lookup_pool.submit(self._run_lookup, tid, keys)
        return tid

    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._done_lookup.pop(task_id, None)

    def submit_unlock(self, keys: list[ObjectKey]) -> None:
        return None  # Mooncake has no read locks

    def submit_load_task(self, keys: list[ObjectKey], objects: list[Any]) -> L2TaskId:
        tid = self._new_task_id()
        self._load_pool.submit(self._run_load, tid, keys, objects)
        return tid

    def query_load_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._done_load.pop(task_id, None)

    # ---- workers -------------------------------------------------------

    def _names(self, keys: list[ObjectKey]) -> list[str]:
        return [mooncake_key(k, self._prefix) for k in keys]

    def _run_store(self, tid: L2TaskId, keys: list[ObjectKey], objects: list[Any]) -> None:
        ok = True
        stored: list[tuple[ObjectKey, int]] = []
        try:
            names = self._names(keys)
            exists = self._store.batch_is_exist(names)
            todo = [i for i, e in enumerate(exists) if e != 1]
            if todo:
                sizes = [objects[i].get_size() for i in todo]
                rcs = self._store.batch_put_from(
                    [names[i] for i in todo],
                    [objects[i].data_ptr for i in todo],
                    sizes,
                    self._replicate,
                )
                for i, size, rc in zip(todo, sizes, rcs, strict=True):
                    if rc == 0:
                        stored.append((keys[i], size))
                        with self._lock:
                            self._sizes[names[i]] = (keys[i], size)
                    else:
                        ok = False
                        self._bump("store_errors", rc)
        except Exception:
            logger.exception("BsrMooncakeL2Adapter store task %d failed", tid)
            ok = False
        if stored:
            self._bump("stored", 0, len(stored))
            self._notify_keys_stored([k for k, _ in stored], [s for _, s in stored])
        with self._lock:
            self._done_store[tid] = L2StoreResult(ok, sum(s for _, s in stored))
        self._store_efd.notify()

    def _run_lookup(self, tid: L2TaskId, keys: list[ObjectKey]) -> None:
        bitmap = Bitmap(len(keys))
        try:
            codes = self._store.batch_is_exist(self._names(keys)) if keys else []
            for i, code in enumerate(codes):
                if code == 1:
                    bitmap.set(i)
                elif code != 0:
                    self._bump("lookup_misses", code, 0)
        except Exception:
            logger.exception("BsrMooncakeL2Adapter lookup task %d failed: all misses", tid)
        hits = bitmap.popcount()
        self._bump("lookup_hits", 0, hits)
        self._bump("lookup_misses", 0, len(keys) - hits)
        with self._lock:
            self._done_lookup[tid] = bitmap
        self._lookup_efd.notify()

    def _run_load(self, tid: L2TaskId, keys: list[ObjectKey], objects: list[Any]) -> None:
        bitmap = Bitmap(len(keys))
        try:
            if keys:
                sizes = [obj.get_size() for obj in objects]
                codes = self._store.batch_get_into(
                    self._names(keys), [obj.data_ptr for obj in objects], sizes
                )
                for i, (code, size) in enumerate(zip(codes, sizes, strict=True)):
                    if code == size and size > 0:
                        bitmap.set(i)
                    else:
                        self._bump("load_misses", code if code < 0 else 0, 0)
        except Exception:
            logger.exception("BsrMooncakeL2Adapter load task %d failed: all misses", tid)
        hits = bitmap.popcount()
        self._bump("loaded", 0, hits)
        self._bump("load_misses", 0, len(keys) - hits)
        loaded = [keys[i] for i in bitmap.get_indices_list()]
        if loaded:
            self._notify_keys_accessed(loaded)
        with self._lock:
            self._done_load[tid] = bitmap
        self._load_efd.notify()

    def _bump(self, name: str, code: int, n: int = 1) -> None:
        with self._lock:
            self._counters[name] += n
            if code < 0:
                self._counters["last_error_code"] = code

    # ---- delete / status / close ----------------------------------------

    def delete(self, keys: list[ObjectKey]) -> None:
        if not keys:
            return
        names = self._names(keys)
        try:
            rcs = self._store.batch_remove(names, False)
        except Exception:
            logger.exception("BsrMooncakeL2Adapter delete failed")
            return
        deleted: list[tuple[ObjectKey, int]] = []
        with self._lock:
            for name, rc in zip(names, rcs, strict=True):
                entry = self._sizes.pop(name, None) if rc == 0 else None
                if entry is not None:
                    deleted.append(entry)
        if deleted:
            self._notify_keys_deleted([k for k, _ in deleted], [s for _, s in deleted])

    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counters)

    def report_status(self) -> dict:
        try:
            health = int(self._store.health_check())
        except Exception:
            health = -1
        # health_check() still says 0 after the master died: also knock on its port.
        reachable = wait_tcp(self._config.master_server_address, 0.0)
        return {
            "is_healthy": health == 0 and reachable,
            "master_reachable": reachable,
            "type": "BsrMooncakeL2Adapter",
            "master_server_address": self._config.master_server_address,
            "health_check": health,  # 0 ok, 1 closed, 2 master unreachable
            "counters": self.counters(),
        }

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for pool in (self._store_pool, self._lookup_pool, self._load_pool):
            pool.shutdown(wait=True, cancel_futures=True)
        try:
            self._store.close()
        except Exception:
            logger.exception("MooncakeDistributedStore.close failed")
        for efd in (self._store_efd, self._lookup_efd, self._load_efd):
            efd.close()


def _create(config: L2AdapterConfigBase, l1_memory_desc: Any = None) -> L2AdapterInterface:
    assert isinstance(config, BsrMooncakeL2AdapterConfig)
    return BsrMooncakeL2Adapter(config, l1_memory_desc)


def _register() -> None:
    try:
        register_l2_adapter_type(TYPE_NAME, BsrMooncakeL2AdapterConfig)
        register_l2_adapter_factory(TYPE_NAME, _create)
    except ValueError:
        pass


_register()
