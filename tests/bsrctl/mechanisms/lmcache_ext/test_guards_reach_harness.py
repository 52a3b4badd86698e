"""The LMCache server's threads that run under a guard of their own (the fault adapter's
pump, TempoKV's loop) keep running through a failing pass, and the failure reaches the
harness: the process's counts (what ``bsr.status`` reports) move by exactly that pass, and a
cell's ``extensions_healthy`` FAILs naming the guard, the site, the type and the count."""

from __future__ import annotations

import threading

import test_fault_adapter_unit as fault_unit

from bsrctl.evidence.guards import GuardCounts, GuardDelta, extensions_healthy
from bsrctl.stack.contracts.guards import LMCACHE
from bsrkv.hostguard import process_failures
from bsrkv.tempokv.claims import ClaimState
from tests.bsrctl.mechanisms.lmcache_ext import test_tempokv_live as tempo_live

make, sm = fault_unit.make, tempo_live.sm  # their fixtures
keys, result, submit = fault_unit.keys, fault_unit.result, fault_unit.submit
in_l2, live, objects = tempo_live.in_l2, tempo_live.live, tempo_live.objects
state, until = tempo_live.state, tempo_live.until


def test_a_failing_pump_pass_reaches_the_harness_by_name(make) -> None:
    """The pump's guard keeps the pump alive and counts the pass; the server's
    ``bsr.status`` reports it (``hostguard.process_failures``) and the cell's
    ``extensions_healthy`` FAILs naming the pump, the exception type and the count."""
    adapter, _inner = make("pump-fails")
    before = GuardCounts({(g, s, t): n for g, s, t, n in process_failures()})
    real, failed = adapter._release_due, threading.Event()

    def once() -> None:  # the pass does its work, then fails, once
        real()
        if not failed.is_set():
            failed.set()
            raise RuntimeError("pump broke")

    adapter._release_due = once  # type: ignore[method-assign]
    assert result(adapter, "lookup", submit(adapter, "lookup", keys(1))) == [0]
    assert failed.wait(3.0)
    # the pump went on: a later task completes on a later pass
    assert result(adapter, "lookup", submit(adapter, "lookup", keys(1, "after"))) == [0]
    after = GuardCounts({(g, s, t): n for g, s, t, n in process_failures()})
    c = extensions_healthy([GuardDelta.over(LMCACHE, before, after)])
    assert (c.verdict, c.detail) == (
        "FAIL",
        "extension degraded to stock: LMCache server: bsrkv.lmcache_ext.faults "
        "[pump 'pump-fails'] RuntimeError x1",
    )


def test_a_failing_loop_pass_reaches_the_harness_by_name(sm) -> None:
    """TempoKV's loop survives a pass that raises (its guard counts it once); the server's
    counts carry it to the cell's ``extensions_healthy``, which FAILs naming the loop."""
    t = live(sm, "immediate", budget_chunks=4)
    try:
        before = GuardCounts({(g, s, k): n for g, s, k, n in process_failures()})
        real, calls = t.step, []

        def once() -> None:
            real()
            if not calls:
                calls.append(1)
                raise KeyError("renamed")

        t.step = once  # type: ignore[method-assign]
        until(lambda: calls)
        a = in_l2(sm, 2, "loop")
        t.report("A", objects(a))  # the loop still runs: the claim is staged
        until(lambda: state(t, "A") is ClaimState.STAGEREADY)
        after = GuardCounts({(g, s, k): n for g, s, k, n in process_failures()})
    finally:
        t.close()
    c = extensions_healthy([GuardDelta.over(LMCACHE, before, after)])
    assert (c.verdict, c.detail) == (
        "FAIL",
        "extension degraded to stock: LMCache server: bsrkv.lmcache_ext.tempokv "
        "[tempokv_loop] KeyError x1",
    )
