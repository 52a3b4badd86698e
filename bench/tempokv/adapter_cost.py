"""The TempoKV runtime adapter's own cost: vLLM with the adapter (the TempoKV controller off)
against vLLM's stock scheduler, on the CPU serving stack, side by side in one run.

    flock /tmp/bsrctl-heavy.lock python bench/tempokv/adapter_cost.py \\
        [--arms adapter,adapter-local,...] [--launches L] [--rounds N] [--rate R] \\
        [--warmup W] [--py-spy] [SPEC.yaml]

Per launch every arm's deployment is up at once (``adapter_cost.COST_ARMS``: stock,
``adapter`` = Figure 6's adapter arm, and the decomposition arms: no trace, no RPC, the
stock scheduler under the recording subclass, stock with TempoKV's LMCache options); the
documents are seeded into each; W warm-up cells per arm are discarded; then N rounds of one
cell per arm (the spec's serving workload at R requests per second, L1 and vLLM's prefix
cache forgotten first), the arms' order rotated and reversed round by round. Launches
alternate which arm starts first. Every output is checked against the canonical one.

Each arm's throughput over the stock arm's of the same round is a paired sample; the table
gives its median over every round of every launch with the 95 % bootstrap interval, and the
same for p95 TTFT. ``--py-spy`` attaches py-spy to every arm's EngineCore for the measured
rounds (nonblocking, 250 Hz, each arm alike; its own CPU then shares the machine: ratios of a
profiled run are not the figure) and prints each arm's share of samples in bsrctl's frames
and its top functions. The check: the adapter's throughput ratio's lower end ≥ 0.99.

Last line: ``adapter-cost tput adapter/stock=R [lo, hi] ... p95 adapter/stock=R [lo, hi] ...``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from bsrctl.errors import StackFailed
from bsrctl.evidence.verdict import Check, check
from bsrctl.experiments.bench import SEED, bench_point, run_bench
from bsrctl.spec_io import describe_error
from bsrctl.tempokv.experiments import engine_profile
from bsrctl.tempokv.experiments.adapter_arms import (
    COST_ARMS,
    DEFAULT_ARMS,
    STOCK,
    CostCell,
    cost_deployment,
    cost_ratios,
    last_line,
    round_orders,
    run_cell,
)
from bsrctl.tempokv.experiments.adapter_cost import adapter_cost, read_trace
from bsrctl.tempokv.experiments.serving import prepare, seed_documents
from bsrctl.tempokv.spec import TempoKVSpec

DEFAULT_SPEC = Path(__file__).resolve().parents[2] / "ladders" / "tempokv-serving.yaml"
GOAL = 0.99  # the adapter alone: at least this share of stock's throughput (interval's low end)
IDLE_S = 0.5  # between cells: the last cell's engine threads stop spinning


def run_launch(
    spec: TempoKVSpec, arms: list[str], k: int, ns: argparse.Namespace, prep: Any, out: Path
) -> tuple[list[CostCell], dict[str, Any]]:
    """One launch: every arm up, seeded, warmed; the rounds; every arm down."""
    order = arms[k % len(arms) :] + arms[: k % len(arms)]
    deps = {a: cost_deployment(spec, COST_ARMS[a], out / f"l{k}-{a}") for a in order}
    cells: list[CostCell] = []
    extra: dict[str, Any] = {}
    recorders: dict[str, engine_profile.Recorder] = {}
    try:
        for a in order:
            dep = deps[a]
            dep.up(dep.settings)
            seeds = seed_documents(dep.stack, dep.client, prep.docs)
            if not all(seeds):
                print(f"FAILURE: launch {k} {a}: documents not whole in L2: {seeds}", flush=True)
        for _ in range(ns.warmup):
            for a in order:
                run_cell(deps[a], spec, prep, ns.rate, a, (k, -1))
                time.sleep(IDLE_S)
        if ns.py_spy:
            recorders = start_profiles(deps, out / f"l{k}-profile")
        for r, rnd in enumerate(round_orders(arms, ns.rounds, first=k * ns.rounds)):
            for a in rnd:
                cell = run_cell(deps[a], spec, prep, ns.rate, a, (k, r))
                cells.append(cell)
                print(f"launch {k} round {r} {a:16} {cell.tok_s:7.1f} tok/s p95 TTFT "
                      f"{cell.p95_s:.3f}s {cell.canonical}/{cell.requests} canonical | CPU s "
                      f"engine {cell.engine_cpu_s:.2f} api {cell.api_cpu_s:.2f} lmcache "
                      f"{cell.lmcache_cpu_s:.2f}", flush=True)  # fmt: skip
                time.sleep(IDLE_S)
    finally:
        for a, rec in recorders.items():
            got = rec.stop()
            if got is not None:
                extra.setdefault("profiles", {})[a] = got
        for a in order:
            deps[a].down()
    for a in order:
        trace = read_trace(out / f"l{k}-{a}" / "adapter-trace.jsonl")
        if trace:
            extra.setdefault("trace_cost", {})[a] = adapter_cost(trace)
    return cells, extra


def start_profiles(deps: dict[str, Any], out: Path) -> dict[str, engine_profile.Recorder]:
    exe = engine_profile.py_spy()
    if exe is None:
        print("note: --py-spy asked, but py-spy is not installed: no profile", flush=True)
        return {}
    out.mkdir(parents=True, exist_ok=True)
    recs = {}
    for a, dep in deps.items():
        pid = engine_profile.engine_core_pid(dep.stack.parts["vllm"].pid)
        if pid is None:
            print(f"note: {a}: no EngineCore process found: not profiled", flush=True)
            continue
        recs[a] = engine_profile.Recorder(exe, pid, out / f"{a}.txt")
    return recs


def profile_lines(profiles: dict[str, list[Path]]) -> list[str]:
    lines = []
    for arm, paths in profiles.items():
        for p in paths:
            s = engine_profile.summarize(p)
            lines.append(f"profile {arm} ({p}): {s.samples} samples, adapter (bsrkv) frames "
                         f"{100 * s.adapter_share:.2f} %")  # fmt: skip
            lines += [f"  self {100 * v:5.2f} % {f}" for f, v in s.top_self[:10]]
    return lines


def goal_check(ratios: list[Any]) -> list[Check]:
    out = []
    for r in ratios:
        if r.arm != "adapter":
            continue
        iv = r.tput
        ok = None if not iv.testable or iv.lo < GOAL <= iv.hi else iv.lo >= GOAL
        out.append(check("adapter_tput_ge_0.99", ok,
                         f"adapter/stock throughput {iv.text(3)} over {r.rounds} rounds; "
                         f"goal: the interval's low end >= {GOAL}"))  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", nargs="?", type=Path, default=DEFAULT_SPEC, help="a tempokv spec")
    ap.add_argument("--arms", default=",".join(DEFAULT_ARMS[1:]),
                    help=f"arms beside stock, of {sorted(set(COST_ARMS) - {STOCK})}")  # fmt: skip
    ap.add_argument("--launches", type=int, default=1, help="stack-ups of every arm (≥ 1)")
    ap.add_argument("--rounds", type=int, default=8, help="rounds per launch (≥ 2)")
    ap.add_argument("--warmup", type=int, default=1, help="discarded cells per arm per launch")
    ap.add_argument("--rate", type=float, default=16.0, help="requests per second (> 0)")
    ap.add_argument("--py-spy", action="store_true", help="profile every arm's EngineCore")
    ap.add_argument("--evidence", type=Path, default=Path("reports"), help="bench run under here")
    ns = ap.parse_args()
    extra_arms = [a for a in ns.arms.split(",") if a]
    bad = [a for a in extra_arms if a not in COST_ARMS or a == STOCK]
    if bad:
        ap.error(f"--arms {bad}: choose from {sorted(set(COST_ARMS) - {STOCK})}")
    if ns.launches < 1 or ns.rounds < 2 or ns.warmup < 0 or ns.rate <= 0:
        ap.error("--launches ≥ 1, --rounds ≥ 2, --warmup ≥ 0, --rate > 0")
    try:
        spec = TempoKVSpec.model_validate(yaml.safe_load(ns.spec.read_text()))
    except ValidationError as e:
        print(f"error: {describe_error(TempoKVSpec, e)}", file=sys.stderr)
        return 2
    arms = [STOCK, *extra_arms]
    out = Path(tempfile.mkdtemp(prefix="tk-adapter-cost-"))
    n = spec.serving.num_requests
    print(f"run dir {out}; arms {arms}; {ns.launches} launch(es) x {ns.rounds} rounds at "
          f"{ns.rate:g} rps, {n} requests per cell", flush=True)  # fmt: skip
    prep = prepare(spec, out / "canonical")
    cells: list[CostCell] = []
    extras: list[dict[str, Any]] = []

    def body(w: Any) -> tuple[dict[str, Any], list[Check]]:
        for k in range(ns.launches):
            got, extra = run_launch(spec, arms, k, ns, prep, out)
            cells.extend(got)
            extras.append(extra)
        for a in arms:
            mine = [c for c in cells if c.arm == a]
            same, n = sum(c.canonical for c in mine), sum(c.requests for c in mine)
            canon = check("canonical_output", same == n, f"{same}/{n} outputs canonical")
            w.add_point(bench_point(f"adapter-cost/{a}", {"arm": a, "rate_rps": ns.rate},
                                    {"tok_s": [c.tok_s for c in mine],
                                     "p95_ttft_s": [c.p95_s for c in mine]},
                                    {"canonical": same, "requests": n}, [canon]))  # fmt: skip
        ratios = cost_ratios(cells, SEED)
        summary = {
            "arms": {a: COST_ARMS[a].what for a in arms},
            "cells": [c.to_json() for c in cells],
            "ratios": {r.arm: {k: [iv.estimate, iv.lo, iv.hi] for k, iv in
                               (("tput", r.tput), ("p95", r.p95), ("engine_cpu", r.engine_cpu),
                                ("lmcache_cpu", r.lmcache_cpu))} for r in ratios},
            "trace_cost": [e.get("trace_cost", {}) for e in extras],
        }  # fmt: skip
        return summary, goal_check(ratios)

    try:
        args = {**vars(ns), "arms": arms}
        verdict, evidence = run_bench("tempokv_adapter_cost", ns.evidence, args,
                                      {"kind": "serving"}, body)  # fmt: skip
    except StackFailed as e:
        print(f"FAILURE: stack failed: {e}", flush=True)
        return 3
    print(f"# evidence {evidence} ({verdict})")
    for i, e in enumerate(extras):
        for a, cost in e.get("trace_cost", {}).items():
            print(f"launch {i} {a} trace: loop share {cost['loop_share']:.4f}, adapter per "
                  f"step p50 {cost['adapter_per_step']['p50_s'] * 1e6:.0f} us, arrival ack "
                  f"p50 {cost['arrival_ack_wait']['p50_s'] * 1e3:.2f} ms")  # fmt: skip
    profiles: dict[str, list[Path]] = {}
    for e in extras:
        for a, p in e.get("profiles", {}).items():
            profiles.setdefault(a, []).append(p)
    print("\n".join(profile_lines(profiles)))
    ratios = cost_ratios(cells, SEED)
    print("\n| arm | what | tput arm/stock [95 % CI] | p95 TTFT arm/stock | EngineCore CPU "
          "arm/stock | LMCache CPU arm/stock | rounds |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in ratios:
        print(f"| {r.arm} | {COST_ARMS[r.arm].what} | {r.tput.text(3)} | {r.p95.text(3)} "
              f"| {r.engine_cpu.text(3)} | {r.lmcache_cpu.text(3)} | {r.rounds} |")  # fmt: skip
    bad_cells = [c.to_json() for c in cells if c.canonical != c.requests]
    if bad_cells:
        print(f"FAILURE: non-canonical outputs in {json.dumps(bad_cells)}", flush=True)
        print(last_line(ratios))
        return 1
    print(f"all outputs canonical in every arm ({', '.join(arms)})")
    print(last_line(ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
