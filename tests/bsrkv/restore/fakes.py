"""In-memory sides of a restore for the pure-core tests, and a thread runner.

``FakeStorage`` records every call so traces are exact. ``ClockStorage`` makes each window
complete a fixed time after it was staged, waiting on the test's ``VirtualClock``: the
timeouts then fire at exact virtual times and nothing waits in real time.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bsrkv.clock import VirtualClock
from bsrkv.restore import RestoreRequest, RowId, RowKeys, StageResult, Window

ROWS = (RowId(0, 0), RowId(0, 1), RowId(1, 0), RowId(1, 1))


def request(n: int, rid: str = "r") -> RestoreRequest[str]:
    rows = tuple(RowKeys(r, tuple(f"{r.rank}/{r.group}/{i}" for i in range(n)), 100) for r in ROWS)
    return RestoreRequest(rid, rows, 16)


class FakeStorage:
    """Everything present unless listed in ``missing``; records calls in order."""

    def __init__(self, missing: set[str] = frozenset(), timeout_windows: set[int] = frozenset()):
        self.missing = set(missing)
        self.timeout_windows = set(timeout_windows)
        self.calls: list[tuple[str, int]] = []
        self.live: set[int] = set()
        self.lock = threading.Lock()

    def probe(self, req: RestoreRequest[str]) -> list[list[bool]]:
        return [[k not in self.missing for k in r.keys] for r in req.rows]

    def stage(self, req: RestoreRequest[str], w: Window) -> tuple[RestoreRequest[str], Window]:
        with self.lock:
            self.calls.append(("stage", w.index))
            self.live.add(w.index)
        return (req, w)

    def wait(self, ticket: Any, timeout_s: float) -> StageResult | None:
        req, w = ticket
        self.calls.append(("wait", w.index))
        if w.index in self.timeout_windows:
            return None
        hits = tuple(
            tuple(k not in self.missing for k in r.keys[w.chunk_start : w.chunk_stop])
            for r in req.rows
        )
        return StageResult(hits, {})

    @contextmanager
    def read(self, ticket: Any, n: int) -> Iterator[dict[RowId, list[str]]]:
        req, w = ticket
        yield {r.row: list(r.keys[w.chunk_start : w.chunk_start + n]) for r in req.rows}

    def release(self, ticket: Any) -> None:
        with self.lock:
            self.calls.append(("release", ticket[1].index))
            self.live.discard(ticket[1].index)


class ClockStorage(FakeStorage):
    """Each window is complete ``ready_s`` of clock time after it was staged; one in
    ``never`` (or every one, with ``ready_s`` None) never is.

    ``wait`` blocks on the clock until then or until its timeout, whichever comes first.
    """

    def __init__(
        self, clock: VirtualClock, ready_s: float | None, never: set[int] = frozenset()
    ) -> None:
        super().__init__()
        self.clock = clock
        self.ready_s = ready_s
        self.never = set(never)
        self.cv = threading.Condition()
        self.staged_at: dict[int, float] = {}
        self.timeouts: list[float] = []

    def stage(self, req: RestoreRequest[str], w: Window) -> tuple[RestoreRequest[str], Window]:
        self.staged_at[w.index] = self.clock.now()
        return super().stage(req, w)

    def wait(self, ticket: Any, timeout_s: float) -> StageResult | None:
        self.timeouts.append(timeout_s)
        w = ticket[1]
        never = self.ready_s is None or w.index in self.never
        ready_at = math.inf if never else self.staged_at[w.index] + self.ready_s
        until = min(ready_at, self.clock.now() + timeout_s)
        with self.cv:
            while self.clock.now() < until:
                self.clock.wait_until(self.cv, until)
        if self.clock.now() < ready_at:  # the window is not complete in time
            self.calls.append(("wait", w.index))
            return None
        return super().wait(ticket, timeout_s)


class FakeDest:
    """Keeps what was installed; notes when (on ``clock``) the request was invalidated."""

    def __init__(self, fail_window: int = -1, clock: VirtualClock | None = None) -> None:
        self.fail_window = fail_window
        self.clock = clock
        self.installed: list[str] = []
        self.invalidated = 0
        self.invalidated_at: float | None = None

    def install(self, rid: str, w: Window, objects: Any, n: int) -> int:
        if w.index == self.fail_window:
            raise RuntimeError("boom")
        for objs in objects.values():
            self.installed.extend(objs[:n])
        return 100 * n * len(objects)

    def sync(self, rid: str) -> None:
        pass

    def mark_invalid(self, rid: str) -> None:
        self.invalidated += 1
        self.installed.clear()
        if self.clock is not None:
            self.invalidated_at = self.clock.now()


class Worker:
    """Runs ``fn`` on a thread; ``result`` joins it and returns its value (or re-raises)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._out: list[Any] = []
        self._err: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._out.append(fn())
        except BaseException as e:  # handed to result()
            self._err.append(e)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def result(self, timeout_s: float = 10.0) -> Any:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"worker still running after {timeout_s}s")
        if self._err:
            raise self._err[0]
        return self._out[0]


def step(clock: VirtualClock, *times: float) -> None:
    """For each time: wait until the one worker blocks on the clock, then move time there."""
    for t in times:
        clock.settle(1)
        clock.advance_to(t)
