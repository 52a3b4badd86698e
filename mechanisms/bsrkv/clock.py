"""One clock API for the whole project, two implementations: virtual (deterministic) and wall.

Two ways to spend time on it:

- an event loop (TempoKV): ``call_at`` / ``call_later`` schedule callbacks, ``run`` fires
  them. Events at the same time run in the order they were scheduled (a counter breaks
  ties), so a virtual run is a pure function of its inputs and tests compare whole traces.
- threads (the BSR core): a thread that holds a ``threading.Condition`` waits on it with
  ``wait`` / ``wait_until`` (as ``Condition.wait``: True unless the time ran out), or
  ``sleep``\\s. On the wall clock these are ``Condition.wait`` and ``time.sleep``. On the
  virtual clock nothing waits for real time to pass: a waiter blocks until its condition is
  notified or until whoever drives the clock moves it past the waiter's deadline
  (``advance``, ``run``), which wakes it. ``settle`` lets that driver wait until the
  threads it runs are all blocked on the clock, so each step happens at an exact time.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
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

    def wait(self, cond: threading.Condition, timeout_s: float | None) -> bool:
        """``cond.wait(timeout_s)`` in this clock's time; the caller holds ``cond``."""
        ...

    def wait_until(self, cond: threading.Condition, deadline_s: float | None) -> bool:
        """``cond.wait`` until the clock reads ``deadline_s`` (None: until notified)."""
        ...

    def sleep(self, delay_s: float) -> None: ...


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

    def wait_until(self, cond: threading.Condition, deadline_s: float | None) -> bool:
        raise NotImplementedError  # pragma: no cover - overridden

    def wait(self, cond: threading.Condition, timeout_s: float | None) -> bool:
        if timeout_s is None:
            return self.wait_until(cond, None)
        return self.wait_until(cond, self.now() + max(0.0, timeout_s))

    def _pop_due(self, until_s: float | None) -> Timer | None:
        while self._heap:
            at_s, _, timer = self._heap[0]
            if until_s is not None and at_s > until_s:
                return None
            heapq.heappop(self._heap)
            if not timer.cancelled:
                return timer
        return None


class _Sleeper:
    """A thread blocked on the virtual clock: its deadline and the condition it waits on."""

    __slots__ = ("deadline_s", "cond")

    def __init__(self, deadline_s: float, cond: threading.Condition) -> None:
        self.deadline_s = deadline_s
        self.cond = cond


class VirtualClock(_EventLoop):
    """Time jumps to the next event; nothing sleeps.

    The event loop is single-threaded: only the thread that drives the clock schedules
    events. Other threads may read ``now`` and block in ``wait`` / ``wait_until`` / ``sleep``.
    """

    def __init__(self, start_s: float = 0.0) -> None:
        super().__init__()
        self._now_s = start_s
        self._sleepers: list[_Sleeper] = []
        # Guards the sleepers; notified whenever a thread starts waiting (for settle).
        self._lock = threading.Condition(threading.Lock())

    def now(self) -> float:
        return self._now_s

    def run(self, until_s: float | None = None) -> None:
        while (timer := self._pop_due(until_s)) is not None:
            self._now_s = max(self._now_s, timer.at_s)
            if self._sleepers:
                self._wake_due()
            timer.fn()
        if until_s is not None:
            self._now_s = max(self._now_s, until_s)
            if self._sleepers:
                self._wake_due()

    def advance(self, delay_s: float) -> None:
        """Move time on by ``delay_s``: fire the events and wake the waiters due by then."""
        self.run(until_s=self._now_s + delay_s)

    def advance_to(self, at_s: float) -> None:
        self.run(until_s=at_s)

    def _wake_due(self) -> None:
        # run() sets the time first, then looks for sleepers; a new sleeper appends first,
        # then reads the time (wait_until): one of the two sees the other, so no wake-up is
        # lost, and an event loop with no thread waiting takes no lock.
        with self._lock:
            at_s = self._now_s
            due = [s for s in self._sleepers if s.deadline_s <= at_s]
            # A woken thread no longer counts as waiting, so settle() waits for its next wait.
            self._sleepers = [s for s in self._sleepers if s.deadline_s > at_s]
        for s in due:  # outside the clock's lock: a waiter holds its condition while registering
            with s.cond:
                s.cond.notify_all()

    def wait_until(self, cond: threading.Condition, deadline_s: float | None) -> bool:
        deadline = math.inf if deadline_s is None else deadline_s
        with self._lock:
            me = _Sleeper(deadline, cond)
            self._sleepers.append(me)
            if deadline <= self._now_s:
                self._sleepers.remove(me)
                return False
            self._lock.notify_all()
        try:
            cond.wait()  # the caller holds cond, so no wake-up is lost before this
        finally:
            with self._lock:
                if me in self._sleepers:  # not already dropped by the step that woke it
                    self._sleepers.remove(me)
        return self._now_s < deadline

    def sleep(self, delay_s: float) -> None:
        deadline = self._now_s + max(0.0, delay_s)
        cond = threading.Condition(threading.Lock())
        with cond:
            while self._now_s < deadline:
                self.wait_until(cond, deadline)

    def waiting(self) -> int:
        """Threads blocked on this clock now. One woken by time stops counting at once;
        one woken by its condition's ``notify`` counts until it has returned from ``wait``."""
        with self._lock:
            return len(self._sleepers)

    def settle(self, threads: int = 1, timeout_s: float = 10.0) -> None:
        """Block, in real time, until at least ``threads`` threads wait on this clock.

        A driver calls it before each ``advance`` so that the threads it runs have reached
        their waits and the step's time is exact. Raises TimeoutError after ``timeout_s``.
        """
        with self._lock:
            if not self._lock.wait_for(lambda: len(self._sleepers) >= threads, timeout_s):
                raise TimeoutError(
                    f"{len(self._sleepers)} of {threads} thread(s) waiting on the clock "
                    f"after {timeout_s}s"
                )


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

    def wait_until(self, cond: threading.Condition, deadline_s: float | None) -> bool:
        if deadline_s is None:
            return cond.wait()
        return cond.wait(max(0.0, deadline_s - self.now()))

    def sleep(self, delay_s: float) -> None:
        time.sleep(max(0.0, delay_s))
