"""The one clock API: event order (TempoKV) and thread waits (the BSR core), virtual and wall."""

import threading

import pytest

from bsrkv.clock import VirtualClock, WallClock


def _schedule(clock, seen):
    clock.call_at(0.002, lambda: seen.append("b"))
    clock.call_at(0.001, lambda: seen.append("a"))
    clock.call_at(0.002, lambda: seen.append("c"))  # same time as b: scheduled later, runs later
    t = clock.call_at(0.001, lambda: seen.append("x"))
    t.cancel()


def test_virtual_clock_orders_by_time_then_schedule_order():
    clock, seen = VirtualClock(), []
    _schedule(clock, seen)
    clock.run()
    assert seen == ["a", "b", "c"]
    assert clock.now() == 0.002


def test_wall_clock_has_the_same_order():
    clock, seen = WallClock(), []
    _schedule(clock, seen)
    clock.run()
    assert seen == ["a", "b", "c"]


def test_run_until_stops_and_advances():
    clock, seen = VirtualClock(), []
    clock.call_at(5.0, lambda: seen.append(5))
    clock.run(until_s=1.0)
    assert seen == [] and clock.now() == 1.0


# ---- threads: what the BSR core waits with ----------------------------------------------


def _waiter(clock, cond, timeout_s):
    """A thread that waits on ``cond`` for ``timeout_s`` of clock time; result: (notified, t)."""
    out = []

    def run():
        with cond:
            notified = clock.wait(cond, timeout_s)
        out.append((notified, clock.now()))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_a_virtual_wait_times_out_at_exactly_its_deadline():
    clock, cond = VirtualClock(start_s=1.0), threading.Condition()
    t, out = _waiter(clock, cond, 2.0)
    clock.settle(1)
    clock.advance_to(2.875)  # not yet: nothing wakes it
    clock.settle(1)
    assert t.is_alive() and out == [] and clock.waiting() == 1
    clock.advance_to(3.0)
    t.join(10)
    assert out == [(False, 3.0)] and clock.waiting() == 0


def test_a_virtual_wait_notified_before_its_deadline_returns_true():
    clock, cond = VirtualClock(), threading.Condition()
    t, out = _waiter(clock, cond, 60.0)
    clock.settle(1)
    clock.advance(0.5)
    with cond:
        cond.notify_all()
    t.join(10)
    assert out == [(True, 0.5)]


def test_a_virtual_sleep_ends_when_time_reaches_it_and_events_still_fire():
    clock, seen = VirtualClock(), []
    clock.call_at(1.0, lambda: seen.append(("event", clock.now())))
    t = threading.Thread(target=lambda: (clock.sleep(2.5), seen.append(("woke", clock.now()))))
    t.start()
    clock.settle(1)
    clock.run(until_s=2.0)
    clock.settle(1)
    assert seen == [("event", 1.0)] and t.is_alive()
    clock.advance(0.5)
    t.join(10)
    assert seen == [("event", 1.0), ("woke", 2.5)]


def test_a_wait_with_no_time_left_returns_at_once():
    clock, cond = VirtualClock(start_s=4.0), threading.Condition()
    with cond:
        assert clock.wait(cond, 0.0) is False
        assert clock.wait_until(cond, 3.0) is False
    with pytest.raises(TimeoutError, match="0 of 1 thread"):
        clock.settle(1, timeout_s=0.0)
    wall = WallClock()
    with cond:
        assert wall.wait_until(cond, wall.now() - 1.0) is False
