"""Canonical KV bytes: deterministic contents of every (salt, chunk hash, rank, tensor)."""

from __future__ import annotations

import hashlib

import numpy as np

from bsrkv.registration import Registration


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
