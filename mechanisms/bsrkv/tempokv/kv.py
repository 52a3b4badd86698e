"""KV objects: independently identified units of reusable prefix KV (one 256-token chunk)."""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class KvObject:
    object_id: str  # stable identity, e.g. "<doc>/<chunk index>"; shared across requests
    size_bytes: int


@dataclass(frozen=True, slots=True)
class Manifest:
    """The ordered objects one request needs, in retrieval order."""

    objects: tuple[KvObject, ...]
    size_bytes: int = field(init=False, compare=False)  # computed once: read on hot paths

    def __post_init__(self) -> None:
        object.__setattr__(self, "size_bytes", sum(o.size_bytes for o in self.objects))


def prefix_manifest(
    doc_id: str, cached_tokens: int, chunk_tokens: int, kv_bytes_per_token: int
) -> Manifest:
    """The chunk objects of a document's cached prefix (complete chunks only)."""
    size_bytes = chunk_tokens * kv_bytes_per_token
    return Manifest(
        tuple(KvObject(f"{doc_id}/{k}", size_bytes) for k in range(cached_tokens // chunk_tokens))
    )
