"""The install read-back in the pure core, in virtual time: each installed window is read
back from its destination before its staging is released, its cost is measured on the
restorer's clock, and a mismatch (or a read-back that raises) fails the restore closed."""

from __future__ import annotations

import threading
from typing import Any

from bsrkv.clock import VirtualClock
from bsrkv.restore import (
    BoundedRestorer,
    EventKind,
    FailureKind,
    ReadbackResult,
    RestoreConfig,
    RestoreState,
    RowId,
    Window,
)

from .fakes import ClockStorage, FakeDest, Worker, request, step


class ReadbackDest(FakeDest):
    """Installs as FakeDest; a read-back takes ``readback_s`` of clock time, compares what
    it installed with the staged objects, and can be told to corrupt one slice first."""

    def __init__(self, clock: VirtualClock, readback_s: float, corrupt: tuple[int, int] = (-1, 0)):
        super().__init__(clock=clock)
        self.readback_s = readback_s
        self.corrupt_window, self.corrupt_chunk = corrupt
        self.slices: dict[tuple[RowId, int], str] = {}  # (row, chunk) -> what it holds
        self.read_backs: list[tuple[int, float, int]] = []  # (window, at, staged live)
        self.raise_in: int = -1
        self.storage: ClockStorage | None = None
        self.cv = threading.Condition()

    def install(self, rid: str, w: Window, objects: Any, n: int) -> int:
        for row, objs in objects.items():
            for i, o in enumerate(objs[:n]):
                self.slices[(row, w.chunk_start + i)] = o
        if w.index == self.corrupt_window:  # one byte of the destination changed after install
            row = sorted(objects)[0]
            key = (row, w.chunk_start + self.corrupt_chunk)
            self.slices[key] = self.slices[key] + "\x00"
        return super().install(rid, w, objects, n)

    def read_back(self, rid: str, w: Window, objects: Any, n: int) -> ReadbackResult:
        assert self.clock is not None and self.storage is not None
        self.read_backs.append((w.index, self.clock.now(), len(self.storage.live)))
        with self.cv:  # the copies back and the digests take readback_s
            until = self.clock.now() + self.readback_s
            while self.clock.now() < until:
                self.clock.wait_until(self.cv, until)
        if w.index == self.raise_in:
            raise RuntimeError("device lost")
        bad = tuple(
            (row, w.chunk_start + i)
            for row in sorted(objects)
            for i, o in enumerate(objects[row][:n])
            if self.slices[(row, w.chunk_start + i)] != o
        )
        return ReadbackResult(n * len(objects), bad, scratch_bytes=400)


def _run(clock: VirtualClock, dest: ReadbackDest, readback: bool, *times: float):
    st = ClockStorage(clock, ready_s=1.0)
    dest.storage = st
    cfg = RestoreConfig(window_chunks=2, admission_budget_chunks=2, readback=readback)
    r = BoundedRestorer(st, cfg, clock=clock)
    plan = r.probe(request(4))
    worker = Worker(lambda: r.restore(plan, dest))
    step(clock, *times)
    return worker.result(), st, r


def test_each_window_is_read_back_before_its_release_and_its_cost_is_measured() -> None:
    clock = VirtualClock()
    dest = ReadbackDest(clock, readback_s=0.25)
    # window 0: ready at 1.0, read back 1.0..1.25; window 1 staged at 1.25, ready 2.25,
    # read back 2.25..2.5
    out, st, _ = _run(clock, dest, True, 1.0, 1.25, 2.25, 2.5)
    assert out.ok and out.cached_chunks == 4
    assert dest.read_backs == [(0, 1.0, 1), (1, 2.25, 1)]  # while the window is still staged
    assert st.live == set()
    kinds = [(e.kind, e.window) for e in out.events]
    assert kinds == [
        (EventKind.ADMIT, 0), (EventKind.STAGE, 0), (EventKind.READY, 0),
        (EventKind.INSTALL, 0), (EventKind.READBACK, 0), (EventKind.RELEASE, 0),
        (EventKind.ADMIT, 1), (EventKind.STAGE, 1), (EventKind.READY, 1),
        (EventKind.INSTALL, 1), (EventKind.READBACK, 1), (EventKind.RELEASE, 1),
        (EventKind.COMMIT, -1),
    ]  # fmt: skip
    assert out.readback is not None
    assert out.readback.to_json() == {
        "windows_checked": 2,
        "chunks_checked": 16,
        "chunks_unchecked": 0,
        "mismatches": 0,
        "seconds": 0.5,
        "scratch_bytes": 400,
    }
    assert [t.readback_s for t in out.timings] == [0.25, 0.25]
    assert out.timings[0].to_json()["readback_s"] == 0.25


def test_one_corrupted_slice_fails_the_restore_closed_at_its_window() -> None:
    clock = VirtualClock()
    dest = ReadbackDest(clock, readback_s=0.25, corrupt=(1, 1))  # window 1, its 2nd chunk
    out, st, r = _run(clock, dest, True, 1.0, 1.25, 2.25, 2.5)
    assert (out.state, out.failure, out.cached_chunks, out.windows_done) == (
        RestoreState.FAILED,
        FailureKind.READBACK_MISMATCH,
        0,
        1,
    )
    assert out.detail == (
        "window 1 (chunks 2..4): 1 of 8 object(s) read back differ from the staged bytes, "
        "first ['rank 0 group 0 chunk 3']"
    )
    assert dest.invalidated == 1 and st.live == set()
    assert r.budget is not None and r.budget.in_use_chunks == 0
    assert out.readback is not None
    assert (out.readback.windows_checked, out.readback.mismatches) == (2, 1)
    assert out.events[-1].kind == EventKind.FAIL
    assert EventKind.READBACK not in {e.kind for e in out.events if e.window == 1}


def test_a_read_back_that_raises_fails_closed_too() -> None:
    clock = VirtualClock()
    dest = ReadbackDest(clock, readback_s=0.125)
    dest.raise_in = 0
    out, st, _ = _run(clock, dest, True, 1.0, 1.125)
    assert (out.failure, out.windows_done) == (FailureKind.READBACK_MISMATCH, 0)
    assert out.detail == "window 0: read-back raised RuntimeError('device lost')"
    assert out.readback is not None and out.readback.seconds == 0.125
    assert out.readback.windows_checked == 0 and st.live == set()


def test_read_back_off_or_a_destination_without_it_changes_nothing() -> None:
    clock = VirtualClock()
    dest = ReadbackDest(clock, readback_s=0.25, corrupt=(0, 0))
    out, _, _ = _run(clock, dest, False, 1.0, 2.0)
    assert out.ok and out.readback is None and dest.read_backs == []
    assert [t.readback_s for t in out.timings] == [None, None]
    assert "readback_s" not in out.timings[0].to_json()
    clock = VirtualClock()
    plain = FakeDest(clock=clock)  # no read_back: the core cannot read it back
    st = ClockStorage(clock, ready_s=1.0)
    r = BoundedRestorer(st, RestoreConfig(window_chunks=2, readback=True), clock=clock)
    plan = r.probe(request(4))
    worker = Worker(lambda: r.restore(plan, plain))
    step(clock, 1.0, 2.0)
    out = worker.result()
    assert out.ok and out.readback is None
