from bsrctl.tempokv.clocks import VirtualClock, WallClock


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
