"""The same controller, provider and simulated engine under the wall clock: a tiny scenario,
asserting state order (never timing)."""

import pytest

from bsrctl.tempokv.sim.device import DeviceConfig
from bsrctl.tempokv.sim.models import make_profile
from bsrctl.tempokv.sim.run import ControlConfig, simulate
from bsrctl.tempokv.sim.workload import OutputLengths, fixed_interval
from bsrkv.clock import VirtualClock, WallClock
from bsrkv.tempokv.kv import GIB
from bsrkv.tempokv.ttu import EngineLimits

LIFECYCLE = ["PLANNED", "STAGING", "STAGEREADY", "TRANSFERRING", "RELEASED"]


def _run(policy, clock):
    model = make_profile("llama-3.1-8b")
    outputs = OutputLengths(max_tokens=3, eos_fraction=0.0, min_tokens=1)
    # 1024-token prefixes (128 MiB) arriving every 20 ms, staged at 8 GiB/s: milliseconds.
    reqs = fixed_interval([1024, 1024, 1024], 0.02, 1.0, 8, outputs, 1, 256, 131072)
    device = DeviceConfig(staging_bytes_s=8 * GIB, retrieval_bytes_s=16 * GIB)
    control = ControlConfig(tick_s=0.01, output_limit_tokens=3, output_prior_tokens=(3,))
    return simulate(reqs, model, device, EngineLimits(max_seqs=1), control, policy, clock=clock)


def _states(res):
    return {cid: [s for _, s in tr] for cid, tr in res.claim_traces.items()}


@pytest.mark.parametrize("policy", ["immediate", "tempokv"])
def test_wall_clock_runs_the_same_code_in_the_same_state_order(policy):
    wall = _run(policy, WallClock())
    virtual = _run(policy, VirtualClock())
    assert wall.measures().completed == 3
    assert wall.peak_reserved_bytes <= wall.budget_bytes
    for states in _states(wall).values():
        # every claim walks the lifecycle in order (committed) or takes the ordinary path
        assert states == LIFECYCLE or states == ["PLANNED", "ORDINARY"]
    if policy == "immediate":  # no timing decision involved: identical to virtual time
        assert _states(wall) == _states(virtual) == {f"r0000{i}": LIFECYCLE for i in range(3)}
