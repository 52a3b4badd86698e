"""Window timeout, admission timeout and retrieve deadline, in virtual time.

The restore runs on a worker thread; the test moves a ``VirtualClock`` only while the worker
is blocked on it (``settle``), so each timeout fires at an exact virtual time and nothing
waits in real time. Just before that time the worker is provably still waiting (nothing
has woken it); at that time the retrieve fails closed, and the destination notes when.
"""

from __future__ import annotations

import pytest

from bsrkv.clock import VirtualClock
from bsrkv.restore import (
    AdmissionBudget,
    BoundedRestorer,
    FailureKind,
    RestoreConfig,
    RestoreConfigError,
    RestoreState,
)

from .fakes import ClockStorage, FakeDest, Worker, request, step


def _closed(out, r: BoundedRestorer, st: ClockStorage, dest: FakeDest) -> None:
    """Failed closed: nothing staged, nothing held, every block invalid."""
    assert out.cached_chunks == 0 and dest.invalidated == 1 and dest.installed == []
    assert st.live == set() and set(r.gauge.level_bytes().values()) <= {0}
    assert r.budget is not None and r.budget.in_use_chunks == 0


def test_a_window_timeout_fires_at_exactly_window_timeout_s() -> None:
    clock = VirtualClock()
    st, dest = ClockStorage(clock, ready_s=None), FakeDest(clock=clock)  # never complete
    r = BoundedRestorer(st, RestoreConfig(window_chunks=2, window_timeout_s=30.0), clock=clock)
    plan = r.probe(request(4))
    worker = Worker(lambda: r.restore(plan, dest))
    step(clock, 29.875)
    clock.settle(1)
    assert worker.running and dest.invalidated_at is None
    clock.advance_to(30.0)
    out = worker.result()
    assert (out.state, out.failure, out.windows_done) == (
        RestoreState.FAILED,
        FailureKind.TIMEOUT,
        0,
    )
    assert out.detail == "window 0 (chunks 0..2) not complete within 30.0s"
    assert dest.invalidated_at == 30.0 and st.timeouts == [30.0]
    _closed(out, r, st, dest)


def test_a_later_window_gets_its_own_full_timeout() -> None:
    # Window 0 is complete at 10 s; window 1, staged then, never is: it times out 30 s
    # after its own wait began, at 40 s, not 30 s after the retrieve began.
    clock = VirtualClock()
    st, dest = ClockStorage(clock, ready_s=10.0, never={1}), FakeDest(clock=clock)
    r = BoundedRestorer(st, RestoreConfig(window_chunks=2, window_timeout_s=30.0), clock=clock)
    plan = r.probe(request(4))
    worker = Worker(lambda: r.restore(plan, dest))
    step(clock, 10.0, 39.875)
    clock.settle(1)
    assert worker.running and st.timeouts == [30.0, 30.0]
    clock.advance_to(40.0)
    out = worker.result()
    assert (out.failure, out.windows_done, dest.invalidated_at) == (FailureKind.TIMEOUT, 1, 40.0)
    assert out.detail == "window 1 (chunks 2..4) not complete within 30.0s"
    _closed(out, r, st, dest)


def test_an_admission_timeout_fires_at_exactly_admission_timeout_s() -> None:
    clock = VirtualClock()
    st, dest = ClockStorage(clock, ready_s=0.0), FakeDest(clock=clock)
    cfg = RestoreConfig(window_chunks=2, admission_timeout_s=120.0)
    r = BoundedRestorer(st, cfg, clock=clock)
    assert r.budget is not None and r.budget.try_acquire(2)  # another request holds B = W
    plan = r.probe(request(4))
    worker = Worker(lambda: r.restore(plan, dest))
    step(clock, 119.875)
    clock.settle(1)
    assert worker.running and st.calls == []
    clock.advance_to(120.0)
    out = worker.result()
    assert (out.failure, out.windows_done) == (FailureKind.ADMISSION_TIMEOUT, 0)
    assert out.detail == "window 0 (2 chunks) not admitted within 120.0s under B=2"
    assert dest.invalidated_at == 120.0 and st.calls == []  # nothing was staged
    r.budget.release(2)
    _closed(out, r, st, dest)


def test_a_queued_admission_is_granted_when_the_budget_is_released() -> None:
    clock = VirtualClock()
    b = AdmissionBudget(2, clock)
    assert b.try_acquire(2)
    waiter = Worker(lambda: (b.acquire(2, timeout_s=120.0), clock.now()))
    step(clock, 50.0)
    b.release(2)  # at 50 s: the waiter takes the budget then, well before its timeout
    assert waiter.result() == (True, 50.0) and b.in_use_chunks == 2


def test_the_budget_alone_times_out_at_its_exact_deadline() -> None:
    clock = VirtualClock(start_s=7.0)
    b = AdmissionBudget(4, clock)
    assert b.try_acquire(4)
    waiter = Worker(lambda: (b.acquire(1, timeout_s=0.25), clock.now()))
    step(clock, 7.125)
    clock.settle(1)
    assert waiter.running
    clock.advance_to(7.25)
    assert waiter.result() == (False, 7.25) and b.in_use_chunks == 4


@pytest.mark.parametrize(
    ("ready_s", "steps", "timeouts", "windows_done"),
    [(10.0, (10.0, 20.0), [25.0, 15.0, 5.0], 2), (30.0, (), [25.0], 0)],
)
def test_the_whole_retrieve_has_a_deadline(ready_s, steps, timeouts, windows_done) -> None:
    # Windows of 2 chunks, each 10 s to complete, deadline 25 s: windows 0 and 1 install
    # (waits capped at 25 and 15 s), window 2's wait is capped at the 5 s left and the
    # retrieve fails closed with DEADLINE at exactly 25 s, not after three 30 s window
    # timeouts. One 30 s window: the 25 s cap runs out first, at 25 s too.
    clock = VirtualClock()
    st, dest = ClockStorage(clock, ready_s), FakeDest(clock=clock)
    cfg = RestoreConfig(window_chunks=2, retrieve_deadline_s=25.0)
    r = BoundedRestorer(st, cfg, clock=clock)
    worker = Worker(lambda: r.restore(r.probe(request(6)), dest))
    step(clock, *steps, 24.875)
    clock.settle(1)
    assert worker.running and dest.invalidated_at is None
    clock.advance_to(25.0)
    out = worker.result()
    assert (out.state, out.failure, out.windows_done) == (
        RestoreState.FAILED,
        FailureKind.DEADLINE,
        windows_done,
    )
    assert st.timeouts == timeouts and dest.invalidated_at == 25.0
    assert out.detail == (
        f"retrieve deadline 25.0s passed before window {windows_done} was complete "
        f"({windows_done} window(s) done)"
    )
    _closed(out, r, st, dest)


def test_the_deadline_also_caps_an_admission_wait() -> None:
    # Admission timeout 120 s, deadline 25 s: the wait for B is cut at 25 s, as DEADLINE.
    clock = VirtualClock()
    st, dest = ClockStorage(clock, ready_s=0.0), FakeDest(clock=clock)
    cfg = RestoreConfig(window_chunks=2, admission_timeout_s=120.0, retrieve_deadline_s=25.0)
    r = BoundedRestorer(st, cfg, clock=clock)
    assert r.budget is not None and r.budget.try_acquire(2)
    worker = Worker(lambda: r.restore(r.probe(request(4)), dest))
    step(clock, 25.0)
    out = worker.result()
    assert (out.failure, dest.invalidated_at) == (FailureKind.DEADLINE, 25.0)
    assert out.detail == (
        "retrieve deadline 25.0s passed before window 0 was admitted (0 window(s) done)"
    )
    r.budget.release(2)


def test_a_retrieve_within_its_deadline_is_unchanged() -> None:
    clock = VirtualClock()
    st, dest = ClockStorage(clock, ready_s=10.0), FakeDest(clock=clock)
    cfg = RestoreConfig(window_chunks=2, retrieve_deadline_s=35.0)
    r = BoundedRestorer(st, cfg, clock=clock)
    worker = Worker(lambda: r.restore(r.probe(request(6)), dest))
    step(clock, 10.0, 20.0, 30.0)
    out = worker.result()
    assert out.ok and out.cached_chunks == 6 and st.timeouts == [30.0, 25.0, 15.0]
    assert clock.now() == 30.0 and dest.invalidated_at is None


def test_a_negative_deadline_is_refused() -> None:
    with pytest.raises(RestoreConfigError, match="retrieve_deadline_s must be >= 0"):
        RestoreConfig(window_chunks=2, retrieve_deadline_s=-1.0)


# ---- per-window timings (always recorded, on the restorer's clock) --------------------------


def test_window_timings_are_exact_in_virtual_time_paper_mode() -> None:
    # B = W: each window is staged when the previous one is released, complete 10 s later.
    clock = VirtualClock()
    st, dest = ClockStorage(clock, ready_s=10.0), FakeDest(clock=clock)
    r = BoundedRestorer(st, RestoreConfig(window_chunks=2, window_timeout_s=30.0), clock=clock)
    plan = r.probe(request(6))
    worker = Worker(lambda: r.restore(plan, dest))
    step(clock, 10.0, 20.0, 30.0)
    out = worker.result()
    got = [(t.index, t.staged_at_s, t.ready_at_s, t.wait_s, t.fetch_s) for t in out.timings]
    assert got == [
        (0, 0.0, 10.0, 10.0, 10.0),
        (1, 10.0, 20.0, 10.0, 10.0),
        (2, 20.0, 30.0, 10.0, 10.0),
    ]
    assert [(t.installed_at_s, t.released_at_s) for t in out.timings] == [
        (10.0, 10.0),
        (20.0, 20.0),
        (30.0, 30.0),
    ]
    assert out.first_install_s == 10.0
    assert {(t.install_s, t.sync_s, t.admit_wait_s) for t in out.timings} == {(0.0, 0.0, 0.0)}


def test_window_timings_show_what_pipelining_hides() -> None:
    # B = 2W: windows 0 and 1 are staged at 0 s; window 1 is complete at 10 s too, so the
    # restore waits 10 s for window 0 and not at all for window 1; window 2, staged at 10 s
    # when window 0 was released, is complete at 20 s.
    clock = VirtualClock()
    st, dest = ClockStorage(clock, ready_s=10.0), FakeDest(clock=clock)
    cfg = RestoreConfig(window_chunks=2, admission_budget_chunks=4, window_timeout_s=30.0)
    r = BoundedRestorer(st, cfg, clock=clock)
    plan = r.probe(request(6))
    worker = Worker(lambda: r.restore(plan, dest))
    step(clock, 10.0, 20.0)
    out = worker.result()
    got = [(t.index, t.staged_at_s, t.ready_at_s, t.wait_s) for t in out.timings]
    assert got == [(0, 0.0, 10.0, 10.0), (1, 0.0, 10.0, 0.0), (2, 10.0, 20.0, 10.0)]
    assert out.first_install_s == 10.0


def test_a_failed_restore_keeps_the_timings_of_the_windows_it_installed() -> None:
    clock = VirtualClock()
    st, dest = ClockStorage(clock, ready_s=10.0, never={1}), FakeDest(clock=clock)
    r = BoundedRestorer(st, RestoreConfig(window_chunks=2, window_timeout_s=30.0), clock=clock)
    plan = r.probe(request(4))
    worker = Worker(lambda: r.restore(plan, dest))
    step(clock, 10.0, 40.0)
    out = worker.result()
    assert out.failure == FailureKind.TIMEOUT
    assert [(t.index, t.installed_at_s) for t in out.timings] == [(0, 10.0)]
