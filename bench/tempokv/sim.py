"""How fast the virtual-time simulation runs: the paper's 12-request workload (goal < 1 s)
and a 10,000-request Poisson trace over a shared document pool (goal < 10 s for one
policy), with the shipped defaults (synchronous loads, release after the first step, FIFO
staging). TempoKV-U's 10,000-request run is printed as a ratio to TempoKV's, both timed in
this process, one after the other, so machine load moves both."""

from __future__ import annotations

import random
import time

from bsrctl.tempokv.sim.device import DeviceConfig
from bsrctl.tempokv.sim.models import make_profile
from bsrctl.tempokv.sim.run import ControlConfig, simulate
from bsrctl.tempokv.sim.workload import OutputLengths, fixed_interval, poisson
from bsrctl.tempokv.spec import PAPER_DOCS_TOKENS, TTU_QUANTILE
from bsrkv.tempokv.kv import GIB
from bsrkv.tempokv.ttu import EngineLimits


def main() -> None:
    model = make_profile("llama-3.1-8b")
    outputs = OutputLengths(eos_fraction=0.05)
    rng = random.Random(1)
    control = ControlConfig(
        output_prior_tokens=tuple(outputs.draw(rng) for _ in range(32)),
        ttu_quantile=TTU_QUANTILE,
    )
    device = DeviceConfig(capacity_bytes=100 * GIB, budget_bytes=50 * GIB)
    paper = fixed_interval(
        PAPER_DOCS_TOKENS, 0.5, 1.0, 24, outputs, 7, 256, model.kv_bytes_per_token
    )
    t0 = time.perf_counter()
    res = simulate(paper, model, device, EngineLimits(), control, "tempokv")
    small_s = time.perf_counter() - t0
    print(
        f"12-request paper workload: {small_s:.3f} s wall "
        f"({res.measures().to_json()['makespan_s']:.1f} s virtual) goal < 1 s"
    )
    pool = [rng.randrange(2048, 16384) for _ in range(200)]
    trace = poisson(pool, 1.0, 10_000, 1.0, 24, outputs, 7, 256, model.kv_bytes_per_token)
    wall, cpu = {}, {}
    for policy in ("tempokv", "tempokv-u"):
        t0, c0 = time.perf_counter(), time.process_time()
        res = simulate(trace, model, device, EngineLimits(), control, policy, keep_trace=False)
        big_s, big_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        wall[policy], cpu[policy] = big_s, big_cpu_s
        m = res.measures().to_json()
        print(
            f"10,000-request trace, {policy}: {big_s:.3f} s wall, {big_cpu_s:.3f} s CPU "
            f"({m['makespan_s']:.0f} s virtual, {m['completed']} completed, "
            f"p95 TTFT {m['p95_ttft_s']:.2f} s) goal < 10 s"
        )
    print(
        f"tempokv-u / tempokv on the 10,000-request trace: "
        f"{wall['tempokv-u'] / wall['tempokv']:.2f}x wall, "
        f"{cpu['tempokv-u'] / cpu['tempokv']:.2f}x CPU (q = {TTU_QUANTILE:g})"
    )


if __name__ == "__main__":
    main()
