"""The sim cross-check: a `tempokv --stack serving` run against the simulation of its spec,
calibrated from that run's measured step times (adapter trace) and staging rate
(evidence). Prints the calibration, both runs' C and p95 per policy, and the orderings.

    python bench/tempokv/sim_vs_serving.py SPEC.yaml RUN_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bsrctl.tempokv.experiments.crosscheck import (
    CrossCheckUnknown,
    calibrate,
    orderings,
    serving_rows,
    simulate_like_serving,
)
from bsrctl.tempokv.spec import load


def main() -> None:
    spec_path, run_dir = Path(sys.argv[1]), Path(sys.argv[2])
    spec, _ = load(spec_path)
    evidence = json.loads((run_dir / "evidence.json").read_text())
    trace = [json.loads(x) for x in (run_dir / "adapter-trace.jsonl").read_text().splitlines()]
    cal = calibrate(evidence, trace)
    print(f"calibration: {cal}")
    serving = serving_rows(evidence)
    try:
        sim = simulate_like_serving(spec, cal, [*serving, "oracle"])
    except CrossCheckUnknown as unknown:  # the sim cannot be set up like the run
        print(f"cross-check UNKNOWN: {unknown}")
        return
    print("| policy | serving C (pins) MiB·s/req | serving C reserved | sim C MiB·s/req | "
          "serving p95 s | sim p95 s |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    nan = float("nan")
    for p in sim:
        s = serving.get(p, {"c": nan, "c_reserved": nan, "p95": nan})
        print(f"| {p} | {s['c']:.4f} | {s['c_reserved']:.4f} | {sim[p]['c']:.4f} | "
              f"{s['p95']:.3f} | {sim[p]['p95']:.3f} |")  # fmt: skip
    for m, a in orderings(serving, sim).items():
        print(f"{m}: serving {' < '.join(a.left)}")
        print(f"{m}: sim     {' < '.join(a.right)}")
        print(f"{m}: tau {a.tau}, tied pairs {a.ties}, discordant {list(a.discordant)}")


if __name__ == "__main__":
    main()
