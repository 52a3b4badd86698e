"""The one device schedule (``tempokv.schedule``) behind the simulated staging device, the
shaped L2 and the live progress estimate: processor sharing with contention to the byte and
second, slots and a FIFO queue, per-op latency, and its event form equal to the shaped L2's
closed form where both apply."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bsrkv.tempokv.schedule import DeviceShape, ShapingSchedule


def test_ops_in_service_share_one_aggregate_that_falls_with_contention():
    # 10 B/s alone; two moving: 10/(1 + 0.25) = 8 B/s, 4 each
    s = ShapingSchedule(DeviceShape(10.0), slots=None, contention=0.25)
    s.start(0, 0.0, 20)
    assert s.next_event_s() == 2.0
    assert s.advance(1.0) == [] and s.remaining_bytes(0, 1.0) == 10
    s.start(1, 1.0, 15)
    assert s.aggregate_bytes_s(2) == 8.0
    assert (s.remaining_bytes(0, 2.0), s.remaining_bytes(1, 2.0)) == (6, 11)
    assert s.next_event_s() == 3.5  # op 0's last 10 B at 4 B/s
    assert s.advance(3.5) == [0] and s.remaining_bytes(1, 3.5) == 5
    assert s.next_event_s() == 4.0  # alone again: 5 B at 10 B/s
    assert s.advance(10.0) == [1] and s.next_event_s() is None
    assert s.remaining_bytes(1, 10.0) == 0  # not on the device


def test_slots_queue_ops_first_come_first_served_and_a_drop_frees_one():
    s = ShapingSchedule(DeviceShape(10.0), slots=2)
    for op_id in (0, 1, 2):
        s.start(op_id, 0.0, 10)
    assert s.in_service() == 2 and s.remaining_bytes(2, 0.5) == 10  # waits for a slot
    assert (s.remaining_bytes(0, 0.5), s.remaining_bytes(1, 0.5)) == (7, 7)  # 5 B/s each
    s.drop(1, 0.5)  # ended elsewhere: op 2 takes its slot now
    assert s.in_service() == 2
    assert (s.remaining_bytes(0, 1.0), s.remaining_bytes(2, 1.0)) == (5, 7)
    assert s.advance(2.0) == [0] and s.remaining_bytes(2, 2.0) == 2
    assert s.advance(3.0) == [2]


def test_each_op_pays_its_latency_holding_its_slot():
    s = ShapingSchedule(DeviceShape(10.0, latency_s=0.5), slots=1)
    s.start(0, 0.0, 10)
    s.start(1, 0.0, 10)
    assert s.next_event_s() == 0.5  # op 0's latency ends
    assert s.advance(1.0) == [] and s.remaining_bytes(0, 1.0) == 5
    assert (s.advance(1.5), s.remaining_bytes(1, 1.5)) == ([0], 10)  # in its latency
    assert s.advance(2.0) == [] and s.remaining_bytes(1, 2.5) == 5
    assert s.advance(3.0) == [1]


def test_the_closed_form_is_one_slot_without_contention():
    with pytest.raises(ValueError, match="one slot without contention"):
        ShapingSchedule(DeviceShape(1.0), slots=None).admit(0.0, 1)
    with pytest.raises(ValueError, match="one slot without contention"):
        ShapingSchedule(DeviceShape(1.0), contention=0.1).admit(0.0, 1)


@given(
    st.floats(1.0, 1e10),
    st.floats(0.0, 1.0),
    st.lists(st.tuples(st.floats(0.0, 10.0), st.integers(2, 1 << 30)), min_size=1, max_size=20),
)
def test_events_on_one_slot_end_where_the_shaped_l2s_closed_form_does(bw, lat, ops):
    """The wrapper's ``admit`` and the event form (the live estimate's, the sim's) are one
    schedule: every op ends at the instant ``admit`` gave it, in submission order."""
    closed, events = ShapingSchedule(DeviceShape(bw, lat)), ShapingSchedule(DeviceShape(bw, lat))
    want: list[float] = []
    ended: list[tuple[int, float]] = []

    def run_to(limit: float | None) -> None:
        while (at_s := events.next_event_s()) is not None and (limit is None or at_s <= limit):
            ended.extend((op_id, at_s) for op_id in events.advance(at_s))

    t = 0.0
    for op_id, (gap, size) in enumerate(ops):
        t += gap
        run_to(t)
        events.start(op_id, t, size)
        want.append(closed.admit(t, size).done_s)
    run_to(None)
    assert [op_id for op_id, _ in ended] == list(range(len(ops)))
    for (_, at_s), done_s in zip(ended, want, strict=True):
        assert at_s == pytest.approx(done_s, rel=1e-9, abs=1e-9)
