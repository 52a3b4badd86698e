"""This machine's room for an L1: MemAvailable and free /dev/shm (L1 lives in POSIX shm)."""

from __future__ import annotations

import shutil
from pathlib import Path


def memory_headroom_bytes() -> dict[str, int]:
    """MemAvailable and free /dev/shm (L1 lives in POSIX shared memory)."""
    avail = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            avail = int(line.split()[1]) * 1024
    shm = shutil.disk_usage("/dev/shm").free if Path("/dev/shm").is_dir() else avail
    return {"mem_available_bytes": avail, "shm_free_bytes": shm}


def l1_fits(l1_total_bytes: int, reserve_bytes: int) -> tuple[bool, str]:
    """Whether an L1 of `l1_total_bytes` (all ranks) fits this machine with `reserve` spare."""
    h = memory_headroom_bytes()
    room = min(h["mem_available_bytes"] - reserve_bytes, h["shm_free_bytes"])
    detail = (
        f"L1 {l1_total_bytes} B vs MemAvailable {h['mem_available_bytes']} B - reserve "
        f"{reserve_bytes} B, /dev/shm free {h['shm_free_bytes']} B"
    )
    return l1_total_bytes <= room, detail
