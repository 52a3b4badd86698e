"""The FS tier's physical limit: k threads reading the prefix's L2 files with O_DIRECT."""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bsrkv.lmcache_ext.adapters.fileio import preadv_full

_BUFFERS: dict[tuple[int, int], mmap.mmap] = {}


def reader_buffer(i: int, size: int) -> mmap.mmap:
    """Reader i's page-aligned buffer, made and touched once and reused by every pass (as
    L1's pool is by the restores): a pass times reads, not page faults of fresh memory."""
    buf = _BUFFERS.get((i, size))
    if buf is None:
        buf = _BUFFERS[(i, size)] = mmap.mmap(-1, size)
        buf.write(bytes(size))
    return buf


def run_threads(work: Callable[[Any], None], args: Iterable[Any]) -> float:
    """One thread per argument, started together; seconds until the last one is done."""
    threads = [threading.Thread(target=work, args=(a,)) for a in args]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - t0


def parallel_read(paths: list[Path], readers: int, odirect: bool) -> tuple[float, int]:
    """``readers`` threads read whole files (next file from a shared list) into their own
    page-aligned buffer. Returns (seconds, bytes)."""
    largest = max(p.stat().st_size for p in paths)
    bufs = [reader_buffer(i, largest) for i in range(readers)]
    nxt = iter(paths)
    lock = threading.Lock()
    total = [0] * readers
    errors: list[BaseException] = []
    flags = os.O_RDONLY | (os.O_DIRECT if odirect else 0)

    def work(i: int) -> None:
        whole = memoryview(bufs[i])
        try:
            while True:
                with lock:
                    p = next(nxt, None)
                if p is None:
                    return
                fd = os.open(p, flags)
                try:
                    total[i] += preadv_full(fd, whole, os.fstat(fd).st_size)
                finally:
                    os.close(fd)
        except BaseException as e:  # reported by the caller
            errors.append(e)
        finally:
            whole.release()

    dt = run_threads(work, range(readers))
    if errors:
        raise errors[0]
    return dt, sum(total)
