"""One clock interface, two implementations: virtual (deterministic) and wall.

Events at the same time run in the order they were scheduled (a counter breaks ties), so a
virtual run is a pure function of its inputs and tests can compare whole traces.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol


class Timer:
    """Handle to a scheduled callback; cancel() makes it a no-op."""

    __slots__ = ("at_s", "fn", "cancelled")

    def __init__(self, at_s: float, fn: Callable[[], None]) -> None:
        self.at_s = at_s
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Clock(Protocol):
    def now(self) -> float: ...

    def call_at(self, at_s: float, fn: Callable[[], None]) -> Timer: ...

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Timer: ...

    def run(self, until_s: float | None = None) -> None: ...


class _EventLoop:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()

    def call_at(self, at_s: float, fn: Callable[[], None]) -> Timer:
        timer = Timer(max(at_s, self.now()), fn)
        heapq.heappush(self._heap, (timer.at_s, next(self._seq), timer))
        return timer

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Timer:
        return self.call_at(self.now() + max(0.0, delay_s), fn)

    def now(self) -> float:  # pragma: no cover - overridden
        raise NotImplementedError

    def _pop_due(self, until_s: float | None) -> Timer | None:
        while self._heap:
            at_s, _, timer = self._heap[0]
            if until_s is not None and at_s > until_s:
                return None
            heapq.heappop(self._heap)
            if not timer.cancelled:
                return timer
        return None


class VirtualClock(_EventLoop):
    """Time jumps to the next event; nothing sleeps."""

    def __init__(self, start_s: float = 0.0) -> None:
        super().__init__()
        self._now_s = start_s

    def now(self) -> float:
        return self._now_s

    def run(self, until_s: float | None = None) -> None:
        while (timer := self._pop_due(until_s)) is not None:
            self._now_s = max(self._now_s, timer.at_s)
            timer.fn()
        if until_s is not None:
            self._now_s = max(self._now_s, until_s)


class WallClock(_EventLoop):
    """Seconds since construction; run() sleeps until each event is due."""

    def __init__(self) -> None:
        super().__init__()
        self._t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._t0

    def run(self, until_s: float | None = None) -> None:
        while (timer := self._pop_due(until_s)) is not None:
            delay_s = timer.at_s - self.now()
            if delay_s > 0:
                time.sleep(delay_s)
            timer.fn()
