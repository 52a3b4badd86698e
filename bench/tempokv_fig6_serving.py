"""The paper's Figure 6 on the CPU serving stack: TempoKV against unmodified LMCache with the
fast tier as its L1 (LMCache-DAX: no adapter, no controller), across offered request rates.
Prints p95 TTFT and output throughput per rate and their ratios. Long-document prompts are
made locally (no hub).

    flock /work/heavy.lock python bench/tempokv_fig6_serving.py [--repeats R] [SPEC.yaml] [RATES...]

Two arms, each its own deployment, made by ``serving.deployment_for`` (the run's path:
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

Evidence: a ``bench`` run under ``--evidence`` (a point per arm and rate, each repeat's
p95 TTFT, tok/s and goodput as samples; the claims as the run's checks) with the run's
``timeline.json`` (every process's spans, per request), and per arm where the cells' TTFT
went: the mean milliseconds per request on each phase of their critical paths. Last line:
``fig6 tput tempokv/lmcache @2=R [lo, hi] ... p95 tempokv/lmcache @2=...``: per rate the
median of the per-repeat ratios with its 95 % bootstrap interval."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from bsrctl.errors import StackFailed
from bsrctl.evidence.verdict import Check, check
from bsrctl.experiments.bench import SEED, bench_point, run_bench
from bsrctl.experiments.tempokv import calls
from bsrctl.experiments.tempokv.expectations import ordering_claim
from bsrctl.experiments.tempokv.serving import (
    _arrivals,
    _p95,
    adapter_settings,
    deployment_for,
    prepare,
    seed_documents,
    stack_spec,
)
from bsrctl.spec_io import describe_error
from bsrctl.stack.bsr_client import outcomes_since
from bsrctl.stack.deployment import Deployment
from bsrctl.stack.extensions import TempoKVLaunch, odirect_allowed
from bsrctl.stats import paired_ratio_ci
from bsrctl.tempokv.serving_workload import goodput
from bsrctl.tempokv.spec import TempoKVSpec
from bsrctl.trace.collect import read_spans
from bsrctl.trace.timeline import (
    CLIENT_TTFT,
    by_request,
    critical_path,
    phase_totals,
    spans_of,
)

# the shipped serving workload (ladders/tempokv-serving.yaml: one slot, 12 documents, shaped
# L2, budget, claims_k), its interval replaced by each rate; its `repeats` is the grid's
DEFAULT_SPEC = Path(__file__).resolve().parents[1] / "ladders" / "tempokv-serving.yaml"
DEFAULT_RATES = (2.0, 4.0, 8.0, 12.0, 16.0)
ARMS = ("lmcache", "tempokv")
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
NAMES = {"tempokv": "TempoKV", ADAPTER_ARM: "adapter only", LOCAL_ARM: "adapter, no RPC",
         RETAIN_ARM: "stock + retain", THREADS_ARM: "stock, server 1 thread"}  # fmt: skip
SLOW_RETRIEVE_S = 0.1  # a retrieve this long is counted slow (the two modes: ms vs 0.24+ s)


def arm_orders(repeats: int, arms: tuple[str, ...] = ARMS) -> list[tuple[str, ...]]:
    """The arms' order in each repeat: AB, BA, AB, ... (drift over the run hits both)."""
    return [arms if k % 2 == 0 else arms[::-1] for k in range(repeats)]


@dataclass(frozen=True)
class Spread:
    median: float
    lo: float
    hi: float


def spread(xs: Sequence[float]) -> Spread:
    """Median, min and max of the per-repeat values (NaN when there are none)."""
    if not xs:
        return Spread(math.nan, math.nan, math.nan)
    return Spread(statistics.median(xs), min(xs), max(xs))


def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


@dataclass(frozen=True)
class Cell:
    p95_s: float
    tok_s: float
    canonical: int
    requests: int
    controller: str  # what tempokv.status said after the cell ("" for the baseline)
    goodput: float = math.nan  # share of requests with TTFT <= serving.slo_ttft_s (NaN: none)
    retrieves_s: tuple[float, ...] = ()  # each stock retrieve's time in the server (bsr.status)


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
        with_adapter=arm not in ("lmcache", RETAIN_ARM, THREADS_ARM),
        launch=launch,
        l1=l1 if arm == RETAIN_ARM else None,
    )
    return dep


def run_arm(
    spec: TempoKVSpec, arm: str, run_dir: Path, rates: Sequence[float], prep: Any, rep: int
) -> dict[float, Cell]:
    run = spec.serving
    dep = arm_deployment(spec, arm, run_dir)
    out: dict[float, Cell] = {}
    try:
        dep.up(dep.settings)
        stack, client = dep.stack, dep.client
        assert client is not None
        seeds = seed_documents(stack, client, prep.docs)
        if not all(seeds):
            print(f"FAILURE: repeat {rep} {arm}: documents not whole in L2: {seeds}", flush=True)
        for rate in rates:
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
            retrieves = tuple(o.restore_s for o in outcomes_since(before,
                              client.status().recent_outcomes) if o.mode == "stock")  # fmt: skip
            done = [r for r in res if r is not None]
            ttfts = [r.first_token_s - r.sent_s for r in done]
            span = max(r.done_s for r in done) - min(r.sent_s for r in done) if done else 0.0
            toks = sum(len(r.output_token_ids) for r in done)
            same = sum(
                r is not None and r.output_token_ids == c
                for r, c in zip(res, prep.canonical, strict=True)
            )
            slo = run.slo_ttft_s
            good = math.nan
            if slo is not None:
                all_ttfts = [None if r is None else r.first_token_s - r.sent_s for r in res]
                good = goodput(all_ttfts, slo, span).share
            cell = Cell(
                _p95(ttfts), toks / span if span > 0 else math.nan, same, len(res), controller,
                good, retrieves,
            )  # fmt: skip
            slow = [x for x in retrieves if x > SLOW_RETRIEVE_S]
            out[rate] = cell
            print(
                f"repeat {rep} {arm:7} rate {rate:g} rps: p95 TTFT {cell.p95_s:.3f}s "
                f"{cell.tok_s:.1f} tok/s {same}/{len(res)} canonical"
                + (f" goodput {good:.2f}" if slo is not None else "")
                + f" | retrieves {len(retrieves)} ({sum(retrieves):.2f} s), {len(slow)} over "
                f"{SLOW_RETRIEVE_S} s"
                + (f" ({min(slow):.2f}-{max(slow):.2f} s)" if slow else "")
                + (f" | {controller}" if controller else ""),
                flush=True,
            )
            if same != len(res):
                print(
                    f"FAILURE: repeat {rep} {arm} rate {rate:g}: only {same}/{len(res)} "
                    "outputs equal the canonical ones",
                    flush=True,
                )
    finally:
        dep.down()  # closes its client, stops every process by PID
    return out


def table(
    rates: Sequence[float], cells: list[dict[str, dict[float, Cell]]], arm: str = "tempokv"
) -> list[str]:
    name = NAMES[arm]
    lines = [
        f"| rate rps | LMCache p95 TTFT s | {name} p95 TTFT s | LMCache tok/s | {name} tok/s "
        f"| p95 {name}/LMCache median [min–max] | tput {name}/LMCache median [min–max] "
        f"| canonical LMCache, {name} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rate in rates:
        lm = [c["lmcache"][rate] for c in cells]
        tk = [c[arm][rate] for c in cells]
        p95 = spread([ratio(t.p95_s, m.p95_s) for m, t in zip(lm, tk, strict=True)])
        tput = spread([ratio(t.tok_s, m.tok_s) for m, t in zip(lm, tk, strict=True)])
        lines.append(
            f"| {rate:g} | {spread([c.p95_s for c in lm]).median:.3f} "
            f"| {spread([c.p95_s for c in tk]).median:.3f} "
            f"| {spread([c.tok_s for c in lm]).median:.1f} "
            f"| {spread([c.tok_s for c in tk]).median:.1f} "
            f"| {p95.median:.3f} [{p95.lo:.3f}–{p95.hi:.3f}] "
            f"| {tput.median:.3f} [{tput.lo:.3f}–{tput.hi:.3f}] "
            f"| {sum(c.canonical for c in lm)}/{sum(c.requests for c in lm)}, "
            f"{sum(c.canonical for c in tk)}/{sum(c.requests for c in tk)} |"
        )
    return lines


def claims(
    rates: Sequence[float], cells: list[dict[str, dict[float, Cell]]], arm: str = "tempokv"
) -> list[str]:
    """The paper's Figure 6 claims per rate, judged on the paired repeats (repeat k of both
    arms; ``expectations.ordering_claim``): ``arm``'s throughput >= LMCache's and its p95
    TTFT <= LMCache's, each PASS / FAIL / UNKNOWN with the ratio's 95 % interval."""
    return [f"claim {c.detail}" for c in claim_checks(rates, cells, arm)]


def claim_checks(
    rates: Sequence[float], cells: list[dict[str, dict[float, Cell]]], arm: str = "tempokv"
) -> list[Check]:
    """The claims as the run's checks (PASS, FAIL, or UNKNOWN while the interval straddles)."""
    out = []
    for rate in rates:
        lm = [c["lmcache"][rate] for c in cells]
        tk = [c[arm][rate] for c in cells]
        keys = [("tput", "a>=b", "tok_s"), ("p95", "a<=b", "p95_s")]
        if not any(math.isnan(c.goodput) for c in lm + tk):
            keys.append(("goodput", "a>=b", "goodput"))
        for what, claim, key in keys:
            name = f"{what} {arm}/lmcache @{rate:g}"
            a, b = [getattr(c, key) for c in tk], [getattr(c, key) for c in lm]
            got = ordering_claim(name, what, a, b, claim, name)
            out.append(check(name.replace(" ", "_"), got.reproduced, got.detail))
    return out


def bench_points(
    rates: Sequence[float], cells: list[dict[str, dict[float, Cell]]], arms: Sequence[str]
) -> list[Any]:
    """The bench's evidence: a point per (arm, rate), its per-repeat p95 TTFT, tok/s and
    goodput as samples (repeat order), every output checked against the canonical one."""
    out = []
    for arm in arms:
        for rate in rates:
            cs = [c[arm][rate] for c in cells]
            samples = {"p95_ttft_s": [c.p95_s for c in cs], "tok_s": [c.tok_s for c in cs],
                       "retrieve_s": [x for c in cs for x in c.retrieves_s]}  # fmt: skip
            if not any(math.isnan(c.goodput) for c in cs):
                samples["goodput"] = [c.goodput for c in cs]
            same, n = sum(c.canonical for c in cs), sum(c.requests for c in cs)
            canon = check("canonical_output", same == n, f"{same}/{n} outputs canonical")
            params = {"arm": arm, "rate_rps": rate}
            measures = {"canonical": same, "requests": n}
            out.append(bench_point(f"fig6/{arm}@{rate:g}", params, samples, measures, [canon]))
    return out


def last_line(
    rates: Sequence[float], cells: list[dict[str, dict[float, Cell]]], arm: str = "tempokv"
) -> str:
    """``fig6 tput tempokv/lmcache @2=R [lo, hi] ... p95 tempokv/lmcache @2=...``: the
    median of the per-repeat ratios with its 95 % bootstrap interval, per rate."""
    parts = []
    for what, key in (("tput", "tok_s"), ("p95", "p95_s")):
        per = []
        for rate in rates:
            a = [getattr(c[arm][rate], key) for c in cells]
            b = [getattr(c["lmcache"][rate], key) for c in cells]
            try:
                per.append(f"@{rate:g}={paired_ratio_ci(a, b, SEED).text(3)}")
            except ValueError as e:  # a NaN repeat (no request finished)
                per.append(f"@{rate:g}=n/a ({e})")
        parts.append(f"{what} {arm}/lmcache " + " ".join(per))
    return "fig6 " + " ".join(parts)


def arm_pids(run_dir: Path) -> dict[int, str]:
    """Every PID an arm's deployments launched (and their recorded children) -> the arm,
    from each ``r<k>-<arm>/stack/state.json``."""
    out: dict[int, str] = {}
    for d in sorted(run_dir.glob("r*-*")):
        state = d / "stack" / "state.json"
        if not state.is_file():
            continue
        arm = d.name.split("-", 1)[1]
        for part in json.loads(state.read_text()).get("launched", []):
            for pid in (part["pid"], *part.get("children", [])):
                out[pid] = arm
    return out


def where_ttft_went(
    spans: Sequence[Any], pids: dict[int, str]
) -> dict[str, tuple[int, float, dict[str, float]]]:
    """Per arm: (requests, mean TTFT ms, mean ms per phase) over the cells' streamed requests'
    critical paths (``trace.timeline``); a request is its servers' arm."""
    paths: dict[str, list[Any]] = {}
    for rid, mine in by_request(spans).items():
        arms = {pids[sp.pid] for sp in mine if sp.pid in pids}
        if len(arms) != 1 or not any(sp.name == CLIENT_TTFT for sp in mine):
            continue  # a seeding request (not streamed), or no server span of one arm
        path = critical_path(spans, rid)
        if path is not None:
            paths.setdefault(arms.pop(), []).append(path)
    return {
        arm: (len(ps), sum(p.ttft_ms for p in ps) / len(ps),
              {k: v / len(ps) for k, v in phase_totals(ps).items()})
        for arm, ps in sorted(paths.items())
    }  # fmt: skip


def ttft_lines(got: dict[str, tuple[int, float, dict[str, float]]], top: int = 6) -> list[str]:
    out = []
    for arm, (n, mean, phases) in got.items():
        parts = ", ".join(f"{k} {v:.0f}" for k, v in list(phases.items())[:top])
        out.append(f"where TTFT went, {arm}: {n} requests, mean {mean:.0f} ms: {parts} ms")
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
    return {**doc, "serving": serving}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs of both arms (≥ 1)")
    ap.add_argument(
        "--adapter-arm",
        action="store_true",
        help="a third arm: the TempoKV stack with the controller off (the adapter's own cost)",
    )
    ap.add_argument("args", nargs="*", help="[SPEC.yaml] [RATES...] (requests per second)")
    ap.add_argument(
        "--local-arm",
        action="store_true",
        help="a fourth arm: the adapter with no server call and no trace (controller off)",
    )
    ap.add_argument("--arrivals", choices=("fixed", "poisson"), help="serving.arrivals.process")
    ap.add_argument("--burstiness", type=float, help="serving.arrivals.burstiness (1: Poisson)")
    ap.add_argument("--arrival-seed", type=int, help="serving.arrivals.seed")
    ap.add_argument("--turns", type=int, help="serving.turns (documents reused across turns)")
    ap.add_argument("--slo-ttft-s", type=float, help="serving.slo_ttft_s (goodput's TTFT bound)")
    ap.add_argument(
        "--retain-arm",
        action="store_true",
        help="an arm: stock vLLM with TempoKV's LMCache options (retain, long read TTL)",
    )
    ap.add_argument(
        "--threads-arm",
        action="store_true",
        help="an arm: the stock arm with the LMCache server on one OpenMP thread",
    )
    ap.add_argument("--evidence", type=Path, default=Path("reports"), help="bench run under here")
    ns = ap.parse_args()
    arms = (
        ARMS
        + ((ADAPTER_ARM,) if ns.adapter_arm else ())
        + ((LOCAL_ARM,) if ns.local_arm else ())
        + ((RETAIN_ARM,) if ns.retain_arm else ())
        + ((THREADS_ARM,) if ns.threads_arm else ())
    )
    if ns.repeats < 1:
        ap.error(f"--repeats {ns.repeats}: give 1 or more")
    args = list(ns.args)
    raw = (
        yaml.safe_load(Path(args.pop(0)).read_text())
        if args and args[0].endswith(".yaml")
        else None
    )
    try:
        rates = [float(a) for a in args] or list(DEFAULT_RATES)
    except ValueError:
        ap.error(f"RATES {args}: give numbers (requests per second)")
    if any(r <= 0 for r in rates):
        ap.error(f"RATES {rates}: each must be > 0")
    try:
        spec = TempoKVSpec.model_validate(workload_overrides(
            raw or yaml.safe_load(DEFAULT_SPEC.read_text()), ns))  # fmt: skip
    except ValidationError as e:
        print(f"error: {describe_error(TempoKVSpec, e)}", file=sys.stderr)
        return 2
    run_dir = Path(tempfile.mkdtemp(prefix="tk-fig6-"))
    run = spec.serving
    print(f"run dir {run_dir}; {ns.repeats} repeats; rates {rates}; {run.num_requests} requests "
          f"per cell; orders {arm_orders(ns.repeats, arms)}", flush=True)  # fmt: skip
    prep = prepare(spec, run_dir / "canonical")
    odirect = odirect_allowed(run_dir / "canonical" / "stack" / "l2-fs")  # the arms' filesystem
    cells: list[dict[str, dict[float, Cell]]] = []

    def body(w: Any) -> tuple[dict[str, Any], list[Check]]:
        for k, order in enumerate(arm_orders(ns.repeats, arms)):
            got = {
                arm: run_arm(spec, arm, run_dir / f"r{k}-{arm}", rates, prep, k) for arm in order
            }
            cells.append(got)
        for p in bench_points(rates, cells, arms):
            w.add_point(p)
        summary = {"rates": rates, "arms": list(arms), "repeats": ns.repeats,
                   "orders": [list(o) for o in arm_orders(ns.repeats, arms)]}  # fmt: skip
        return summary, claim_checks(rates, cells)

    bench_args = {**vars(ns), "spec": spec.model_dump(mode="json"), "rates": rates}
    try:
        verdict, evidence = run_bench("tempokv_fig6_serving", ns.evidence, bench_args,
                                      {"kind": "serving"}, body)  # fmt: skip
    except StackFailed as e:
        print(f"FAILURE: stack failed: {e}", flush=True)
        return 3
    print(f"# evidence {evidence} ({verdict}); timeline {evidence / 'timeline.json'}")
    print()
    # per arm, from the run's own spans: mean ms per request on each phase of the critical path
    print("\n".join(ttft_lines(where_ttft_went(spans_of(read_spans(evidence)), arm_pids(run_dir)))))
    print()
    print("\n".join(table(rates, cells)))
    for extra in arms[len(ARMS) :]:
        print()
        print("\n".join(table(rates, cells, extra)))
    print()
    print("\n".join(claims(rates, cells)))
    print(f"\n{run.arrivals.process} arrivals (burstiness {run.arrivals.burstiness}, seed "
          f"{run.arrivals.seed}), {run.turns} turn(s), SLO TTFT {run.slo_ttft_s} s")  # fmt: skip
    print(f"\nmedians over {ns.repeats} repeats, {run.num_requests} requests per cell; shaped L2 "
          f"{run.l2_bandwidth_mib_s} MiB/s (O_DIRECT {odirect}), budget "
          f"{run.budget_mib} MiB, run dir {run_dir}")  # fmt: skip
    bad = [
        (k, arm, rate)
        for k, c in enumerate(cells)
        for arm in arms
        for rate in rates
        if c[arm][rate].canonical != c[arm][rate].requests
    ]
    if bad:
        print(f"FAILURE: non-canonical outputs in (repeat, arm, rate) {bad}", flush=True)
        print(last_line(rates, cells))
        return 1
    print(f"all outputs canonical in every arm ({', '.join(arms)})")
    print(last_line(rates, cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
