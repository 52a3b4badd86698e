"""One runtime adapter: the simulation drives the live adapter's core. Fed the same sequence
of views (and the same replies and completions), a fresh ``LiveAdapterCore`` — as the vLLM
scheduler holds one — sends exactly the updates the simulated runtime handed its
controller, and the controller received exactly those."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bsrctl.tempokv.experiments.cells import simulate_policy
from bsrctl.tempokv.sim.models import CATALOGUE
from bsrctl.tempokv.sim.runtime import SimRuntime
from bsrctl.tempokv.spec import load
from bsrkv.tempokv.controller import Controller
from bsrkv.tempokv.live import LiveAdapterCore, LiveView, Update

FIG4 = Path(__file__).resolve().parents[3] / "ladders" / "tempokv-fig4.yaml"


def _record(mp: pytest.MonkeyPatch) -> tuple[list[SimRuntime], list[tuple[Any, ...]], list]:
    """Every input the sim's cores were given and what they returned; what the controller
    was told."""
    runtimes: list[SimRuntime] = []
    inputs: list[tuple[Any, ...]] = []  # (method, args, returned)
    told: list[tuple[tuple[str, ...], dict[str, float], float]] = []
    init, update_runtime = SimRuntime.__init__, Controller.update_runtime

    def init_rec(self: SimRuntime, *args: Any) -> None:
        init(self, *args)
        runtimes.append(self)

    def wrap(name: str) -> None:
        fn = getattr(LiveAdapterCore, name)

        def rec(self: LiveAdapterCore, *args: Any) -> Any:
            out = fn(self, *args)
            inputs.append((name, args, out))
            return out

        mp.setattr(LiveAdapterCore, name, rec)

    def told_rec(self: Controller, order: Any, ttus: Any, at_s: float) -> None:
        told.append((tuple(order), dict(ttus or {}), at_s))
        update_runtime(self, order, ttus, at_s)

    mp.setattr(SimRuntime, "__init__", init_rec)
    mp.setattr(Controller, "update_runtime", told_rec)
    for name in ("on_step", "on_arrival", "on_finished", "set_hit", "settle"):
        wrap(name)
    return runtimes, inputs, told


@pytest.mark.parametrize("policy", ["tempokv", "tempokv-u", "queue-4"])
def test_the_sim_and_the_live_adapter_fed_the_same_views_send_the_same_updates(policy):
    spec, _ = load(FIG4)
    with pytest.MonkeyPatch.context() as mp:
        runtimes, inputs, told = _record(mp)
        res = simulate_policy(spec, CATALOGUE["llama-3.1-8b"], 1.0, 100.0, policy)
    assert len(runtimes) == 1 and res.measures().completed == 12
    views = [args[0] for name, args, _ in inputs if name in ("on_step", "on_arrival")]
    assert len(views) > 2 * 12 and all(isinstance(v, LiveView) for v in views)
    timed = policy != "queue-4"
    # the sim's engine gives its exact state whenever the core projects, and only then: no
    # TTU in the sim comes from the view's fields alone
    exact = sum(v.engine is not None for v in views)
    assert runtimes[0].core.projections == exact and (exact > 0) == timed
    sent = [out for _, _, out in inputs if isinstance(out, Update)]
    # the sim's settings send every view: the controller re-evaluates at every iteration
    assert len(sent) == len(views)
    # what the controller was told is, update by update, what the core sent
    assert told == [(u.order, u.ttus_s, u.at_s) for u in sent]
    assert any(u.ttus_s for u in sent) == timed
    # a fresh core, as the vLLM scheduler holds one, fed the same inputs in the same order
    live = LiveAdapterCore(runtimes[0].core.s)
    replies = []
    for name, args, _ in inputs:
        replies.append(getattr(live, name)(*args))
    assert replies == [out for _, _, out in inputs]
    assert (live.updates_sent, live.projections) == (
        runtimes[0].core.updates_sent,
        runtimes[0].core.projections,
    )
