"""Process-stall watch: a ticker on a clock that remembers how long it went without running.

A gap far above the tick is a process stall (CPU starvation, memory pressure, a GIL-holding
call): while it lasts the process answers nothing, the LMCache server no PING either. vLLM's
connector gives up on a server that misses one 10 s PING and recomputes the request into the
same blocks, so ``guard`` refuses to install a window after such a stall.

On a virtual clock a stall is one ``advance`` longer than the tick: the ticker wakes late,
exactly as it does after a real stall.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from bsrkv.clock import Clock, WallClock

LOOKBACK_S = 15.0  # stalls this long before a retrieve began still trip its guard


class StallWatch:
    """Ticks every ``tick_s`` on ``clock`` (default: wall) once started; keeps the gaps
    between ticks longer than ``keep_above_s`` (the last ``history`` of them)."""

    def __init__(
        self,
        clock: Clock | None = None,
        tick_s: float = 0.1,
        keep_above_s: float = 0.5,
        history: int = 256,
    ) -> None:
        self.clock: Clock = clock if clock is not None else WallClock()
        self.tick_s = tick_s
        self.keep_above_s = keep_above_s
        self._cv = threading.Condition(threading.Lock())
        self._last = self.clock.now()
        self._gaps: deque[tuple[float, float]] = deque(maxlen=history)  # (end, length)
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self) -> StallWatch:
        """Run the ticker on a daemon thread; returns self."""
        self._thread = threading.Thread(target=self._run, name="bsr-stall-watch", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        with self._cv:
            while not self._stopped:
                if not self.clock.wait(self._cv, self.tick_s):  # time ran out: a tick
                    self._tick()

    def tick(self) -> None:
        """One tick (what the ticker thread does every ``tick_s``)."""
        with self._cv:
            self._tick()

    def _tick(self) -> None:
        now = self.clock.now()
        gap = now - self._last
        self._last = now
        if gap > self.keep_above_s:
            self._gaps.append((now, gap))

    def max_gap_since(self, t0_s: float) -> float:
        """Longest stall that ended after ``t0_s`` (clock time), or is still going on."""
        now = self.clock.now()
        with self._cv:
            ongoing = now - self._last
            ended = max((g for end, g in self._gaps if end > t0_s), default=0.0)
        return max(ended, ongoing)

    def guard(
        self,
        limit_s: float,
        since_s: float | None = None,
        lookback_s: float = LOOKBACK_S,
        on_trip: Callable[[], None] | None = None,
    ) -> Callable[[], str]:
        """A destination guard for one retrieve that began at ``since_s`` (default: now).

        The guard answers "" (install) unless a stall of at least ``limit_s`` ended after
        ``since_s - lookback_s`` or is going on; then it calls ``on_trip`` and answers why
        not. A stall just before the retrieve counts too: the request may have waited in
        the queue through it while the engine's PING was timing out. ``limit_s`` <= 0: off.
        """
        t0 = self.clock.now() if since_s is None else since_s

        def check() -> str:
            if limit_s <= 0:
                return ""
            gap = self.max_gap_since(t0 - lookback_s)
            if gap < limit_s:
                return ""
            if on_trip is not None:
                on_trip()
            return (
                f"the server stalled {gap:.1f}s during this retrieve (>= stall_guard_s="
                f"{limit_s}): the engine may have declared it unhealthy and be recomputing"
            )

        return check

    def stop(self, join_timeout_s: float = 1.0) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(join_timeout_s)
