"""The destination paged-KV pool of a storage-stack restore: verify, mmap or null."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from lmcache.v1.distributed.api import ObjectKey

from bsrctl.stack.storage.canonical_kv import CanonicalKV
from bsrkv.restore import RestoreRequest, RowId, Window


class PoolDestination:
    """A request's destination blocks: one per (row, chunk); valid bit per block.

    mode "verify": compare each installed object with canonical bytes, keep nothing (the
    accuracy pass's oracle, inside the restore).
    mode "mmap": copy into a file-backed pool (rows x chunks x object bytes), synced.
    mode "memory": copy into an anonymous pool of that size (a KV install's copy, nothing
    compared during the restore: the timed passes' production path).
    mode "null": count bytes only.

    ``mismatched`` holds the (row, chunk) of every object found not canonical: during the
    install in "verify" mode, by ``compare_pool`` after the restore in "mmap" and "memory".
    """

    def __init__(
        self,
        mode: str,
        canon: CanonicalKV,
        request: RestoreRequest[ObjectKey],
        chunk_hashes: Sequence[bytes],
        dest_dir: Path,
    ) -> None:
        self.mode = mode
        self.canon = canon
        self.rows = {r.row: i for i, r in enumerate(request.rows)}
        self.row_bytes = {r.row: r.chunk_bytes for r in request.rows}
        self.hashes = list(chunk_hashes)
        n = request.num_chunks
        self.valid = {r.row: bytearray(n) for r in request.rows}
        self.mismatched: list[tuple[RowId, int]] = []
        self._lock = threading.Lock()
        self._pool: np.ndarray | None = None
        self._offsets: dict[RowId, int] = {}
        if mode in ("mmap", "memory") and n:
            off = 0
            for r in request.rows:
                self._offsets[r.row] = off
                off += r.chunk_bytes * n
            if mode == "memory":
                self._pool = np.zeros(off, np.uint8)
            else:
                dest_dir.mkdir(parents=True, exist_ok=True)
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
                            self.mismatched.append((row, chunk))
                elif self._pool is not None:
                    at = self._offsets[row] + chunk * size
                    self._pool[at : at + size] = buf
                self.valid[row][chunk] = 1
                done += size
        return done

    def sync(self, request_id: str) -> None:
        if isinstance(self._pool, np.memmap):
            self._pool.flush()

    @property
    def mismatches(self) -> int:
        return len(self.mismatched)

    @property
    def compares(self) -> bool:
        """Whether this destination's bytes are compared (while installing, or after)."""
        return self.mode != "null"

    def compare_pool(self) -> None:
        """Compare every valid block of the pool with its canonical bytes, after the restore
        (its timer stopped): what a timed pass installed is checked as the accuracy pass's
        was. "verify" compared while installing; "null" kept no bytes."""
        if self._pool is None:
            return
        for row, bits in self.valid.items():
            size, base = self.row_bytes[row], self._offsets[row]
            for chunk, ok in enumerate(bits):
                if not ok:
                    continue
                want = self.canon.object_bytes(self.hashes[chunk], row.rank, row.group)
                at = base + chunk * size
                if not np.array_equal(self._pool[at : at + size], want):
                    self.mismatched.append((row, chunk))

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
        if isinstance(self._pool, np.memmap):
            path = Path(self._pool.filename)
            del self._pool
            path.unlink(missing_ok=True)
        self._pool = None
