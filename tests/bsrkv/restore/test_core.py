"""The core alone: plan composition, windows, budget, gauge, markers, exact traces.

The storage here is an in-memory fake that records every call, so traces are exact.
Timeouts and the retrieve deadline, in virtual time, are in test_timeouts.py.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from bsrkv.clock import VirtualClock
from bsrkv.restore import (
    AdmissionBudget,
    BoundedRestorer,
    EventKind,
    FailureKind,
    ForceLocalMarkers,
    MarkerState,
    RestoreConfig,
    RestoreConfigError,
    RestorePoolGauge,
    RestoreState,
    RowId,
    Window,
    complete_prefix,
    confirm_plan,
    split_windows,
)

from .fakes import ROWS, FakeDest, FakeStorage, Worker, request

# ---- plan ---------------------------------------------------------------------------------


def test_complete_prefix_is_the_longest_prefix_every_row_hits() -> None:
    assert complete_prefix([[True, True, False, True], [True, True, True, True]], 4) == 2
    assert complete_prefix([[True] * 3], 3) == 3
    assert complete_prefix([], 3) == 0


def test_one_invalid_row_collapses_the_whole_prefix() -> None:
    req = request(8)
    full = [[True] * 8 for _ in ROWS]
    assert confirm_plan(req, full).prefix_chunks == 8
    plan = confirm_plan(req, full, invalid_rows={RowId(1, 1)})
    assert (plan.prefix_chunks, plan.collapsed_rows) == (0, (RowId(1, 1),))
    # a missing row (a rank that did not answer) collapses it too
    assert confirm_plan(req, full[:3]).prefix_chunks == 0
    assert confirm_plan(req, full[:3]).collapsed_rows == (RowId(1, 1),)
    # a row of the wrong length is invalid
    assert confirm_plan(req, [*full[:3], [True] * 7]).prefix_chunks == 0
    assert confirm_plan(req, full, forced_local=True).prefix_chunks == 0


def test_a_row_missing_chunk_zero_gives_prefix_zero() -> None:
    bitmaps = [[True] * 8 for _ in ROWS]
    bitmaps[3][0] = False
    assert confirm_plan(request(8), bitmaps).prefix_chunks == 0


def test_split_windows_covers_the_prefix_in_order() -> None:
    assert split_windows(7, 3) == (Window(0, 0, 3), Window(1, 3, 6), Window(2, 6, 7))
    assert split_windows(7, 0) == (Window(0, 0, 7),)
    assert split_windows(0, 4) == ()


# ---- config / budget / gauge / markers --------------------------------------------------------


def test_config_rejects_a_budget_below_the_window() -> None:
    with pytest.raises(
        RestoreConfigError, match="admission_budget_chunks=3 is below window_chunks=4"
    ):
        RestoreConfig(window_chunks=4, admission_budget_chunks=3)
    assert issubclass(RestoreConfigError, ValueError)
    assert RestoreConfig(window_chunks=4).budget_chunks == 4
    assert RestoreConfig(window_chunks=4, admission_budget_chunks=7).pipeline_depth == 1
    assert RestoreConfig(window_chunks=4, admission_budget_chunks=8).pipeline_depth == 2


def test_budget_is_fifo_and_try_acquire_never_jumps_the_queue() -> None:
    clock = VirtualClock()
    b = AdmissionBudget(4, clock)
    assert b.try_acquire(3)
    waiter = Worker(lambda: b.acquire(4))
    clock.settle(1)  # the waiter is queued and blocked
    assert not b.try_acquire(1)  # fits (3 + 1 <= 4) but someone is queued
    b.release(3)
    assert waiter.result() is True
    assert b.in_use_chunks == 4 and b.peak_in_use_chunks == 4
    assert not b.acquire(1, timeout_s=0.0)  # full, no time to wait: refused at once
    with pytest.raises(RestoreConfigError, match="cannot be admitted under a budget of 4"):
        b.try_acquire(5)
    with pytest.raises(RestoreConfigError, match="admission_budget_chunks must be >= 1, got 0"):
        AdmissionBudget(0)


def test_gauge_high_water_per_rank_and_reset() -> None:
    g = RestorePoolGauge()
    g.add({0: 10, 1: 5})
    g.add({0: 10})
    g.remove({0: 20, 1: 5})
    assert g.peak_bytes() == {0: 20, 1: 5} and g.level_bytes() == {0: 0, 1: 0}
    g.reset()
    assert g.peak_bytes() == {0: 0, 1: 0} and g.peak_max_bytes() == 0


def test_marker_lifecycle() -> None:
    m = ForceLocalMarkers()
    assert m.state("a") == MarkerState.CLEAR and m.record("a") is None
    m.set("a", "TIMEOUT")
    assert m.state("a") == MarkerState.FORCED and m.record("a").reason == "TIMEOUT"
    m.on_admitted("a")
    assert m.state("a") == MarkerState.CLEAR
    m.set("a", "x")
    m.on_teardown("a")
    assert len(m) == 0


# ---- restorer traces -------------------------------------------------------------------------


def kinds(outcome: Any) -> list[tuple[str, int]]:
    return [(e.kind.name, e.window) for e in outcome.events]


def test_paper_mode_runs_one_window_at_a_time_in_order() -> None:
    st, dest = FakeStorage(), FakeDest()
    r = BoundedRestorer(st, RestoreConfig(window_chunks=2))
    out = r.restore(r.probe(request(5)), dest)
    assert out.ok and out.cached_chunks == 5 and out.windows_done == 3
    assert kinds(out) == [
        *[(k, j) for j in range(3) for k in ("ADMIT", "STAGE", "READY", "INSTALL", "RELEASE")],
        ("COMMIT", -1),
    ]
    assert st.calls == [(c, j) for j in range(3) for c in ("stage", "wait", "release")]
    assert out.peak_staged_bytes_by_rank == {0: 2 * 200, 1: 2 * 200}
    assert len(dest.installed) == 5 * 4 and r.budget is not None and r.budget.in_use_chunks == 0


def test_pipelined_mode_stages_the_next_window_before_installing_this_one() -> None:
    st, dest = FakeStorage(), FakeDest()
    r = BoundedRestorer(st, RestoreConfig(window_chunks=2, admission_budget_chunks=4))
    out = r.restore(r.probe(request(6)), dest)
    assert out.ok and out.cached_chunks == 6
    assert st.calls == [
        ("stage", 0),
        ("stage", 1),
        ("wait", 0),
        ("release", 0),
        ("stage", 2),
        ("wait", 1),
        ("release", 1),
        ("wait", 2),
        ("release", 2),
    ]
    assert out.peak_staged_bytes_by_rank == {0: 4 * 200, 1: 4 * 200}
    assert r.gauge.peak_bytes() == {0: 800, 1: 800} and r.gauge.level_bytes() == {0: 0, 1: 0}


@pytest.mark.parametrize(
    ("missing", "timeouts", "fail_install", "kind"),
    [
        ({"1/1/4"}, set(), -1, FailureKind.MISSING_KEY),
        (set(), {2}, -1, FailureKind.TIMEOUT),
        (set(), set(), 1, FailureKind.INSTALL_ERROR),
    ],
)
def test_any_window_failure_fails_closed(missing, timeouts, fail_install, kind) -> None:
    st = FakeStorage(timeout_windows=timeouts)
    dest = FakeDest(fail_install)
    r = BoundedRestorer(st, RestoreConfig(window_chunks=2, admission_budget_chunks=4))
    plan = r.probe(request(7, "req-f"))
    st.missing = missing  # disappears after the probe, before the restore
    out = r.restore(plan, dest)
    assert (out.state, out.failure, out.cached_chunks) == (RestoreState.FAILED, kind, 0)
    assert dest.invalidated == 1 and dest.installed == []
    assert st.live == set() and r.gauge.level_bytes() == {0: 0, 1: 0}
    assert r.budget is not None and r.budget.in_use_chunks == 0
    assert out.events[-1].kind == EventKind.FAIL
    # force-local: the next admission pass of the same request sees 0 external tokens
    assert r.markers.state("req-f") == MarkerState.FORCED
    assert r.probe(request(7, "req-f")).prefix_chunks == 0
    r.on_admitted("req-f")
    st.missing = set()
    assert r.probe(request(7, "req-f")).prefix_chunks == 7


def test_whole_plan_exposes_the_hit_prefix_it_got() -> None:
    st = FakeStorage()
    r = BoundedRestorer(st, RestoreConfig(window_chunks=0))
    plan = r.probe(request(6))
    st.missing = {"0/1/4"}
    out = r.restore(plan, FakeDest())
    assert out.ok and out.cached_chunks == 4 and out.budget_chunks == 0
    assert st.calls == [("stage", 0), ("wait", 0), ("release", 0)]


def test_concurrent_requests_never_exceed_the_budget() -> None:
    st = FakeStorage()
    r = BoundedRestorer(st, RestoreConfig(window_chunks=2, admission_budget_chunks=5))
    outs = []
    threads = [
        threading.Thread(
            target=lambda i=i: outs.append(r.restore(r.probe(request(9, f"q{i}")), FakeDest()))
        )
        for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(outs) == 4 and all(o.ok and o.cached_chunks == 9 for o in outs)
    assert r.budget is not None and r.budget.peak_in_use_chunks <= 5
    assert r.gauge.peak_max_bytes() <= 5 * 200 and r.gauge.level_bytes() == {0: 0, 1: 0}
