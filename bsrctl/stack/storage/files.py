"""L2 object files as LMCache's FS adapter writes them, and dropping them from the page
cache so the next reads come from the device."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def write_file(path: Path, data: np.ndarray, drop_cache: bool) -> None:
    """Write an L2 object file atomically (tmp + rename), as the FS adapter would."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        mv = memoryview(data)
        while mv:
            mv = mv[os.write(fd, mv) :]
        if drop_cache:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def drop_file_cache(path: Path) -> int:
    """fsync and drop one file from the page cache; 1 if it was there, else 0."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return 1
    finally:
        os.close(fd)
