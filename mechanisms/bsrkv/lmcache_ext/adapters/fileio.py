"""Whole-object file reads for the FS adapter: buffered, or O_DIRECT (page cache bypassed).

A read fills the caller's buffer and returns the bytes read, or -1 when the file's size
is not the object's: a file of any other size is a miss, never a partial hit. O_DIRECT
needs aligned buffers and sizes; an unaligned destination goes through a page-aligned
bounce buffer instead of silently falling back to buffered reads.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from pathlib import Path
from typing import Any

ODIRECT_ALIGN_BYTES = 4096  # logical-block alignment that every O_DIRECT device accepts


def buffer_address(buf: Any) -> int:
    """Address of a writable buffer (memoryview of an L1 object)."""
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    return ctypes.addressof(ctypes.c_char.from_buffer(mv))


def read_buffered(path: str | Path, dst: Any) -> int:
    """Bytes read, or -1 when the file's size is not len(dst)."""
    with open(path, "rb", buffering=0) as f:
        if os.fstat(f.fileno()).st_size != len(dst):
            return -1
        mv = memoryview(dst).cast("B")
        total = 0
        while total < len(mv):
            n = f.readinto(mv[total:])
            if not n:
                break
            total += n
        return total


def read_odirect(path: str | Path, dst: Any) -> int:
    """O_DIRECT read; a page-aligned bounce buffer when dst or its size is unaligned."""
    size = len(dst)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        if os.fstat(fd).st_size != size:
            return -1
        mv = memoryview(dst).cast("B")
        if odirect_aligned(mv):
            return preadv_full(fd, mv, size)
        padded = -(-size // ODIRECT_ALIGN_BYTES) * ODIRECT_ALIGN_BYTES
        with mmap.mmap(-1, padded) as bounce:  # anonymous mmap: page aligned
            bmv = memoryview(bounce)
            try:
                n = preadv_full(fd, bmv, padded)
                if n >= size:
                    mv[:size] = bmv[:size]
                return min(n, size)
            finally:
                bmv.release()
    finally:
        os.close(fd)


def odirect_aligned(mv: memoryview) -> bool:
    return len(mv) % ODIRECT_ALIGN_BYTES == 0 and buffer_address(mv) % ODIRECT_ALIGN_BYTES == 0


def preadv_full(fd: int, mv: memoryview, length: int) -> int:
    total = 0
    while total < length:
        n = os.preadv(fd, [mv[total:length]], total)
        if n <= 0:
            break
        total += n
        if total % ODIRECT_ALIGN_BYTES:  # short read at EOF
            break
    return total


def check_odirect_supported(base_path: Path) -> None:
    base_path.mkdir(parents=True, exist_ok=True)
    probe = base_path / ".odirect-probe"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o644)
        os.close(fd)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise ValueError(
                f"use_odirect: the filesystem of {base_path} does not take O_DIRECT "
                "(tmpfs?); put base_path on a disk filesystem or set use_odirect false"
            ) from None
        raise
    finally:
        probe.unlink(missing_ok=True)
