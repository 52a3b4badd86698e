"""Process-stall detection for the stall guard (see ``retrieve.RetrieveHandlers``)."""

from __future__ import annotations

import threading
import time
from collections import deque


class StallWatch:
    """A ticker thread that remembers how long this process went without running it.

    A gap far above the tick is a process stall (CPU starvation, memory pressure, a
    GIL-holding call): while it lasts the server answers no PING either.
    """

    TICK_S = 0.1
    KEEP_ABOVE_S = 0.5  # gaps shorter than this are not remembered

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._gaps: deque[tuple[float, float]] = deque(maxlen=256)  # (end, length)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bsr-stall-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.TICK_S):
            now = time.monotonic()
            with self._lock:
                gap = now - self._last
                self._last = now
                if gap > self.KEEP_ABOVE_S:
                    self._gaps.append((now, gap))

    def max_gap_since(self, t0: float) -> float:
        """Longest stall that ended after ``t0``, or is still going on."""
        now = time.monotonic()
        with self._lock:
            ongoing = now - self._last
            ended = max((g for end, g in self._gaps if end > t0), default=0.0)
        return max(ended, ongoing)

    def stop(self) -> None:
        self._stop.set()
