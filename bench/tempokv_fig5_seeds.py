"""How robust Figure 5's ranking at 25 GiB is in the simulation: TempoKV against the best of
the other five (in practice Queue-1) over 20 trace seeds (a seed draws the output lengths;
documents and arrivals are the paper's) and four early-EOS shares, Llama at a 100% prefix
ratio. The paper has TempoKV best in throughput and p95 TTFT there. Each row
prints how often it is, and TempoKV − Queue-1 in tok/s and p95 seconds (median and worst
over the seeds). `--crossing-wakeup` turns on control.crossing_wakeup. Nothing here is
timed: it prints what the virtual-time simulation gives."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from bsrctl.experiments.tempokv import simulate_policy
from bsrctl.tempokv.sim.models import CATALOGUE
from bsrctl.tempokv.spec import load

SPEC = Path(__file__).resolve().parent.parent / "ladders" / "tempokv-fig5.yaml"
FAST_TIER_GIB = 25.0
SEEDS = range(1, 21)
EOS_FRACTIONS = (0.0, 0.05, 0.2, 0.5)


def main() -> None:
    spec, _ = load(SPEC)
    if "--crossing-wakeup" in sys.argv[1:]:
        control = spec.control.model_copy(update={"crossing_wakeup": True})
        spec = spec.model_copy(update={"control": control})
    model = CATALOGUE[spec.models[0].name]
    policies = spec.experiment.policies
    print("eos tempokv_best d_tok_s(median,worst) d_p95_s(median,worst)")
    for eos in EOS_FRACTIONS:
        best, d_tok, d_p95 = 0, [], []
        for seed in SEEDS:
            output = spec.workload.output.model_copy(update={"eos_fraction": eos})
            workload = spec.workload.model_copy(update={"output": output})
            cell = spec.model_copy(update={"seed": seed, "workload": workload})
            m = {
                p: simulate_policy(cell, model, 1.0, FAST_TIER_GIB, p, False).measures()
                for p in policies
            }
            t = m.pop("tempokv")
            best += t["output_tok_s"] >= max(o["output_tok_s"] for o in m.values()) and t[
                "p95_ttft_s"
            ] <= min(o["p95_ttft_s"] for o in m.values())
            d_tok.append(t["output_tok_s"] - m["queue-1"]["output_tok_s"])
            d_p95.append(t["p95_ttft_s"] - m["queue-1"]["p95_ttft_s"])
        print(
            f"{eos:g} {best}/{len(SEEDS)} "
            f"{statistics.median(d_tok):+.2f},{min(d_tok):+.2f} "
            f"{statistics.median(d_p95):+.3f},{max(d_p95):+.3f}"
        )


if __name__ == "__main__":
    main()
