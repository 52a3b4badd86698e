"""State geometry of a model registration: what one chunk of external state is made of.

A registration is the list of tensors one TP rank registers per chunk of ``chunk_tokens``
tokens, partitioned into semantic (HMA / LMCache object) groups. One chunk of one group on
one rank is one storage object. From it follow:

- ``bytes_per_chunk`` (c): bytes one chunk stages per rank across every registered tensor;
  ``bytes_per_chunk_all_ranks`` = c * tp_size.
- RWS accounting of the paper (Eq. 4): ``window_bytes(W) = W * c`` per rank, and the bound
  ``rws_bound_bytes(W, unit) = W * c_allocated + aux_bytes``, where ``c_allocated`` is what a
  chunk occupies in the restore pool: each group's object rounded up to LMCache's L1
  allocation unit (read from LMCache's allocator by whoever plans the restore), ``c`` when
  every group's bytes are a multiple of it (``unit = 1`` is the logical c).
- ``digest()``: sha256 over the tensor list, chunk size and TP size, the "registration
  identity" an acceptance check compares between what was stored and what is restored.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

# Bytes per element of the dtypes a registration may name (torch names, no "torch.").
DTYPE_BYTES = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "uint8": 1,
    "int8": 1,
    "int32": 4,
    "int64": 8,
}


@dataclass(frozen=True)
class TensorSpec:
    """One registered tensor's slice for one chunk on one rank."""

    name: str  # registered name (vLLM layer name or state name)
    shape: tuple[int, ...]  # per-chunk shape on one rank
    dtype: str  # torch dtype name without "torch."
    group: int  # semantic group index (GroupSpec.index)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(
                f"tensor {self.name}: unknown dtype {self.dtype!r}, one of {sorted(DTYPE_BYTES)}"
            )

    @property
    def nbytes(self) -> int:
        n = DTYPE_BYTES[self.dtype]
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class GroupSpec:
    """One semantic group: one LMCache object group, one object per (chunk, rank)."""

    index: int  # object_group_id
    name: str  # human name ("attention", "indexer", ...)
    # The model's attention span in chunks, not BSR's window W: -1 full attention (the whole
    # prefix is required), >= 1 a sliding-window group (BSR's stock fallback serves it).
    sliding_window_chunks: int = -1


@dataclass(frozen=True)
class Registration:
    """Per-rank tensors per chunk, their groups, the TP size and the chunk size."""

    model: str  # registration name (model id + variant)
    tensors: tuple[TensorSpec, ...]  # per rank, in registration order
    groups: tuple[GroupSpec, ...]  # every group a tensor names, by index
    tp_size: int  # TP ranks that each register ``tensors``
    chunk_tokens: int  # tokens per chunk (LMCache chunk size)
    aux_bytes: int = 0  # restore-pool bytes per rank not proportional to W (paper's aux)
    # vLLM KV cache groups (hybrid manager) the model's layers fall into; > 1 needs LMCache's
    # own connector (stack.vllm.connector: lmcache): vLLM's built-in one serves one group
    engine_groups: int = 1

    def __post_init__(self) -> None:
        known = {g.index for g in self.groups}
        missing = {t.group for t in self.tensors} - known
        if missing:
            raise ValueError(f"{self.model}: tensors name groups {sorted(missing)} not in groups")
        if self.tp_size < 1 or self.chunk_tokens < 1:
            raise ValueError(f"{self.model}: tp_size and chunk_tokens must be >= 1")

    @property
    def num_tensors(self) -> int:
        return len(self.tensors)

    @property
    def bytes_per_chunk(self) -> int:
        """c: bytes of one chunk on one rank across every registered tensor."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def bytes_per_chunk_all_ranks(self) -> int:
        return self.bytes_per_chunk * self.tp_size

    def group_tensors(self, group: int) -> tuple[TensorSpec, ...]:
        return tuple(t for t in self.tensors if t.group == group)

    def group_bytes_per_chunk(self, group: int) -> int:
        """Bytes of one storage object (one chunk of one group on one rank)."""
        return sum(t.nbytes for t in self.group_tensors(group))

    def allocated_group_bytes_per_chunk(self, group: int, unit: int) -> int:
        """One storage object as LMCache's L1 allocates it: its bytes rounded up to ``unit``
        (one allocation per object, ``TensorMemoryAllocator.batched_allocate``)."""
        if unit < 1:
            raise ValueError(f"{self.model}: allocation unit {unit} must be >= 1")
        return -(-self.group_bytes_per_chunk(group) // unit) * unit

    def allocated_bytes_per_chunk(self, unit: int) -> int:
        """c_allocated: what one chunk occupies in the restore pool on one rank, every
        group's object rounded up to the L1 allocation ``unit`` (``c`` when ``unit`` is 1)."""
        return sum(self.allocated_group_bytes_per_chunk(g.index, unit) for g in self.groups)

    def window_bytes(self, window_chunks: int) -> int:
        """RWS of one window of W chunks, per rank: W * c."""
        return window_chunks * self.bytes_per_chunk

    def rws_bound_bytes(self, window_chunks: int, unit: int = 1) -> int:
        """The bound a measured restore-pool peak is checked against: W * c_allocated + aux,
        with c_allocated at the L1 allocation ``unit`` (1: the logical W * c + aux)."""
        return window_chunks * self.allocated_bytes_per_chunk(unit) + self.aux_bytes

    def num_chunks(self, num_tokens: int) -> int:
        """Full chunks in a prefix of ``num_tokens`` tokens (LMCache stores full chunks)."""
        return num_tokens // self.chunk_tokens

    def digest(self) -> str:
        """sha256 over the tensor list (name, shape, dtype, group), chunk and TP size."""
        doc = {
            "chunk_tokens": self.chunk_tokens,
            "tp_size": self.tp_size,
            "tensors": [[t.name, list(t.shape), t.dtype, t.group] for t in self.tensors],
        }
        blob = json.dumps(doc, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()

    def geometry(self) -> tuple[str, ...]:
        """Per tensor, in order, ``name=[shape] dtype gN``: what registration identity
        compares between the derived, the live and the stored registration. The engine
        sends no tensor names, so only the part after ``=`` is compared."""
        return tuple(f"{t.name}={list(t.shape)} {t.dtype} g{t.group}" for t in self.tensors)

    def to_dict(self) -> dict[str, Any]:
        """Summary for evidence records (``stack.registration``)."""
        return {
            "model": self.model,
            "num_tensors": self.num_tensors,
            "groups": [
                {"index": g.index, "name": g.name, "sliding_window_chunks": g.sliding_window_chunks}
                for g in self.groups
            ],
            "group_bytes_per_chunk": {
                str(g.index): self.group_bytes_per_chunk(g.index) for g in self.groups
            },
            "tp_size": self.tp_size,
            "chunk_tokens": self.chunk_tokens,
            "bytes_per_chunk": self.bytes_per_chunk,
            "bytes_per_chunk_all_ranks": self.bytes_per_chunk_all_ranks,
            "aux_bytes": self.aux_bytes,
            "engine_groups": self.engine_groups,
            "digest": self.digest(),
        }


def first_difference(expected: tuple[str, ...], other: tuple[str, ...], what: str) -> str | None:
    """Where ``other`` (a ``geometry()``) first differs from ``expected``, naming the
    expected tensor; None when they are the same tensors in the same order."""
    for i, (a, b) in enumerate(zip(expected, other, strict=False)):
        name, want = a.split("=", 1)
        got = b.split("=", 1)[-1]
        if want != got:
            return f"tensor {i} ({name}): {what} {got} != expected {want}"
    if len(expected) != len(other):
        return f"{what} has {len(other)} tensors, expected {len(expected)}"
    return None
