"""How fast the virtual-time simulation runs: the paper's 12-request workload (goal < 1 s)
and a 10,000-request Poisson trace over a shared document pool (goal < 10 s), TempoKV,
with the shipped defaults (synchronous loads, release after the first step, FIFO staging)."""

from __future__ import annotations

import random
import time

from bsrctl.tempokv.kv import GIB
from bsrctl.tempokv.sim.device import DeviceConfig
from bsrctl.tempokv.sim.models import make_profile
from bsrctl.tempokv.sim.run import ControlConfig, simulate
from bsrctl.tempokv.sim.workload import OutputLengths, fixed_interval, poisson
from bsrctl.tempokv.spec import PAPER_DOCS_TOKENS
from bsrctl.tempokv.ttu import EngineLimits


def main() -> None:
    model = make_profile("llama-3.1-8b")
    outputs = OutputLengths(eos_fraction=0.05)
    rng = random.Random(1)
    control = ControlConfig(output_prior_tokens=tuple(outputs.draw(rng) for _ in range(32)))
    device = DeviceConfig(capacity_bytes=100 * GIB, budget_bytes=50 * GIB)
    paper = fixed_interval(
        PAPER_DOCS_TOKENS, 0.5, 1.0, 24, outputs, 7, 256, model.kv_bytes_per_token
    )
    t0 = time.perf_counter()
    res = simulate(paper, model, device, EngineLimits(), control, "tempokv")
    small_s = time.perf_counter() - t0
    print(
        f"12-request paper workload: {small_s:.3f} s wall "
        f"({res.measures()['makespan_s']:.1f} s virtual) goal < 1 s"
    )
    pool = [rng.randrange(2048, 16384) for _ in range(200)]
    trace = poisson(pool, 1.0, 10_000, 1.0, 24, outputs, 7, 256, model.kv_bytes_per_token)
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(trace, model, device, EngineLimits(), control, "tempokv", keep_trace=False)
    big_s, big_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    m = res.measures()
    print(
        f"10,000-request trace: {big_s:.3f} s wall, {big_cpu_s:.3f} s CPU "
        f"({m['makespan_s']:.0f} s virtual, "
        f"{m['completed']} completed, p95 TTFT {m['p95_ttft_s']:.2f} s) goal < 10 s"
    )


if __name__ == "__main__":
    main()
