"""Restore-pool peak gauge: bytes staged for restore, per TP rank, exact high-water mark.

Bytes enter when a window is submitted for staging (its full reservation, so the gauge
is never below what the staging pool may hold for restores) and leave when the window
is released. ``reset`` starts a new high-water period from the current level.
"""

from __future__ import annotations

import threading


class RestorePoolGauge:
    """Thread-safe per-rank level and high-water mark of restore staging bytes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._level: dict[int, int] = {}
        self._peak: dict[int, int] = {}

    def add(self, bytes_by_rank: dict[int, int]) -> None:
        with self._lock:
            for rank, n in bytes_by_rank.items():
                level = self._level.get(rank, 0) + n
                self._level[rank] = level
                self._peak[rank] = max(self._peak.get(rank, 0), level)

    def remove(self, bytes_by_rank: dict[int, int]) -> None:
        with self._lock:
            for rank, n in bytes_by_rank.items():
                level = self._level.get(rank, 0) - n
                if level < 0:
                    raise RuntimeError(f"restore pool gauge for rank {rank} below zero")
                self._level[rank] = level

    def level_bytes(self) -> dict[int, int]:
        with self._lock:
            return dict(self._level)

    def peak_bytes(self) -> dict[int, int]:
        """High-water mark per rank since the last reset."""
        with self._lock:
            return dict(self._peak)

    def peak_max_bytes(self) -> int:
        """Largest per-rank high-water mark (the figure compared with W*c + aux)."""
        with self._lock:
            return max(self._peak.values(), default=0)

    def reset(self) -> None:
        with self._lock:
            self._peak = dict(self._level)
