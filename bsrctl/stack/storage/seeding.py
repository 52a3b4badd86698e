"""Seeding the storage stack: the canonical prefix of a salt written into its L2 tier (FS
files or the Mooncake store; existing objects reused) and optionally its L1, then forgotten
from L1 or dropped from the page cache. A mixin of ``StorageStack``, which holds the parts
named below.

Where the FS tier verifies checksums (``bsr_fs`` with ``restore.checksum``), each object's
sidecar is written as the adapter's own store writes it: ``<file>.<algorithm>``, its line
from the object's bytes, before the data file; an object whose sidecar is missing is
written again (sidecar and data), as the adapter does."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.storage_manager import StorageManager

from bsrctl.stack.launch import extensions
from bsrctl.stack.storage.canonical_kv import CanonicalKV
from bsrctl.stack.storage.config import SeededPrefix, SeedResult
from bsrctl.stack.storage.files import drop_file_cache, write_file
from bsrkv.atomic import write_atomic
from bsrkv.registration import Registration


class PrefixSeeding:
    """seed / forget / drop_page_cache over the stack's managers, layouts and keys."""

    registration: Registration
    managers: dict[int, StorageManager]
    layouts: Any
    seeded: SeededPrefix | None
    mooncake: bool
    mooncake_prefix: str
    key_of: Callable[[bytes, int, int], ObjectKey]
    path_of: Callable[[ObjectKey], Path]
    checksum: Any  # adapters.checksum.Checksum the FS tier verifies at load; None: none

    def sidecar_of(self, key: ObjectKey) -> Path | None:
        """The checksum sidecar the FS tier verifies ``key`` with (None: it verifies none)."""
        if self.checksum is None:
            return None
        path = self.path_of(key)
        return path.with_name(path.name + self.checksum.suffix)

    def _stored(self, key: ObjectKey) -> bool:
        """The object is on disk as the tier reads it: its file, and its sidecar if any."""
        sidecar = self.sidecar_of(key)
        return self.path_of(key).exists() and (sidecar is None or sidecar.exists())

    def _write_object(self, key: ObjectKey, data: np.ndarray, drop_cache: bool) -> None:
        sidecar = self.sidecar_of(key)
        if sidecar is not None:  # first, as the adapter's store: a data file never lacks one
            write_atomic(sidecar, self.checksum.line(data).encode())
        write_file(self.path_of(key), data, drop_cache)

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
                    key = self.key_of(h, rank, g.index)
                    data = None
                    if self.mooncake:
                        gi = g.index
                        if self._mooncake_put(
                            rank, key, lambda h=h, r=rank, gi=gi: canon.object_bytes(h, r, gi)
                        ):
                            written += 1
                            nbytes += reg.group_bytes_per_chunk(g.index)
                    elif not self._stored(key):
                        data = canon.object_bytes(h, rank, g.index)
                        self._write_object(key, data, drop_cache)
                        written += 1
                        nbytes += data.size
                    if into_l1:
                        self._write_l1(
                            rank,
                            g.index,
                            key,
                            data if data is not None else canon.object_bytes(h, rank, g.index),
                        )
        self.seeded = SeededPrefix(salt, n * reg.chunk_tokens, tuple(hashes))
        return SeedResult(n * reg.chunk_tokens, n, written, nbytes, time.monotonic() - t0)

    def mooncake_store(self, rank: int) -> Any:
        """The Mooncake client of a rank's adapter (the bsr_mooncake tier only)."""
        (_desc, adapter), *_ = self.managers[rank].l2_adapters()
        return adapter._store  # noqa: SLF001 - the same client the tier loads through

    def mooncake_name(self, key: ObjectKey) -> str:
        return extensions.mooncake_name(key, self.mooncake_prefix)

    def _mooncake_put(self, rank: int, key: ObjectKey, data: Any) -> bool:
        """Put one object into the store unless it is there. True if written."""
        store, name = self.mooncake_store(rank), self.mooncake_name(key)
        if store.is_exist(name) == 1:
            return False
        rc = store.put(name, data().tobytes())
        if rc != 0:
            raise RuntimeError(f"Mooncake put of {name} returned {rc}")
        return True

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
                self.key_of(h, rank, g.index)
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
                    count += drop_file_cache(self.path_of(self.key_of(h, rank, g.index)))
        return count
