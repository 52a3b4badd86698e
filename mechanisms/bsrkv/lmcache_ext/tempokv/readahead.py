"""TempoKV's staging reads on the flash tier: bulk, software-directed, as the paper's
provider stages (§5.1), not page by page as a fault would.

The arena is a file mapping of this process (LMCache's Device-DAX L1 over the flash tier's
loop device). Before an object's range is ``mlock``-ed, its file range is read into the page
cache with ``readahead(2)`` in pieces of ``PIECE`` bytes: each piece goes to the device as
one large request (the loop device takes up to ``max_sectors_kb`` 1280 KiB), so staging is
bound by the flash's bandwidth (``read_bps_device``) while a 4 KiB fault is bound by its
request rate (``read_iops_device``). ``readahead(2)`` of one large range instead goes in
small requests when the device's ``read_ahead_kb`` is 0 (measured: 5.7 against 12.5 MiB/s
per 1 MiB piece under an 11 MiB/s cap), hence the pieces. ``mlock`` then finds the pages
resident (minor faults) and keeps them."""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

PIECE = 1 << 20  # one readahead(2) call: one request to the device (<= max_sectors_kb)


@dataclass(frozen=True, slots=True)
class Mapping:
    lo: int
    hi: int
    offset: int  # the file offset of ``lo``
    path: str


def file_mappings(maps: str) -> list[Mapping]:
    """The file mappings in a /proc/PID/maps text."""
    out = []
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/"):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append(Mapping(lo, hi, int(parts[2], 16), parts[5]))
    return out


def pieces(lo: int, hi: int, piece: int = PIECE) -> list[tuple[int, int]]:
    """``[lo, hi)`` as (offset, length) pieces of at most ``piece`` bytes, cut at multiples
    of ``piece`` (so a piece is one aligned device request)."""
    out = []
    at = lo
    while at < hi:
        end = min(hi, (at // piece + 1) * piece)
        out.append((at, end - at))
        at = end
    return out


def _libc_readahead() -> Callable[[int, int, int], None]:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.readahead
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_size_t]
    fn.restype = ctypes.c_ssize_t

    def call(fd: int, offset: int, length: int) -> None:
        if fn(fd, offset, length) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"readahead({offset}, {length}): {os.strerror(err)}")

    return call


@dataclass
class Stager:
    """Reads address ranges of this process's file mappings into the page cache in pieces."""

    maps: Callable[[], str] = lambda: Path("/proc/self/maps").read_text()
    readahead: Callable[[int, int, int], None] = field(default_factory=_libc_readahead)
    open_file: Callable[[str], int] = lambda path: os.open(path, os.O_RDONLY)
    piece: int = PIECE
    _fds: dict[str, int] = field(default_factory=dict)
    _mappings: list[Mapping] = field(default_factory=list)
    _mu: threading.Lock = field(default_factory=threading.Lock)
    read_bytes: int = 0  # bytes asked of readahead(2) so far

    def _mapping(self, addr: int) -> Mapping:
        with self._mu:
            for fresh in (False, True):
                if fresh or not self._mappings:
                    self._mappings = file_mappings(self.maps())
                for m in self._mappings:
                    if m.lo <= addr < m.hi:
                        return m
        raise ValueError(f"address {addr:#x} is in no file mapping of this process")

    def _fd(self, path: str) -> int:
        with self._mu:
            if path not in self._fds:
                self._fds[path] = self.open_file(path)
            return self._fds[path]

    def stage(self, lo: int, hi: int) -> int:
        """Read ``[lo, hi)`` (addresses inside one file mapping) into the page cache; bytes."""
        m = self._mapping(lo)
        if hi > m.hi:
            raise ValueError(f"range {lo:#x}-{hi:#x} leaves the mapping of {m.path}")
        fd = self._fd(m.path)
        base = m.offset - m.lo
        for off, length in pieces(lo + base, hi + base, self.piece):
            self.readahead(fd, off, length)
        with self._mu:
            self.read_bytes += hi - lo
        return hi - lo

    def close(self) -> None:
        with self._mu:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
