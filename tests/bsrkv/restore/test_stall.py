"""The stall watch in virtual time: a stall is one clock step longer than the tick."""

from __future__ import annotations

from bsrkv.clock import VirtualClock
from bsrkv.restore import StallWatch


def test_gaps_above_the_threshold_are_remembered_with_their_exact_length() -> None:
    clock = VirtualClock()
    w = StallWatch(clock, tick_s=0.125, keep_above_s=0.5)
    for _ in range(4):
        clock.advance(0.125)
        w.tick()
    assert w.max_gap_since(0.0) == 0.0  # regular ticks: no gap kept, none ongoing
    clock.advance(6.0)  # the process did not run for 6 s
    assert w.max_gap_since(0.0) == 6.0  # ongoing
    w.tick()  # ended at 6.5
    clock.advance(0.125)
    w.tick()
    assert w.max_gap_since(6.25) == 6.0 and w.max_gap_since(6.5) == 0.0


def test_the_guard_refuses_from_exactly_the_limit_and_counts_trips() -> None:
    clock = VirtualClock(start_s=100.0)
    w = StallWatch(clock)
    trips: list[int] = []
    guard = w.guard(5.0, on_trip=lambda: trips.append(1))  # a retrieve begins at 100 s
    clock.advance(4.875)  # the ticker has not run for 4.875 s: below the limit
    assert guard() == "" and trips == []
    clock.advance(0.125)
    assert guard() == (
        "the server stalled 5.0s during this retrieve (>= stall_guard_s=5.0): "
        "the engine may have declared it unhealthy and be recomputing"
    )
    assert trips == [1]
    assert w.guard(0.0)() == ""  # 0 = off


def test_a_stall_before_the_retrieve_counts_within_the_lookback_only() -> None:
    clock = VirtualClock()
    w = StallWatch(clock)
    clock.advance(8.0)
    w.tick()  # an 8 s stall ended at 8 s
    clock.advance(0.0625)
    w.tick()
    assert w.guard(5.0, since_s=20.0, lookback_s=15.0)() != ""  # ended after 5 s
    assert w.guard(5.0, since_s=24.0, lookback_s=15.0)() == ""  # ended before 9 s


def test_the_ticker_thread_sees_a_stall_in_virtual_time() -> None:
    clock = VirtualClock()
    w = StallWatch(clock, tick_s=0.125).start()
    try:
        for _ in range(3):
            clock.settle(1)  # the ticker waits for its next tick
            clock.advance(0.125)
        clock.settle(1)
        assert w.max_gap_since(0.0) == 0.0
        clock.advance(6.0)  # one step of 6 s: the ticker wakes 5.875 s late
        clock.settle(1)  # it ticked (and recorded the gap) and waits again
        clock.advance(0.125)
        clock.settle(1)
        assert w.max_gap_since(0.0) == 6.0 and w.max_gap_since(6.375) == 0.0
    finally:
        w.stop()
    assert w._thread is not None and not w._thread.is_alive()
