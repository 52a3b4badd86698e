"""Drive L2 adapters through LMCache's real StorageManager (real L1 + the adapter as L2).

Shared by the in-process tests and by adapter_driver.py (the same steps run inside a
network namespace). Object bytes are a deterministic function of the key, so what a load
returns is checked against bytes regenerated from scratch, never against the stored copy.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from lmcache.v1.distributed.api import (
    GroupedObjectKeys,
    MemoryLayoutDesc,
    ObjectKey,
    PrefetchTaskSpec,
)
from lmcache.v1.distributed.config import (
    EvictionConfig,
    L1ManagerConfig,
    L1MemoryManagerConfig,
    StorageManagerConfig,
)
from lmcache.v1.distributed.l2_adapters.config import L2AdaptersConfig
from lmcache.v1.distributed.storage_manager import StorageManager

ROWS = 256  # one "chunk" of 256 tokens
MODEL = "bsr-test/tiny"


def layout(chunk_bytes: int) -> MemoryLayoutDesc:
    assert chunk_bytes % ROWS == 0
    return MemoryLayoutDesc(shapes=[torch.Size([ROWS, chunk_bytes // ROWS])], dtypes=[torch.uint8])


def kv_rank(rank: int, world: int = 1) -> int:
    return ObjectKey.ComputeKVRank(world, rank, world, rank)


def make_keys(n: int, salt: str, rank: int = 0, world: int = 1) -> list[ObjectKey]:
    return [
        ObjectKey(
            chunk_hash=hashlib.sha256(f"{salt}:{i}".encode()).digest()[:16],
            model_name=MODEL,
            kv_rank=kv_rank(rank, world),
        )
        for i in range(n)
    ]


def canonical(key: ObjectKey, chunk_bytes: int) -> torch.Tensor:
    """The bytes a key's object must hold, regenerated from the key alone."""
    seed = int.from_bytes(
        hashlib.sha256(key.chunk_hash + key.kv_rank.to_bytes(8, "big")).digest()[:8], "big"
    )
    raw = bytearray(np.random.default_rng(seed).bytes(chunk_bytes))
    return torch.frombuffer(raw, dtype=torch.uint8).view(ROWS, -1)


def build_sm(adapter_configs: list[Any], l1_bytes: int, shm_name: str = "") -> StorageManager:
    """A StorageManager over these L2 adapters; ``shm_name``: its L1 pool's own /dev/shm name
    (LMCache's default is per process: two managers alive at once need their own)."""
    named = {"shm_name": shm_name} if shm_name else {}
    return StorageManager(
        StorageManagerConfig(
            l1_manager_config=L1ManagerConfig(
                L1MemoryManagerConfig(size_in_bytes=l1_bytes, use_lazy=False, **named)
            ),
            eviction_config=EvictionConfig("LRU"),
            l2_adapter_config=L2AdaptersConfig(adapter_configs),
        )
    )


def adapters(sm: StorageManager) -> list[Any]:
    return [adapter for _, adapter in sm.l2_adapters()]


def l2_bytes(sm: StorageManager) -> int:
    return sum(a.get_usage().total_bytes_used for a in adapters(sm))


def store(sm: StorageManager, keys: list[ObjectKey], chunk_bytes: int, timeout_s: float = 30.0):
    """Write keys through L1 and wait until the L2 adapters account for all their bytes."""
    before = l2_bytes(sm)
    objs = sm.reserve_write(keys, layout(chunk_bytes))
    assert len(objs) == len(keys), f"L1 reserved {len(objs)} of {len(keys)}"
    for key in keys:
        objs[key].tensor.view(torch.uint8).view(ROWS, -1).copy_(canonical(key, chunk_bytes))
    t0 = time.monotonic()
    sm.finish_write(keys)
    want = before + len(keys) * chunk_bytes
    while l2_bytes(sm) < want:
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"L2 holds {l2_bytes(sm) - before} of {want - before} bytes")
        time.sleep(0.005)
    return time.monotonic() - t0


def forget(sm: StorageManager, keys: list[ObjectKey]) -> None:
    sm.delete_l1_keys(keys, force=True)
    assert sm.get_l1_usage()[0] == 0, sm.get_l1_usage()


@dataclass
class Fetch:
    hits: list[int]  # key indices resident in L1 after the prefetch
    l1_hits: list[int]  # of which already in L1
    l2_hits: list[int]  # of which loaded from L2
    exact: list[int]  # hit indices whose bytes equal the canonical bytes
    digests: dict[int, str]  # sha256 of each hit's bytes
    elapsed_s: float  # submit to result
    completed: bool  # a result came within the timeout


def prefetch(
    sm: StorageManager,
    keys: list[ObjectKey],
    chunk_bytes: int,
    timeout_s: float = 30.0,
    policy: str = "full",
) -> Fetch:
    """Prefetch keys (one group), check every hit's bytes, release the read locks."""
    spec = PrefetchTaskSpec(
        key_groups=[
            GroupedObjectKeys(keys=keys, object_group_id=0, layout_desc=layout(chunk_bytes))
        ],
        fetching_policy=policy,
    )
    t0 = time.monotonic()
    handle = sm.submit_prefetch_task(spec)
    completed = sm.wait_prefetch_status(handle, timeout_s)
    result = sm.query_prefetch_status(handle) if completed else None
    elapsed = time.monotonic() - t0
    if result is None:
        return Fetch([], [], [], [], {}, elapsed, False)
    hits = result.hit_cells[0].get_indices_list()
    exact: list[int] = []
    digests: dict[int, str] = {}
    hit_keys = [keys[i] for i in hits]
    if hit_keys:
        with sm.read_prefetched_results(hit_keys) as objs:
            assert objs is not None
            for i, obj in zip(hits, objs, strict=True):
                data = obj.tensor.view(torch.uint8).view(ROWS, -1)
                digests[i] = hashlib.sha256(data.numpy().tobytes()).hexdigest()
                if torch.equal(data, canonical(keys[i], chunk_bytes)):
                    exact.append(i)
        sm.finish_read_prefetched(hit_keys)
    return Fetch(
        hits,
        result.l1_hit_cells[0].get_indices_list(),
        result.l2_hit_cells[0].get_indices_list(),
        exact,
        digests,
        elapsed,
        True,
    )


def adapter_lookup(adapter: Any, keys: list[ObjectKey], timeout_s: float = 30.0) -> list[int]:
    """Adapter-level lookup-and-lock (then unlock): the indices it reports present."""
    task = adapter.submit_lookup_and_lock_task(keys, {})
    deadline = time.monotonic() + timeout_s
    while (bitmap := adapter.query_lookup_and_lock_result(task)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError("lookup result never came")
        time.sleep(0.002)
    adapter.submit_unlock(keys)
    return bitmap.get_indices_list()


class Buf:
    """A plain load/store buffer with the MemoryObj surface adapters use (adapter-level tests)."""

    def __init__(self, chunk_bytes: int, fill: int = 0xEE) -> None:
        self.tensor = torch.full((ROWS, chunk_bytes // ROWS), fill, dtype=torch.uint8)

    def get_size(self) -> int:
        return self.tensor.numel()

    @property
    def data_ptr(self) -> int:
        return self.tensor.data_ptr()

    @property
    def byte_array(self) -> memoryview:
        return memoryview(self.tensor.numpy()).cast("B")


def adapter_load(
    adapter: Any, keys: list[ObjectKey], chunk_bytes: int, timeout_s: float = 30.0
) -> tuple[list[int], list[int], float]:
    """Adapter-level load into fresh buffers: (indices reported loaded, indices whose
    buffer holds the canonical bytes, seconds)."""
    bufs = [Buf(chunk_bytes) for _ in keys]
    t0 = time.monotonic()
    task = adapter.submit_load_task(keys, bufs)
    while (bitmap := adapter.query_load_result(task)) is None:
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError("load result never came")
        time.sleep(0.002)
    elapsed = time.monotonic() - t0
    exact = [
        i
        for i, (key, buf) in enumerate(zip(keys, bufs, strict=True))
        if torch.equal(buf.tensor, canonical(key, chunk_bytes))
    ]
    return bitmap.get_indices_list(), exact, elapsed
