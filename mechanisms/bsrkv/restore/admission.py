"""Global restore admission budget B, in chunks.

B = W reproduces the paper's global lock (one bounded window at a time, process-wide).
B > W lets several requests' windows be in flight while their chunk sum stays <= B, and
B >= 2W lets one request fetch window j+1 while it installs window j.

Deadlock freedom: a restore blocks in ``acquire`` only while it holds nothing; while it
holds a window it may only ``try_acquire`` the next (hold-and-wait never blocks).
Fairness: blocked acquirers are served first-come first-served; ``try_acquire`` never
jumps ahead of a blocked acquirer.
"""

from __future__ import annotations

import threading
from collections import deque

from bsrkv.clock import Clock, WallClock
from bsrkv.restore.errors import RestoreConfigError


class AdmissionBudget:
    """Counting semaphore over chunks with FIFO waiters and an in-use high-water mark.

    Waits run on ``clock`` (default: wall), so an admission timeout fires at an exact
    virtual time in tests.
    """

    def __init__(self, budget_chunks: int, clock: Clock | None = None) -> None:
        if budget_chunks < 1:
            raise RestoreConfigError(f"admission_budget_chunks must be >= 1, got {budget_chunks}")
        self.budget_chunks = budget_chunks
        self._in_use = 0
        self._peak_in_use = 0
        self._waiters: deque[object] = deque()
        self._cv = threading.Condition()
        self._clock: Clock = clock if clock is not None else WallClock()

    @property
    def in_use_chunks(self) -> int:
        with self._cv:
            return self._in_use

    @property
    def peak_in_use_chunks(self) -> int:
        with self._cv:
            return self._peak_in_use

    def reset_peak(self) -> None:
        with self._cv:
            self._peak_in_use = self._in_use

    def _check(self, chunks: int) -> None:
        if not 1 <= chunks <= self.budget_chunks:
            raise RestoreConfigError(
                f"a window of {chunks} chunks cannot be admitted under a budget of "
                f"{self.budget_chunks} chunks: set admission_budget_chunks >= window_chunks"
            )

    def _take(self, chunks: int) -> None:
        self._in_use += chunks
        self._peak_in_use = max(self._peak_in_use, self._in_use)

    def try_acquire(self, chunks: int) -> bool:
        """Take ``chunks`` now if they fit and nobody is queued; never blocks."""
        self._check(chunks)
        with self._cv:
            if self._waiters or self._in_use + chunks > self.budget_chunks:
                return False
            self._take(chunks)
            return True

    def acquire(self, chunks: int, timeout_s: float | None = None) -> bool:
        """Block (FIFO) until ``chunks`` fit; False if ``timeout_s`` passed first."""
        self._check(chunks)
        clock = self._clock
        deadline = None if timeout_s is None else clock.now() + timeout_s
        me = object()
        with self._cv:
            self._waiters.append(me)
            try:
                while self._waiters[0] is not me or self._in_use + chunks > self.budget_chunks:
                    if deadline is not None and clock.now() >= deadline:
                        return False
                    clock.wait_until(self._cv, deadline)
                self._take(chunks)
                return True
            finally:
                self._waiters.remove(me)
                self._cv.notify_all()

    def release(self, chunks: int) -> None:
        with self._cv:
            if chunks > self._in_use:
                raise RuntimeError(f"releasing {chunks} chunks but only {self._in_use} in use")
            self._in_use -= chunks
            self._cv.notify_all()
