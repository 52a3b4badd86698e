"""The soak's schedule: exact values for seed 1, replay, and only real, repeatable injectors."""

import pytest

from bsrctl.experiments.failmatrix.injectors import INJECTORS
from bsrctl.experiments.soak.schedule import REPEATABLE, ScheduledFault, make_schedule


def test_seed_1_for_30_s_is_exactly_this_schedule() -> None:
    assert make_schedule(1, 30.0).faults == (
        ScheduledFault(0, 1.443, "window_timeout", 1, 0),
        ScheduledFault(1, 8.283, "object_corrupted", 1, 2),
        ScheduledFault(2, 13.058, "window_timeout", 0, 1),
        ScheduledFault(3, 13.345, "object_corrupted", 1, 2),
        ScheduledFault(4, 27.712, "window_timeout", 1, 1),
    )


def test_same_seed_same_schedule_other_seed_other() -> None:
    assert make_schedule(1, 180.0) == make_schedule(1, 180.0)
    assert len(make_schedule(1, 180.0).faults) == 14
    assert make_schedule(2, 180.0).faults != make_schedule(1, 180.0).faults


def test_every_drawn_fault_is_a_failure_matrix_injector() -> None:
    assert set(REPEATABLE) <= set(INJECTORS)
    assert REPEATABLE == ("window_timeout", "object_corrupted", "object_truncated")


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        make_schedule(1, 0.0)
