"""TempoKV's bulk staging reads (``tempokv.readahead``): an address range of a file mapping
read into the page cache with ``readahead(2)`` in aligned 1 MiB pieces (one device request
each), exact pieces and offsets; and on a real file, exactly the staged pages resident."""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from bsrctl.stack.launch.fast_tier import resident_bytes
from bsrkv.lmcache_ext.tempokv.readahead import PIECE, Mapping, Stager, file_mappings, pieces

MIB = 1 << 20
MAPS = (
    "7f0000000000-7f0000800000 rw-s 00100000 07:00 12 /dev/loop3\n"
    "7f0000900000-7f0000901000 r--p 00000000 00:00 0 \n"
    "7f0000a00000-7f0000a01000 r-xp 00002000 08:01 99 /usr/lib/libc.so.6\n"
    "7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                  [stack]\n"
)


def test_file_mappings_of_a_maps_text() -> None:
    assert file_mappings(MAPS) == [
        Mapping(0x7F0000000000, 0x7F0000800000, 0x100000, "/dev/loop3"),
        Mapping(0x7F0000A00000, 0x7F0000A01000, 0x2000, "/usr/lib/libc.so.6"),
    ]


def test_pieces_are_cut_at_piece_multiples() -> None:
    assert pieces(0, 3 * MIB) == [(0, MIB), (MIB, MIB), (2 * MIB, MIB)]
    assert pieces(MIB - 4096, MIB + 8192) == [(MIB - 4096, 4096), (MIB, 8192)]
    assert pieces(5, 5) == []


@given(st.integers(0, 1 << 30), st.integers(0, 8 * MIB), st.sampled_from([4096, MIB]))
def test_pieces_cover_the_range_in_order_never_crossing_a_boundary(lo, n, piece) -> None:
    got = pieces(lo, lo + n, piece)
    at = lo
    for off, length in got:
        assert off == at and 0 < length <= piece
        assert off // piece == (off + length - 1) // piece  # one aligned piece each
        at += length
    assert at == lo + n


def test_a_range_is_read_at_its_file_offsets_in_pieces() -> None:
    calls: list[tuple[int, int, int]] = []
    opened: list[str] = []
    s = Stager(lambda: MAPS, lambda fd, off, n: calls.append((fd, off, n)),
               lambda p: opened.append(p) or 42)  # fmt: skip
    lo = 0x7F0000000000 + MIB - 4096  # file offset 2 MiB - 4 KiB (the mapping starts at 1 MiB)
    assert s.stage(lo, lo + MIB + 8192) == MIB + 8192
    assert calls == [(42, 2 * MIB - 4096, 4096), (42, 2 * MIB, MIB), (42, 3 * MIB, 4096)]
    s.stage(lo, lo + 4096)
    assert opened == ["/dev/loop3"] and s.read_bytes == MIB + 12288  # one fd per file


def test_a_range_outside_every_mapping_is_refused() -> None:
    s = Stager(lambda: MAPS, lambda fd, off, n: None, lambda p: 3)
    for lo, hi in ((0x1000, 0x2000), (0x7F00007FF000, 0x7F0000801000)):
        try:
            s.stage(lo, hi)
        except ValueError:
            continue
        raise AssertionError(f"{lo:#x}-{hi:#x} staged")


def test_on_a_real_file_exactly_the_staged_pages_become_resident(tmp_path: Path) -> None:
    path = tmp_path / "arena"
    path.write_bytes(os.urandom(4 * MIB))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert resident_bytes(fd, 4 * MIB) == 0
        with mmap.mmap(fd, 4 * MIB, prot=mmap.PROT_READ):
            (ours,) = [m for m in file_mappings(Path("/proc/self/maps").read_text())
                       if m.path == str(path)]  # fmt: skip
            s = Stager()
            assert s.stage(ours.lo + MIB, ours.lo + 2 * MIB + 8192) == PIECE + 8192
            s.close()
            # readahead(2) returns once the reads are submitted; mincore counts a page once
            # its read is done: wait (bounded) for them, then exactly the range is resident
            deadline = time.monotonic() + 10.0
            while resident_bytes(fd, 4 * MIB) < PIECE + 8192 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert resident_bytes(fd, 4 * MIB) == PIECE + 8192  # nothing beyond the range
    finally:
        os.close(fd)
