"""How LMCache's L1 allocates a registration's objects: the allocation unit, read at runtime.

LMCache 0.5.6's L1 (``L1MemoryManager``, ``lmcache/v1/distributed/memory_manager/
l1_memory_manager.py:44-90``) allocates every object from a ``MixedMemoryAllocator`` whose
``TensorMemoryAllocator`` carves it out of an ``AddressManager``: one object of a layout
(``get_size_bytes`` of all its shapes, ``lmcache/utils.py:103``) takes
``compute_aligned_size(raw)``, the raw size rounded up to ``align_bytes``
(``lmcache/v1/memory_management.py:1361-1371``, ``batched_allocate`` at 1478-1559;
``memory_allocators/tensor_memory_allocator.py:130-131``). ``align_bytes`` comes from
``L1MemoryManagerConfig.align_bytes`` (default 0x1000, ``distributed/config.py:299``; the MP
server's ``--l1`` parser defaults it to 4096, ``config.py:94``) and is exposed on the storage
manager as ``StorageManager.l1_memory_desc.align_bytes`` (``storage_manager.py:757``,
``internal_api.py:29-45``). So a chunk of a group whose bytes are not a multiple of it
occupies more of the restore pool than its logical bytes: ``Registration.
allocated_bytes_per_chunk(unit)``.
"""

from __future__ import annotations

from typing import Any


def allocation_unit(storage_manager: Any) -> int:
    """The L1 allocation unit (bytes) of a running LMCache ``StorageManager``: the alignment
    its L1 allocator rounds every object up to."""
    unit = int(storage_manager.l1_memory_desc.align_bytes)
    if unit < 1:
        raise ValueError(f"LMCache L1 reports allocation unit {unit}")
    return unit
