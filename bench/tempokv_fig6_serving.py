"""The paper's Figure 6 on the CPU serving stack: TempoKV against unmodified LMCache with the
fast tier as its L1 (no controller: the server module's TempoKV is off, so every request
reads L2 through LMCache's own lookup, staged on demand), across offered request rates,
side by side in one run on one stack. Prints p95 TTFT and output throughput per rate and
their ratios. Long-document prompts are made locally (no hub).

    flock /work/heavy.lock python bench/tempokv_fig6_serving.py [SPEC.yaml] [RATES...]

The spec's `serving` section sets the workload and the shaped L2; the rates replace its
interval (requests per second = 1 / interval). Both systems run the same requests per rate,
after L1 and vLLM's prefix cache forget; outputs are checked against the canonical ones.
Nothing is tuned here: it prints what the stack gives."""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

import yaml

from bsrctl.experiments.tempokv.serving import MIB, _arrivals, _p95, prepare, seed_documents
from bsrctl.stack.bsr_client import BsrModuleClient
from bsrctl.tempokv.spec import TempoKVSpec

DEFAULT_SPEC = {
    "name": "fig6-serving",
    "seed": 11,
    "models": [{"name": "llama-3.1-8b"}],
    "serving": {"documents_tokens": [3072, 2048, 2560, 4096, 3072, 2048, 2560, 4096, 3072,
                                     2048], "num_requests": 10,
                "max_tokens": 32, "budget_mib": 6.0, "max_num_seqs": 1},
    "experiment": {"kind": "policies", "cache_ratios": [1.0]},
}  # fmt: skip
DEFAULT_RATES = (2.0, 4.0, 8.0, 12.0, 16.0)


def main() -> None:
    args = sys.argv[1:]
    raw = yaml.safe_load(Path(args[0]).read_text()) if args and args[0].endswith(".yaml") else None
    rates = [float(a) for a in args[1 if raw else 0 :]] or list(DEFAULT_RATES)
    spec = TempoKVSpec.model_validate(raw or DEFAULT_SPEC)
    run_dir = Path(tempfile.mkdtemp(prefix="tk-fig6-"))
    run = spec.serving
    prep = prepare(spec, run_dir)
    stack, info, reqs, canonical = prep.stack, prep.info, prep.reqs, prep.canonical
    stack.up()
    client = BsrModuleClient(stack)
    rows = []
    try:
        seed_documents(stack, client, prep.docs)
        for rate in rates:
            cell = {}
            for system in ("lmcache", "tempokv"):
                client.forget(wait_s=30.0)
                stack.forget_local()
                if system == "tempokv":
                    client.call("tempokv.configure", {
                        "policy": "tempokv", "capacity_bytes": run.l1_mib * MIB,
                        "budget_bytes": int(run.budget_mib * MIB),
                        "prior_bytes_s": run.l2_bandwidth_mib_s * MIB,
                        "tick_s": spec.control.tick_s})  # fmt: skip
                else:
                    client.call("tempokv.configure", {"policy": None})
                timed = run.model_copy(update={"interval_s": 1.0 / rate})
                res = _arrivals(stack, reqs, timed)
                client.call("tempokv.configure", {"policy": None})
                ttfts = [r.first_token_s - r.sent_s for r in res]
                span = max(r.done_s for r in res) - min(r.sent_s for r in res)
                toks = sum(len(r.output_token_ids) for r in res)
                same = sum(r.output_token_ids == c for r, c in zip(res, canonical, strict=True))
                cell[system] = (_p95(ttfts), toks / span, same)
            rows.append((rate, cell))
            lm, tk = cell["lmcache"], cell["tempokv"]
            print(
                f"rate {rate:g} rps: LMCache p95 {lm[0]:.3f}s {lm[1]:.1f} tok/s "
                f"({lm[2]}/{len(reqs)} canonical) | TempoKV p95 {tk[0]:.3f}s {tk[1]:.1f} tok/s "
                f"({tk[2]}/{len(reqs)} canonical) | p95 ratio {tk[0] / lm[0]:.3f} "
                f"tput ratio {tk[1] / lm[1]:.3f}",
                flush=True,
            )
    finally:
        client.close()
        stack.down()
    print("\n| rate rps | LMCache p95 TTFT s | TempoKV p95 TTFT s | LMCache tok/s | "
          "TempoKV tok/s | p95 TempoKV/LMCache | tput TempoKV/LMCache |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for rate, cell in rows:
        lm, tk = cell["lmcache"], cell["tempokv"]
        ratio = tk[0] / lm[0] if lm[0] else math.nan
        print(f"| {rate:g} | {lm[0]:.3f} | {tk[0]:.3f} | {lm[1]:.1f} | {tk[1]:.1f} | "
              f"{ratio:.3f} | {tk[1] / lm[1]:.3f} |")  # fmt: skip
    print(f"\nstack: {info['odirect']=} shaped L2 {run.l2_bandwidth_mib_s} MiB/s, "
          f"budget {run.budget_mib} MiB, run dir {run_dir}")  # fmt: skip


if __name__ == "__main__":
    main()
