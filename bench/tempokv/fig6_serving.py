"""The paper's Figure 6 on the CPU serving stack, across offered request rates: TempoKV
against unmodified LMCache. Prints p95 TTFT and output throughput per rate and their ratios.
Long-document prompts are made locally (no hub).

    flock /tmp/bsrctl-heavy.lock python bench/tempokv/fig6_serving.py [--repeats R] \
        [--baseline fs|dax] [SPEC.yaml] [RATES...]

``--baseline dax`` is Figure 6 as §5.3 ran it (``fig6/dax.py``, ``fig6/device.py``):
LMCache-DAX (unmodified vLLM and LMCache, its whole L1 the flash tier's arena,
``serving.fast_tier``) against TempoKV on the same tier, default spec
``ladders/tempokv-fig6-dax.yaml``, rates 0.2-4 rps. The flash has two read paths: bulk
reads (TempoKV's staging: readahead in 1 MiB pieces, then mlock) at its bandwidth, 4 KiB
faults (LMCache-DAX's retrieve) at its request rate. ``--demand-ratio R ...`` (default 1 and
the spec's) sets demand rate / staging rate; both arms run every rate at every ratio. The
device is measured first (fio in a tier's cgroups, per ratio). Each cell starts with vLLM's
prefix cache forgotten and the fast tier cleared (the flash copy kept). Per ratio it prints
where the time goes, the headroom, each arm's flash time per MiB, the simulation's
prediction from the measured device beside the live intervals, the ratios and goals; then
the decomposition; last line ``fig6-dax ratio=R tput tempokv/lmcache-dax @r=M [lo, hi] ...
p95 ... | ratio=R2 ...``.

``--baseline fs`` (the default) is today's analogue, a question of its own: TempoKV against
stock LMCache with a DRAM L1 and a shaped FS L2, a common deployment; its lookup starts the
L2 read at arrival (close to the Immediate policy with an L1 under no pressure). Two arms,
each its own deployment, made by ``serving.deployment_for`` (the run's path:
``make_deployment`` with TempoKV's ``extend``) with the same server module and the same shaped
(O_DIRECT where taken) FS L2:

- ``lmcache``: ``with_adapter=False``: vLLM's stock scheduler (no ``--scheduler-cls``), LMCache
  with its stock options and the server module's TempoKV off: every request reads L2 through
  LMCache's own lookup, staged on demand;
- ``tempokv``: vLLM with the TempoKV runtime adapter, LMCache with ``retain`` and the long read
  TTL, the controller on (``tempokv.configure`` per cell).

Per repeat both arms run every rate, in alternating order between repeats (AB, BA, AB, ...)
so drift over the run hits both; an arm is stack up, documents seeded into L2, then every rate
(L1 and vLLM's prefix cache forget before each cell), stack down. The spec's `serving` section
sets the workload and the shaped L2; the rates replace its interval (requests per second =
1 / interval; `--arrivals poisson`, `--turns N` and `--slo-ttft-s S` set the spec's arrival
process, documents reused across turns and the goodput SLO, which adds a goodput claim).
Canonical outputs (a connector-less vLLM) are computed once: both arms send the same prompts.
Every output is checked against them; any that differs (or a request that did not finish)
is printed as FAILURE and the exit status is 1. The table gives, per rate, the median over
repeats of each arm's p95 TTFT and tok/s, the median of the per-repeat ratios and their
min–max; then each rate's claims (throughput >= LMCache's, p95 <= LMCache's) judged on the
paired repeats' 95 % interval: PASS, FAIL or UNKNOWN with the interval. Nothing is tuned
here: it prints what the stack gives.

Decomposition arms: ``--adapter-arm`` (TempoKV's stack, controller off), ``--local-arm``
(the adapter with no server call, no trace), ``--retain-arm`` (stock vLLM with TempoKV's
LMCache options: ``retain`` and the long read TTL), ``--threads-arm`` (the stock arm with the
LMCache server on one OpenMP thread). Each cell also prints its stock retrieves' time in the
server (``bsr.status`` outcomes) and how many took over 0.1 s.

The bench's parts live in ``bench/tempokv/fig6/``. Evidence: a ``bench`` run under ``--evidence``
(a point per arm and rate, each repeat's p95 TTFT, tok/s and goodput as samples; the
claims as the run's checks) with the run's ``timeline.json`` (every process's spans, per
request), and per arm where the cells' TTFT went: the mean milliseconds per request on
each phase of their critical paths. Last line:
``fig6 tput tempokv/lmcache @2=R [lo, hi] ... p95 tempokv/lmcache @2=...``: per rate the
median of the per-repeat ratios with its 95 % bootstrap interval."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from fig6 import dax, device
from fig6.cells import (
    BASE,
    DAX_BASE,
    Cell,
    Cells,
    Spread,
    bench_points,
    claim_checks,
    claims,
    last_line,
    ratio,
    spread,
    table,
    tier_cells,
)
from fig6.cells import arm_orders as _arm_orders
from fig6.measure import cell_line, measure
from fig6.where import arm_pids, ttft_lines, where_ttft_went
from pydantic import ValidationError

from bsrctl.errors import StackFailed
from bsrctl.evidence.verdict import Check
from bsrctl.experiments.bench import run_bench
from bsrctl.spec_io import describe_error
from bsrctl.stack.contracts.bsr_client import outcomes_since
from bsrctl.stack.contracts.deployment import Deployment
from bsrctl.stack.launch.extensions import TempoKVLaunch, odirect_allowed
from bsrctl.tempokv.experiments import calls
from bsrctl.tempokv.experiments.serving import (
    _arrivals,
    adapter_settings,
    deployment_for,
    prepare,
    seed_documents,
    stack_spec,
)
from bsrctl.tempokv.spec import TempoKVSpec
from bsrctl.trace.collect import read_spans
from bsrctl.trace.timeline import spans_of

__all__ = ["Cell", "Spread", "claim_checks", "claims", "last_line", "ratio", "spread", "table"]

# the shipped serving workload (ladders/tempokv-serving.yaml: one slot, 12 documents, shaped
# L2, budget, claims_k), its interval replaced by each rate; its `repeats` is the grid's
DEFAULT_SPEC = Path(__file__).resolve().parents[2] / "ladders" / "tempokv-serving.yaml"
DEFAULT_RATES = (2.0, 4.0, 8.0, 12.0, 16.0)
ARMS = (BASE, "tempokv")
# `--adapter-arm`: the TempoKV stack with the controller off (vLLM runs the adapter, which
# reports to a server that answers "off"): what the adapter alone costs against stock
ADAPTER_ARM = "adapter"
# `--local-arm`: the same, but the adapter's updates stay in vLLM's process (no server call)
# and it writes no trace: the adapter's in-process work alone
LOCAL_ARM = "adapter-local"
# `--retain-arm`: stock vLLM (no adapter, no controller) with TempoKV's LMCache options
# (``retain``, the long read TTL): what those options alone change against the stock arm
RETAIN_ARM = "lmcache-retain"
# `--threads-arm`: the stock arm with the LMCache server on one OpenMP thread
# (``lmcache.cpu_threads: 1``): its copies' parallel regions then never span the core the
# engine's pinned OMP thread spins on
THREADS_ARM = "lmcache-t1"
STOCK_ARMS = (BASE, DAX_BASE, RETAIN_ARM, THREADS_ARM)  # vLLM and LMCache unmodified


def arm_orders(repeats: int, arms: tuple[str, ...] = ARMS) -> list[tuple[str, ...]]:
    return _arm_orders(repeats, arms)


def in_process(tk: TempoKVLaunch) -> TempoKVLaunch:
    """The adapter-local arm's launch: updates stay in vLLM's process, no trace."""
    return replace(tk, transport="record", trace_path=None)


def arm_deployment(spec: TempoKVSpec, arm: str, run_dir: Path) -> Deployment:
    """The arm's deployment (not started), through the serving run's own path."""
    launch = in_process if arm == LOCAL_ARM else None
    if arm == THREADS_ARM:
        stack = spec.serving.stack
        lm = stack.lmcache.model_copy(update={"cpu_threads": 1})
        serving = spec.serving.model_copy(
            update={"stack": stack.model_copy(update={"lmcache": lm})}
        )
        spec = spec.model_copy(update={"serving": serving})
    l1 = TempoKVLaunch(adapter_settings(spec, stack_spec(spec.serving))).l1_options
    dep, _info = deployment_for(
        spec,
        run_dir,
        with_adapter=arm not in STOCK_ARMS,
        launch=launch,
        l1=l1 if arm == RETAIN_ARM else None,
    )
    return dep


def run_arm(
    spec: TempoKVSpec, arm: str, run_dir: Path, rates: Sequence[float], prep: Any, rep: int,
    deployments: dict[str, list[Any]] | None = None, ratios: Sequence[float | None] = (None,),
) -> dict[float | None, dict[float, Cell]]:  # fmt: skip
    """One repeat of an arm: stack up, documents seeded, every demand ratio (the flash
    tier's read_iops_device set for it; None: left as the spec sets it) and every rate,
    stack down."""
    run = spec.serving
    dep = arm_deployment(spec, arm, run_dir)
    on_flash = run.fast_tier is not None
    out: dict[float | None, dict[float, Cell]] = {}
    try:
        dep.up(dep.settings)
        stack, client = dep.stack, dep.client
        assert client is not None
        seeds = seed_documents(stack, client, prep.docs)
        if not all(seeds):
            print(f"FAILURE: repeat {rep} {arm}: documents not whole in the tier: {seeds}")
        if deployments is not None and on_flash:
            deployments.setdefault(arm, []).append(dax.deployment_record(stack))
        for dr, rate in [(dr, rate) for dr in ratios for rate in rates]:
            if dr is not None:
                dep.stack.fast_tier.set_demand(device.iops_for(spec, dr))
            if on_flash:  # the flash copy stays: only the fast tier (its page cache) empties
                cleared, counters = dax.start_cell(stack)
            else:
                forgot = client.forget(wait_s=30.0)
                if forgot.l1_used_bytes_after:
                    print(f"note: L1 still holds {forgot.l1_used_bytes_after} B after forget")
                stack.forget_local()
            on = arm == "tempokv"
            calls.configure(client, calls.tempo_config(spec, "tempokv") if on else None)
            timed = run.model_copy(update={"interval_s": 1.0 / rate})
            before = client.status().recent_outcomes
            res = _arrivals(stack, prep.reqs, timed)
            controller = ""
            st = None
            if on:
                time.sleep(0.3)  # the last retrieve's release reaches the controller
                st = calls.status(client)
            if st is not None:
                controller = (
                    f"claims {len(st.claims)} committed {len(st.ttr)} "
                    f"deferred {st.deferred_claims} stages {len(st.stages)} "
                    f"retrievals {st.retrievals}"
                )
            calls.configure(client, None)
            tier = dax.end_cell(stack, cleared, counters) if on_flash else None
            retrieves = tuple(o.restore_s for o in outcomes_since(before,
                              client.status().recent_outcomes) if o.mode == "stock")  # fmt: skip
            cell = measure(res, prep.canonical, run.slo_ttft_s, controller, retrieves, tier)
            out.setdefault(dr, {})[rate] = cell
            tag = "" if dr is None else f"ratio {dr:g} "
            print(tag + cell_line(rep, arm, rate, cell, run.slo_ttft_s is not None), flush=True)
            if cell.canonical != cell.requests:
                print(f"FAILURE: repeat {rep} {arm} rate {rate:g}: only {cell.canonical}/"
                      f"{cell.requests} outputs equal the canonical ones", flush=True)  # fmt: skip
    finally:
        dep.down()  # closes its client, stops every process by PID (and the tier's cgroups)
    return out


def workload_overrides(doc: dict[str, Any], ns: argparse.Namespace) -> dict[str, Any]:
    """The spec with the command line's workload flags in its `serving:` section (validated
    with the rest: a bad value exits 2 naming the field)."""
    serving = dict(doc.get("serving") or {})
    arrivals = dict(serving.get("arrivals") or {})
    for flag, key in (("arrivals", "process"), ("burstiness", "burstiness"),
                      ("arrival_seed", "seed")):  # fmt: skip
        if getattr(ns, flag) is not None:
            arrivals[key] = getattr(ns, flag)
    if arrivals:
        serving["arrivals"] = arrivals
    for flag in ("turns", "slo_ttft_s"):
        if getattr(ns, flag) is not None:
            serving[flag] = getattr(ns, flag)
    if ns.kv_blocks is not None:
        stack = dict(serving.get("stack") or {})
        stack["vllm"] = {**(stack.get("vllm") or {}), "num_gpu_blocks_override": ns.kv_blocks}
        serving["stack"] = stack
    return {**doc, "serving": serving}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--repeats",
        type=int,
        default=6,
        help="runs of both arms (≥ 1; 6 is the fewest that can decide a claim)",
    )
    ap.add_argument("--baseline", choices=("fs", "dax"), default="fs",
                    help="fs: stock LMCache, DRAM L1 + FS L2 (today's analogue); dax: "
                    "LMCache-DAX on the flash tier (§5.3)")  # fmt: skip
    ap.add_argument("args", nargs="*", help="[SPEC.yaml] [RATES...] (requests per second)")
    flags = (
        ("--adapter-arm", "an arm: the TempoKV stack with the controller off"),
        ("--local-arm", "an arm: the adapter with no server call and no trace"),
        ("--retain-arm", "an arm: stock vLLM with TempoKV's LMCache options"),
        ("--threads-arm", "an arm: the stock arm, LMCache server on one OpenMP thread"),
    )
    for flag, what in flags:  # fmt: skip
        ap.add_argument(flag, action="store_true", help=what + " (--baseline fs)")
    ap.add_argument("--arrivals", choices=("fixed", "poisson"), help="serving.arrivals.process")
    ap.add_argument("--burstiness", type=float, help="serving.arrivals.burstiness (1: Poisson)")
    ap.add_argument("--arrival-seed", type=int, help="serving.arrivals.seed")
    ap.add_argument("--turns", type=int, help="serving.turns (documents reused across turns)")
    ap.add_argument("--slo-ttft-s", type=float, help="serving.slo_ttft_s (goodput's TTFT bound)")
    ap.add_argument(
        "--kv-blocks",
        type=int,
        help="serving.stack.vllm.num_gpu_blocks_override (the engine's KV pool)",
    )
    ap.add_argument(
        "--timeline-rate",
        type=float,
        help="--baseline dax: the rate whose timeline is shown (default: the highest)",
    )
    ap.add_argument(
        "--demand-ratio",
        type=float,
        nargs="+",
        help="--baseline dax: the flash's demand rate over its staging rate, each run at "
        "every rate (default: 1 and the spec's demand_mib_s / flash_mib_s)",
    )
    ap.add_argument("--evidence", type=Path, default=Path("reports"), help="bench run under here")
    return ap


def main() -> int:
    ap = parser()
    ns = ap.parse_args()
    on_dax = ns.baseline == "dax"
    extra = ((ADAPTER_ARM, ns.adapter_arm), (LOCAL_ARM, ns.local_arm),
             (RETAIN_ARM, ns.retain_arm), (THREADS_ARM, ns.threads_arm))  # fmt: skip
    if on_dax and any(on for _, on in extra):
        ap.error("--adapter-arm/--local-arm/--retain-arm/--threads-arm: --baseline fs only")
    arms = dax.ARMS if on_dax else ARMS + tuple(a for a, on in extra if on)
    base = arms[0]
    if ns.repeats < 1:
        ap.error(f"--repeats {ns.repeats}: give 1 or more")
    args = list(ns.args)
    path = Path(args.pop(0)) if args and args[0].endswith(".yaml") else None
    default_spec, default_rates = (dax.SPEC, dax.RATES) if on_dax else (DEFAULT_SPEC, DEFAULT_RATES)
    try:
        rates = [float(a) for a in args] or list(default_rates)
    except ValueError:
        ap.error(f"RATES {args}: give numbers (requests per second)")
    if any(r <= 0 for r in rates):
        ap.error(f"RATES {rates}: each must be > 0")
    try:
        spec = TempoKVSpec.model_validate(workload_overrides(
            yaml.safe_load((path or default_spec).read_text()), ns))  # fmt: skip
    except ValidationError as e:
        print(f"error: {describe_error(TempoKVSpec, e)}", file=sys.stderr)
        return 2
    if on_dax != (spec.serving.fast_tier is not None):
        print(
            "error: serving.fast_tier: --baseline dax needs it (the flash tier), --baseline "
            "fs runs without it; set it or pick the other baseline",
            file=sys.stderr,
        )
        return 2
    if ns.demand_ratio is not None and (not on_dax or any(r <= 0 for r in ns.demand_ratio)):
        ap.error(f"--demand-ratio {ns.demand_ratio}: --baseline dax only, each > 0")
    ratios: list[float | None] = [None]
    if on_dax:
        ratios = list(ns.demand_ratio or device.default_ratios(spec))
    run_dir = Path(tempfile.mkdtemp(prefix="tk-fig6-"))
    run = spec.serving
    print(f"run dir {run_dir}; {ns.repeats} repeats; rates {rates}; demand ratios {ratios}; "
          f"{run.num_requests} requests per cell; orders {arm_orders(ns.repeats, arms)}",
          flush=True)  # fmt: skip
    prep = prepare(spec, run_dir / "canonical")
    odirect = not on_dax and odirect_allowed(run_dir / "canonical" / "stack" / "l2-fs")
    by_ratio: dict[float | None, Cells] = {r: [] for r in ratios}
    deployments: dict[str, list[Any]] = {}
    probes: dict[float, Any] = {}

    def tagged(r: float | None) -> str:
        return "" if r is None else f"ratio={r:g} "

    def body(w: Any) -> tuple[dict[str, Any], list[Check]]:
        if on_dax:  # the device measured before any cell, at every ratio
            probes.update(device.measure_device(spec, ratios, run_dir / "probe"))  # type: ignore[arg-type]
            print("\n".join(device.device_lines(spec, probes)), flush=True)
        for k, order in enumerate(arm_orders(ns.repeats, arms)):
            got = {arm: run_arm(spec, arm, run_dir / f"r{k}-{arm}", rates, prep, k,
                                deployments, ratios) for arm in order}  # fmt: skip
            for r in ratios:
                by_ratio[r].append({arm: got[arm][r] for arm in arms})
        checks: list[Check] = []
        for r, cells in by_ratio.items():
            for p in bench_points(rates, cells, arms, r):
                w.add_point(p)
            checks += claim_checks(rates, cells, "tempokv", base, tagged(r))
        summary = {"rates": rates, "arms": list(arms), "repeats": ns.repeats,
                   "baseline": ns.baseline, "demand_ratios": ratios,
                   "orders": [list(o) for o in arm_orders(ns.repeats, arms)]}  # fmt: skip
        if on_dax:
            summary["deployments"] = deployments
            summary["fast_tier_cells"] = {f"{r:g}": tier_cells(rates, c, arms)
                                          for r, c in by_ratio.items()}  # fmt: skip
            summary["device"] = device.summary(spec, probes)
        return summary, checks

    bench_args = {**vars(ns), "spec": spec.model_dump(mode="json"), "rates": rates}
    try:
        verdict, evidence = run_bench("tempokv_fig6_serving", ns.evidence, bench_args,
                                      {"kind": "serving"}, body)  # fmt: skip
    except StackFailed as e:
        print(f"FAILURE: stack failed: {e}", flush=True)
        return 3
    print(f"# evidence {evidence} ({verdict}); timeline {evidence / 'timeline.json'}")
    print()
    spans = spans_of(read_spans(evidence))
    pids = arm_pids(run_dir)
    print("\n".join(ttft_lines(where_ttft_went(spans, pids))))
    if on_dax:
        print("\n".join(device.device_lines(spec, probes)))
    finals = []
    for r, cells in by_ratio.items():
        if on_dax:
            print(f"\n== demand ratio {r:g} ==")
            print("\n".join(dax.ratio_report(spec, rates, cells, arms, spans, pids, run_dir,
                                             r, probes.get(r), ns.timeline_rate)))  # fmt: skip
        print()
        print("\n".join(table(rates, cells, "tempokv", base)))
        for extra_arm in arms[len(ARMS) :]:
            print()
            print("\n".join(table(rates, cells, extra_arm, base)))
        print()
        checks = claim_checks(rates, cells, "tempokv", base)
        print("\n".join(claims(rates, cells, "tempokv", base)))
        if on_dax:
            print(dax.paper_line())
            print("\n".join(dax.goal_lines(rates, cells, checks)))
        finals.append(tagged(r) + last_line(rates, cells, "tempokv", base, "").strip())
    if on_dax and len(by_ratio) > 1:
        print()
        print("\n".join(device.decomposition_lines(rates, by_ratio, "tempokv", base)))  # type: ignore[arg-type]
    print(f"\n{run.arrivals.process} arrivals (burstiness {run.arrivals.burstiness}, seed "
          f"{run.arrivals.seed}), {run.turns} turn(s), SLO TTFT {run.slo_ttft_s} s")  # fmt: skip
    ft = run.fast_tier
    tier = (f"flash tier {ft.fast_tier_mib} MiB, staging {ft.flash_mib_s} MiB/s, demand "
            f"ratios {ratios}" if ft else f"shaped L2 {run.l2_bandwidth_mib_s} MiB/s "
            f"(O_DIRECT {odirect})")  # fmt: skip
    print(f"\nmedians over {ns.repeats} repeats, {run.num_requests} requests per cell; {tier}, "
          f"budget {run.budget_mib} MiB, run dir {run_dir}")  # fmt: skip
    bad = [(r, k, arm, rate) for r, cs in by_ratio.items() for k, c in enumerate(cs)
           for arm in arms for rate in rates
           if c[arm][rate].canonical != c[arm][rate].requests]  # fmt: skip
    final = ("fig6-dax " if on_dax else "fig6 ") + " | ".join(finals)
    if bad:
        print(f"FAILURE: non-canonical outputs in (ratio, repeat, arm, rate) {bad}", flush=True)
        print(final)
        return 1
    print(f"all outputs canonical in every arm ({', '.join(arms)})")
    print(final)
    return 0


if __name__ == "__main__":
    sys.exit(main())
