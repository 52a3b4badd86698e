"""The live runtime adapter's pure half: claims for the first K waiting requests, updates
only on change, cancellation when a claimed request ends, and TTUs equal to the
simulation's projection of the same snapshot (queued loads)."""

from __future__ import annotations

from bsrkv.tempokv.live import (
    AdapterSettings,
    LiveAdapterCore,
    LiveRunning,
    LiveView,
    LiveWaiting,
    StepCalibrator,
)
from bsrkv.tempokv.ttu import (
    CostModel,
    EngineLimits,
    EngineSnapshot,
    QueuedSeq,
    RunningSeq,
    project_ttus,
)

COST = CostModel(0.01, 1e-5, 0.0, 0.0)


def view(at_s: float, waiting: list[str], running: int = 2, scheduled: int = 2) -> LiveView:
    return LiveView(
        at_s=at_s,
        step=0,
        scheduled=tuple(f"r{i}" for i in range(scheduled)),
        scheduled_tokens=scheduled,
        running=tuple(LiveRunning(f"r{i}", 1000, 1000, 3) for i in range(running)),
        waiting=tuple(LiveWaiting(w, 2048) for w in waiting),
        max_seqs=2,
        max_batched_tokens=512,
        free_kv_tokens=10_000,
    )


def core(k: int = 2, tol: float = 0.001) -> LiveAdapterCore:
    return LiveAdapterCore(
        AdapterSettings(k=k, ttu_tolerance_s=tol, output_limit_tokens=8, cost=COST)
    )


def test_claims_first_k_and_updates_only_on_change() -> None:
    c = core()
    u = c.on_step(view(0.0, ["a", "b", "c"]))
    assert u is not None and u.report == ("a", "b") and u.order == ("a", "b", "c")
    assert set(u.ttus_s) == {"a", "b"}
    # same state, TTUs aged by exactly the elapsed time: nothing to send
    assert c.on_step(view(0.0, ["a", "b", "c"])) is None
    # the head leaves (retrieval begun): "c" becomes claimed, order changes
    u = c.on_step(view(0.5, ["b", "c"]))
    assert u is not None and u.report == ("c",) and u.order == ("b", "c")
    assert set(c.claimed) == {"b", "c"}
    # a claimed request aborted: cancelled once, then forgotten
    u = c.on_finished(["c"], [0])
    assert u is not None and u.cancel == ("c",)
    assert c.on_finished(["c"], [0]) is None


def test_order_only_policies_send_no_ttu() -> None:
    c = LiveAdapterCore(AdapterSettings(k=1, needs_ttu=False, cost=COST))
    u = c.on_step(view(0.0, ["a", "b"]))
    assert u is not None and u.ttus_s == {} and u.report == ("a",)


def test_ttus_are_the_simulation_projection() -> None:
    c = core(k=3)
    c.on_step(view(0.0, ["a", "b", "c"]))
    c.set_hit("b", 1024)
    u = c.on_step(view(1.0, ["a", "b", "c"]))
    assert u is not None
    snap = EngineSnapshot(
        1.0,
        COST.step_s(2, 0, 0),
        (RunningSeq(0, 1000, 3), RunningSeq(0, 1000, 3)),
        (
            QueuedSeq("a", 2048, 0, 0.0),
            QueuedSeq("b", 2048, 1024, 0.0),
            QueuedSeq("c", 2048, 0, 0.0),
        ),
    )
    limits = EngineLimits(2, 512, sync_loads=False, queued_loads=True, gpu_kv_tokens=12_000)
    want = project_ttus(snap, COST, limits, c.predictor, ["a", "b", "c"])
    assert {**c._sent_ttus} == {r: (want[r], 1.0) if r in u.ttus_s else c._sent_ttus[r]
                                for r in c._sent_ttus}  # fmt: skip
    assert u.ttus_s == {r: t for r, t in want.items() if r in u.ttus_s}


def test_step_calibrator_scales_the_cost_model() -> None:
    cal = StepCalibrator(CostModel(0.01, 1e-5, 0.0, 0.0))
    assert cal.scale == 1.0
    cal.observe(0.01, 0.03)
    cal.observe(0.02, 0.03)
    assert cal.scale == 2.0
    assert cal.cost() == CostModel(0.02, 2e-5, 0.0, 0.0)


def arrival(waiting: list[str], loading: tuple[str, ...] = ()) -> LiveView:
    """Between steps (nothing scheduled), right after vLLM queued the last of `waiting`."""
    return LiveView(
        at_s=0.0,
        step=0,
        scheduled=(),
        scheduled_tokens=0,
        running=(),
        waiting=tuple(LiveWaiting(w, 2048, w in loading) for w in waiting),
        max_seqs=1,
        max_batched_tokens=512,
        free_kv_tokens=10_000,
    )


def test_arrivals_among_the_first_k_are_claimed_before_any_step() -> None:
    c = core(k=2)
    u = c.on_arrival(arrival(["a"]))
    assert u is not None and u.report == ("a",) and u.order == ("a",)
    assert set(u.ttus_s) == {"a"}
    u = c.on_arrival(arrival(["a", "b"]))
    assert u is not None and u.report == ("b",) and u.order == ("a", "b")
    # third arrival is not among the first K: no claim, only the order changed
    u = c.on_arrival(arrival(["a", "b", "c"]))
    assert u is not None and u.report == () and u.order == ("a", "b", "c")
    assert set(c.claimed) == {"a", "b"}
    assert c.steps_seen == 0  # arrivals are not steps
    # the first schedule() looked "a" and "b" up (loading): they leave the adapter, and
    # "c" becomes a head, claimed at that step
    looked_up = (LiveWaiting("a", 2048, True), LiveWaiting("b", 2048, True))
    u = c.on_step(LiveView(0.1, 1, (), 0, (), (*looked_up, LiveWaiting("c", 2048)), 1, 512,
                           10_000))  # fmt: skip
    assert u is not None and u.report == ("c",)
    assert set(c.claimed) == {"c"}


def test_loading_requests_take_no_head_place_at_arrival() -> None:
    # vLLM's loads (WAITING_FOR_REMOTE_KVS) hold no slot and are not waiting to be looked
    # up: an arrival behind two loading requests is the first waiting one, claimed (K=1)
    c = core(k=1)
    u = c.on_arrival(arrival(["x", "y", "z"], loading=("x", "y")))
    assert u is not None and u.report == ("z",) and u.order == ("x", "y", "z")
    assert c.on_arrival(arrival(["x", "y", "z"], loading=("x", "y"))) is None


def test_ttus_are_projected_at_most_once_per_tolerance_unless_claims_or_order_change() -> None:
    c = core(tol=0.05)
    c.on_step(view(0.0, ["a", "b", "c"]))  # new claims: projected
    assert c.projections == 1
    for at in (0.01, 0.02, 0.03, 0.04):  # same claims and order, within the tolerance
        c.on_step(view(at, ["a", "b", "c"]))
    assert c.projections == 1
    c.on_step(view(0.05, ["a", "b", "c"]))  # a tolerance later: projected again
    assert c.projections == 2
    c.on_step(view(0.06, ["a", "c", "b"]))  # the order changed: projected at once
    assert c.projections == 3
    c.on_step(view(0.07, ["b", "c"]))  # "a" left, "c" newly claimed: projected at once
    assert c.projections == 4


def test_every_view_sends_the_order_and_every_ttu_each_time() -> None:
    # the simulation's setting: its controller re-evaluates at each iteration
    c = LiveAdapterCore(
        AdapterSettings(k=2, ttu_tolerance_s=0.0, every_view=True, output_limit_tokens=8, cost=COST)
    )
    first = c.on_step(view(0.0, ["a", "b", "c"]))
    again = c.on_step(view(0.0, ["a", "b", "c"]))  # nothing changed: sent all the same
    assert first is not None and again is not None
    assert (first.report, again.report) == (("a", "b"), ())
    assert again.order == first.order == ("a", "b", "c")
    assert again.ttus_s == first.ttus_s and set(again.ttus_s) == {"a", "b"}
    assert (c.updates_sent, c.projections) == (2, 2)


def test_output_priors_seed_the_predictor_and_read_from_json() -> None:
    s = AdapterSettings.from_json({"output_limit_tokens": 8, "output_prior_tokens": [2, 4]})
    assert s.output_prior_tokens == (2, 4)
    c = LiveAdapterCore(s)
    assert c.predictor.remaining_tokens(0) == 3.0  # mean of the priors, not the limit
    assert (
        LiveAdapterCore(AdapterSettings(output_limit_tokens=8)).predictor.remaining_tokens(0) == 8.0
    )


def test_settled_claims_get_no_ttu_and_the_projection_stops_at_the_last_open_one() -> None:
    c = core(k=3, tol=0.0)
    u = c.on_step(view(0.0, ["a", "b", "c"]))
    assert u is not None and set(u.ttus_s) == {"a", "b", "c"}
    c.settle(["c", "zz"])  # c committed; zz was never claimed: ignored
    assert c.settled == {"c"}
    u = c.on_step(view(0.5, ["a", "b", "c"]))
    assert u is not None and set(u.ttus_s) == {"a", "b"}  # the same view 0.5 s on: moved
    c.settle(["a", "b"])  # nothing open: no projection at all
    projections = c.projections
    assert c.on_step(view(1.0, ["a", "b", "c"])) is None and c.projections == projections
    # a settled claim that leaves the queue is forgotten with it
    c.on_step(view(1.5, ["b", "c"]))
    assert (set(c.claimed), c.settled) == ({"b", "c"}, {"b", "c"})


def test_steps_in_flight_are_counted_once() -> None:
    # vLLM's async scheduling: step N (2 decode tokens) computes, step N+1 (2 more) was just
    # scheduled; both are computed tokens already and both outputs are in flight (the
    # placeholders). The same engine a sync view sees once N's output is in (one in flight)
    # is `rest` later: the async view's TTUs are exactly `rest` longer, nothing twice.
    cost = CostModel(2.0**-7, 2.0**-14, 0.0, 0.0)
    step = cost.step_s(2, 0, 0)
    elapsed = 2.0**-9
    rest = step - elapsed

    def at(t: float, outs: tuple[int, int], inflight: int, ahead: tuple[int, ...]) -> LiveView:
        return LiveView(
            at_s=t, step=0, scheduled=("r0", "r1"), scheduled_tokens=2,
            running=(LiveRunning("r0", 1000, 1002, outs[0], inflight),
                     LiveRunning("r1", 1000, 1001, outs[1], inflight)),
            waiting=(LiveWaiting("a", 2048), LiveWaiting("b", 2048)),
            max_seqs=2, max_batched_tokens=512, free_kv_tokens=10_000,
            ahead_tokens=ahead, ahead_elapsed_s=elapsed if ahead else 0.0,
        )  # fmt: skip

    def ttus(view: LiveView) -> dict[str, float]:
        c = LiveAdapterCore(
            AdapterSettings(k=2, ttu_tolerance_s=0.0, output_limit_tokens=8, cost=cost)
        )
        u = c.on_step(view)
        assert u is not None
        return u.ttus_s

    sync = ttus(at(1.0 + rest, (2, 1), 1, ()))
    two_ahead = ttus(at(1.0, (1, 0), 2, (2,)))
    # N+1, then r0 (3 of 8 outputs after N+1) decodes 5 more before its slot frees
    assert sync == {"a": 6 * step, "b": 6 * step}
    assert two_ahead == {r: t + rest for r, t in sync.items()}
    # the in-flight outputs left out (the adapter before): one decode step too many
    blind = ttus(at(1.0 + rest, (2, 1), 0, ()))
    assert blind == {r: t + cost.step_s(2, 0, 0) for r, t in sync.items()}
