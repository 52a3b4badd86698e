"""The install read-back inside the LMCache MP server: the slice a window was installed into
is copied back out of the engine's paged KV with LMCache's own store copy, into a scratch
object, and its bytes compared with the staged object's.

The copy back is the call LMCache's stock store makes to move paged KV into a memory object
(lmcache 0.5.6 ``v1/multiprocess/modules/lmcache_driven_transfer.py:780-790``:
``transfer_kv_per_object_group(..., batch_size=1, direction=TransferDirection.D2H,
block_ids_host=...)``), over the very block ids the install staged
(``downsample_and_stage_block_ids``), so it takes the same copy path as the install in the
other direction: the copy-engine direct path, the native planned kernel path or the torch
fallback (``object_group_transfer.py:588-664``), whichever the install took. A D2H batch
holding ``None`` is skipped (``object_group_transfer.py:376-384``, ``536-541``,
``681-689``), so one chunk is read back at a time into one scratch object per object
group: the scratch is c per rank, outside L1 (not a staging buffer, never in the restore
pool's gauge), allocated once per retrieve (pinned on a GPU, as LMCache's own host buffers are) and
stated beside the pool bound in the evidence.

A chunk whose tokens the install skipped in part or whole (``skip_first_n_tokens``: blocks
vLLM's prefix cache shares, never written by a retrieve) is not compared: the copy back
would read the engine's own KV there. It is counted as unchecked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bsrkv.restore.readback import ReadbackResult
from bsrkv.restore.types import RowId


def same_bytes(a: Any, b: Any) -> bool:
    """The two memory objects' bytes (``MemoryObj.byte_array``: logical size) are equal.
    A direct compare, not digests: no collision to argue about, and about 12x cheaper on
    the restore's path than two blake2b-128 (0.084 against 1.02 ms per 256 KiB chunk,
    ``bench/readback_compare.py``: ratio 11.9 [11.7, 13.1] over 9 rotated rounds)."""
    import numpy as np

    x = np.frombuffer(a.byte_array, dtype=np.uint8)
    y = np.frombuffer(b.byte_array, dtype=np.uint8)
    return x.shape == y.shape and bool(np.array_equal(x, y))


def scratch_like(obj: Any, pin: bool) -> Any:
    """A memory object outside any allocator with ``obj``'s layout (shapes, dtypes, format)."""
    import torch
    from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj

    size = obj.get_size()
    meta = obj.meta
    raw = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
    # address 0: the copy splits host buffers only at LazyMemoryAllocator.PIN_CHUNK_SIZE
    # offsets, and one torch allocation is one pinned region whatever its size
    scratch_meta = MemoryObjMetadata(
        shape=meta.shape, dtype=meta.dtype, address=0, phy_size=size, ref_count=1,
        fmt=meta.fmt, shapes=meta.shapes, dtypes=meta.dtypes,
    )  # fmt: skip
    return TensorMemoryObj(raw, scratch_meta, parent_allocator=None)


@dataclass
class SliceReader:
    """Reads back what one window's install wrote (``MPBlockDestination`` holds one)."""

    cache_context: Any
    sync: Callable[[], None]  # waits until every copy issued on the context's stream landed
    transfer_key: str
    scratch: dict[int, Any] = field(default_factory=dict)  # object group -> scratch object

    @property
    def scratch_bytes(self) -> int:
        return sum(o.get_size() for o in self.scratch.values())

    def _scratch(self, group: int, like: Any) -> Any:
        s = self.scratch.get(group)
        if s is None or s.get_size() != like.get_size():
            pin = str(self.cache_context.device).startswith("cuda")
            s = self.scratch[group] = scratch_like(like, pin)
        return s

    def read_back(
        self,
        staged_ids: Any,  # the install's downsampled block ids, staged on the device
        host_ids: Sequence[Sequence[int]],  # the same ids on the host
        objects: Mapping[RowId, Sequence[Any]],
        num_chunks: int,
        chunk_tokens: int,
        skip_tokens: int,  # the install's skip_first_n_tokens, relative to the window
        first_chunk: int,  # the window's first chunk in the request (for the report)
    ) -> ReadbackResult:
        import lmcache.lmcache_native as lmcache_native
        from lmcache.v1.multiprocess.object_group_transfer import transfer_kv_per_object_group

        checked = unchecked = 0
        bad: list[tuple[RowId, int]] = []
        for row in sorted(objects):
            for i, obj in enumerate(list(objects[row])[:num_chunks]):
                if i * chunk_tokens < skip_tokens:
                    unchecked += 1
                    continue
                scratch = self._scratch(row.group, obj)
                only: list[Any] = [None] * num_chunks
                only[i] = scratch
                transfer_kv_per_object_group(
                    self.cache_context,
                    staged_ids,
                    only,
                    object_group_id=row.group,
                    batch_size=1,  # as the stock store (lmcache_driven_transfer.py:780)
                    skip_first_n_tokens=0,
                    direction=lmcache_native.TransferDirection.D2H,
                    transfer_key=self.transfer_key,
                    block_ids_host=host_ids,
                )
                self.sync()
                checked += 1
                if not same_bytes(scratch, obj):
                    bad.append((row, first_chunk + i))
        return ReadbackResult(checked, tuple(bad), self.scratch_bytes, unchecked)
