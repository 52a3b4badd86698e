"""/dev/shm segments of vLLM and LMCache: which there are, which a live process maps, and
removing what killed processes left behind."""

from __future__ import annotations

import os
from pathlib import Path

SHM_PREFIXES = ("psm_", "lmcache_kv_")


def shm_segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith(SHM_PREFIXES)}


def shm_mapped(name: str) -> bool:
    """Whether any live process maps /dev/shm/<name>."""
    needle = f"/dev/shm/{name}"
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            if needle in maps.read_text():
                return True
        except OSError:
            continue
    return False


def remove_unmapped_shm(before: set[str]) -> list[str]:
    """Killed vLLM and LMCache processes leave /dev/shm segments (psm_*, lmcache_kv_*, 1 GiB
    each in lmcache_driven mode): remove those not in ``before`` that no live process
    still maps. Returns the names removed."""
    removed = []
    for seg in sorted(shm_segments() - before):
        if not shm_mapped(seg):
            (Path("/dev/shm") / seg).unlink(missing_ok=True)
            removed.append(seg)
    return removed
