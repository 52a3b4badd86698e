"""`bsrctl tempokv SPEC --stack serving`: the policy grid on real vLLM + LMCache.

One deployment for every policy (a ``LaunchedDeployment`` of ``make_deployment``, TempoKV's
shaped L2 and runtime adapter through its ``extend`` hook): vLLM schedules with the TempoKV
runtime adapter (``bsrkv.vllm_ext.scheduler``), the LMCache server runs the controller and
provider in bsrctl's server module (``tempokv.configure`` switches the policy between runs),
its FS L2 is shaped to the spec's SSD rate (O_DIRECT where the filesystem takes it). The
run's lifecycle holds the deployment: the body brings it up, ``down`` is the teardown. The
documents are seeded into L2 once; before each policy L1 and vLLM's prefix cache forget,
then the spec's requests (document prefix + the conversation's questions so far, made
locally) arrive at a fixed interval or as seeded Poisson arrivals (``serving_workload``).

Per policy: every output against the canonical one (a connector-less vLLM), protected bytes
sampled from the locked objects against the budget, C integrated from those samples (byte·s
per request), p95 TTFT (client side, streamed), output throughput, goodput within
``serving.slo_ttft_s`` when set, and the TTR estimate at
each commitment against the measured time to stage-ready. The run's two orderings (C below
Immediate's, p95 TTFT below Demand's) are decided on the policies' paired repeats (the
interval of the per-repeat ratio: ``expectations.ordering_claim``), so ``serving.repeats``
of 1 reads UNKNOWN ("cannot test significance"), never a PASS from one sample.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bsrctl.evidence import EvidenceWriter, Verdict
from bsrctl.evidence.guards import with_guards
from bsrctl.evidence.verdict import Point, check
from bsrctl.experiments.run import Progress
from bsrctl.prompts import prompt_ids
from bsrctl.specs import StackSpec, resolve_registration
from bsrctl.stack.contracts.bsr_client import BsrModuleClient
from bsrctl.stack.contracts.deployment import Deployment
from bsrctl.stack.contracts.guards import GuardWatch
from bsrctl.stack.launch import profile
from bsrctl.stack.launch.extensions import (
    L1Options,
    L2Device,
    LMCacheExtensions,
    TempoKVLaunch,
    odirect_allowed,
)
from bsrctl.stack.launch.model import prepare_model
from bsrctl.stack.launch.serving import ServingStack
from bsrctl.stack.measure.canonical_outputs import canonical_outputs
from bsrctl.stack.measure.seeding import seed_tiers
from bsrctl.stack.selector import make_deployment
from bsrctl.tempokv.experiments import calls, flash
from bsrctl.tempokv.experiments.adapter_cost import adapter_cost, read_trace
from bsrctl.tempokv.experiments.expectations import JudgedCheck
from bsrctl.tempokv.experiments.expectations import run_checks as _run_checks
from bsrctl.tempokv.experiments.pooled import pool, quantile, run_order
from bsrctl.tempokv.measures import RepeatMeasures
from bsrctl.tempokv.serving_workload import (
    Goodput,
    arrival_offsets,
    conversation_plan,
    goodput,
    question_salts,
)
from bsrctl.tempokv.spec import PolicyGrid, ServingRun, TempoKVSpec
from bsrkv.settings import RestoreSettings, RestoreTuning
from bsrkv.tempokv import wire
from bsrkv.tempokv.live import AdapterSettings
from bsrkv.tempokv.ttu import CostModel

MIB = 1 << 20
TRACE = "adapter-trace.jsonl"  # the vLLM adapter's step trace, in the run folder
LIVE_POLICIES_EXCLUDED = {"oracle": "needs the run's future: simulation only"}
# The server module's config: whole-plan restores (W = 0), the default timeouts; TempoKV's
# own settings go over tempokv.configure per policy.
SETTINGS = RestoreSettings.of(RestoreTuning(), 0)


def _prompts(run: ServingRun, vocab: int, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """The documents, and each request's prompt: its document, then its conversation's
    questions so far (``serving_workload.conversation_plan``; one turn: one question)."""
    docs = [prompt_ids(f"tk-doc-{seed}-{i}", n, vocab) for i, n in enumerate(run.documents_tokens)]
    plan = conversation_plan(run.num_requests, len(docs), run.turns)
    reqs = [
        docs[t.doc] + [x for q in question_salts(seed, t)
                       for x in prompt_ids(q, run.question_tokens, vocab)]
        for t in plan
    ]  # fmt: skip
    return docs, reqs


def _p95(xs: list[float]) -> float:
    return quantile(xs, 0.95)


def engine_cpus_default(cpus: int) -> str | None:
    """Every core but the last for the engine; one core: nothing to leave, vLLM's default."""
    if cpus < 2:
        return None
    return "0" if cpus == 2 else f"0-{cpus - 2}"


def kv_bytes_per_token(stack: StackSpec, registration: str | dict[str, Any] = "auto") -> int:
    """KV bytes per token over every rank, from the deployment's registration (``auto``:
    derived from its model's config.json, TP, dtype, KV dtype and chunk size, as the restore
    runs do; or a preset or declared one, ``serving.registration``)."""
    tp, chunk = stack.vllm.tensor_parallel_size, stack.lmcache.chunk_size
    tp_field = "serving.stack.vllm.tensor_parallel_size"
    reg = resolve_registration(registration, stack, tp, chunk, tp_field)
    return reg.bytes_per_chunk_all_ranks // reg.chunk_tokens


def stack_spec(run: ServingRun) -> StackSpec:
    """The run's stack (on the flash tier: L1 the arena, no L2); on CPU its engine off the
    last core unless the spec binds it (a GPU engine shares no core with staging)."""
    stack = flash.flash_stack(run.stack, run)
    if stack.device != "cpu" or stack.vllm.cpu_threads_bind:
        return stack
    bind = engine_cpus_default(os.cpu_count() or 1)
    return stack.model_copy(
        update={"vllm": stack.vllm.model_copy(update={"cpu_threads_bind": bind})}
    )


def adapter_settings(spec: TempoKVSpec, stack: StackSpec) -> AdapterSettings:
    """The runtime adapter's settings: the run's, its deployment's chunk and KV geometry."""
    run = spec.serving
    return AdapterSettings(
        k=run.claims_k,
        needs_ttu=True,
        # TTU precision below the controller's tick moves no commitment by more than a tick
        ttu_tolerance_s=spec.control.tick_s,
        output_limit_tokens=run.max_tokens,
        chunk_tokens=stack.lmcache.chunk_size,
        retrieval_bytes_s=run.retrieval_bytes_s,
        kv_bytes_per_token=kv_bytes_per_token(stack, run.registration),
        cost=CostModel(run.step_base_s, run.token_s, 0.0, 0.0),
    )


def deployment_for(
    spec: TempoKVSpec,
    run_dir: Path,
    with_adapter: bool = True,
    launch: Callable[[TempoKVLaunch], TempoKVLaunch] | None = None,
    l1: L1Options | None = None,
) -> tuple[Deployment, dict[str, Any]]:
    """The run's deployment (not started: ``up`` it, ``down`` it) and what the evidence
    records of it. ``make_deployment`` of the run's stack with BSR's server module, and
    beyond it (``extend``) the shaped FS L2 and the TempoKV launch; ``with_adapter=False``
    leaves TempoKV out (stock vLLM scheduler and stock LMCache options, same server module
    and shaped L2): Figure 6's unmodified-LMCache baseline. ``launch`` changes the TempoKV
    launch (Figure 6's adapter-local arm); ``l1`` sets LMCache's L1 options whatever runs
    (Figure 6's stock arm with TempoKV's ``retain`` and read TTL)."""
    run, run_dir = spec.serving, Path(run_dir)
    stack = stack_spec(run)
    adapter = adapter_settings(spec, stack)
    tier = flash.fast_tier_config(run)
    odirect = tier is None and odirect_allowed(run_dir / "stack" / "l2-fs")
    device = None if tier else L2Device(run.l2_bandwidth_mib_s * MIB, run.l2_latency_s, odirect)
    # vLLM's scheduling as the spec's device resolves it: the adapter's class matches it
    async_on = profile.async_scheduling(stack)
    trace = str(run_dir / TRACE)
    tk = TempoKVLaunch(adapter, trace_path=trace, async_scheduling=async_on)
    tempokv = (tk if launch is None else launch(tk)) if with_adapter else None

    def extend(ext: LMCacheExtensions) -> LMCacheExtensions:
        return replace(ext, l2_device=device, tempokv=tempokv, l1=l1, fast_tier=tier)

    info = {
        "odirect": odirect,
        "fast_tier": None if tier is None else vars(tier),
        "kv_bytes_per_token": adapter.kv_bytes_per_token,
        "adapter": wire.settings_to_json(adapter),
        "async_scheduling": async_on,
        "scheduler_cls": tempokv.scheduler_cls if tempokv is not None else None,
    }
    return make_deployment(stack, run_dir, SETTINGS, extend=extend), info


@dataclass(frozen=True)
class Prepared:
    """A serving workload ready to run: its prompts and the canonical output of every
    request."""

    docs: list[list[int]]
    reqs: list[list[int]]
    canonical: list[tuple[int, ...]]


def prepare(spec: TempoKVSpec, run_dir: Path, say: Progress = lambda _m: None) -> Prepared:
    """The run's prompts (below its model's vocabulary) and their canonical outputs, from
    the one model preparation and canonical cache every serving experiment uses."""
    run = spec.serving
    stack = stack_spec(run)
    docs, reqs = _prompts(run, prepare_model(stack.vllm).vocab, spec.seed)
    say("canonical outputs (connector-less vLLM)")
    canonical = canonical_outputs(stack, Path(run_dir), reqs, run.max_tokens)
    return Prepared(docs, reqs, canonical)


def seed_documents(
    stack: ServingStack, client: BsrModuleClient, docs: list[list[int]]
) -> list[bool]:
    """Store every document into the FS L2, or on the flash tier into the arena (then the
    tier is sealed: ``flash.seed_flash``); whether each is whole there."""
    if stack.extensions is not None and stack.extensions.fast_tier is not None:
        chunk = stack.spec.lmcache.chunk_size
        per_chunk = kv_bytes_per_token(stack.spec) * chunk
        whole, sealed = flash.seed_flash(stack, client, docs, chunk, per_chunk)
        stack.sealed = sealed  # the tier's base and limit, for the evidence
        return whole
    return [
        seed_tiers(stack, client, doc, chunk_tokens=stack.spec.lmcache.chunk_size, tiers=("fs",),
                   max_tokens=1,
                   forget_first=False, forget_wait_s=30.0).complete
        for doc in docs
    ]  # fmt: skip


def run_serving(
    spec: TempoKVSpec,
    exp: PolicyGrid,
    dep: Deployment,
    info: dict[str, Any],
    writer: EvidenceWriter,
    say: Progress,
) -> tuple[dict[str, Any], list[JudgedCheck]]:
    """The policy grid on ``dep`` (from ``deployment_for``, with its ``info``): brought up
    here; the run's lifecycle takes it down (``dep.down`` is its teardown)."""
    run = spec.serving
    policies = [p for p in exp.policies if p not in LIVE_POLICIES_EXCLUDED]
    skipped = {p: LIVE_POLICIES_EXCLUDED[p] for p in exp.policies if p not in policies}
    prep = prepare(spec, writer.run_dir, say)
    reqs, canonical = prep.reqs, prep.canonical
    say("starting vLLM (TempoKV adapter) + LMCache (TempoKV controller, shaped L2)")
    dep.up(dep.settings)
    stack, client = dep.stack, dep.client
    assert client is not None
    seeds = seed_documents(stack, client, prep.docs)
    runs: dict[str, list[RepeatMeasures]] = {p: [] for p in policies}
    for rep in range(run.repeats):
        for policy in run_order(policies, rep):
            m = _policy_once(stack, client, spec, policy, rep, (reqs, canonical), writer, seeds)
            runs[policy].append(m)
            say(f"{policy} (repeat {rep + 1}/{run.repeats}): C={m.c_mib_s_per_req:.3f} "
                f"MiB·s/req p95={m.p95_ttft_s:.3f}s {m.output_tok_s:.1f} tok/s "
                f"canonical={m.canonical}")  # fmt: skip
    rows = {p: pool(runs[p]) for p in policies}
    trace = read_trace(writer.run_dir / TRACE)
    engines = [r for r in trace if r.get("kind") == "engine"]
    summary = {
        "experiment": "serving-policies",
        "spec_name": spec.name,
        "stack": info,
        "skipped_policies": skipped,
        "repeats": run.repeats,
        "policies": {p: row.to_json() for p, row in rows.items()},
        # the whole run's engine loop (seeding included): what the adapter took of it
        "adapter_cost": adapter_cost(trace),
        # vLLM as it resolved itself at its last start (scheduling, batch queue, KV pool):
        # beside the launch's decision in ``stack``, and the sim cross-check's KV pool
        "engine": engines[-1] if engines else None,
    }
    if stack.fast_tier is not None:  # the arena, cgroups, throttle, and the seal's base/limit
        summary["fast_tier"] = {**stack.fast_tier.describe(), "sealed": stack.sealed}
    return summary, _run_checks(rows)


def _policy_once(
    stack: ServingStack,
    client: BsrModuleClient,
    spec: TempoKVSpec,
    policy: str,
    rep: int,
    workload: tuple[list[list[int]], list[tuple[int, ...]]],
    writer: EvidenceWriter,
    seeds: list[bool],
) -> RepeatMeasures:
    """One policy over the spec's arrivals (prompts, canonical outputs), from a cold L1
    and prefix cache."""
    run = spec.serving
    reqs, canonical = workload
    budget = int(run.budget_mib * MIB)
    if run.fast_tier is not None:  # the flash copy stays: only its page cache is dropped
        cleared = flash.clear_cell(stack)
        before = flash.counters(stack)
    else:
        client.forget(wait_s=30.0)
        stack.forget_local()
    watch = GuardWatch(writer.run_dir / TRACE)  # LMCache's and vLLM's guards over the cell
    watch.start(client)
    calls.configure(client, calls.tempo_config(spec, policy))
    results = _arrivals(stack, reqs, run)
    time.sleep(0.3)  # the last retrieve's release reaches the controller
    status = calls.status(client)
    calls.configure(client, None)
    guards = watch.end(client)
    tier = None
    if run.fast_tier is not None:
        tier = {"cleared": cleared, **flash.cell_delta(before, flash.counters(stack))}
    if status is None:
        raise RuntimeError(f"tempokv.status after {policy}: TempoKV is off")
    return _measure(policy, rep, results, canonical, status, budget, writer, seeds,
                    run.slo_ttft_s, tier, guards)  # fmt: skip


def _arrivals(stack: ServingStack, reqs: list[list[int]], run: ServingRun) -> list[Any]:
    out: list[Any] = [None] * len(reqs)
    errors: list[BaseException] = []
    at = arrival_offsets(len(reqs), run.interval_s, run.arrivals)
    t0 = time.monotonic()

    def one(i: int) -> None:
        delay = t0 + at[i] - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        try:
            out[i] = stack.stream(reqs[i], run.max_tokens)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=stack.spec.vllm.request_timeout_s + (at[-1] if at else 0.0))
    if errors:
        raise errors[0]
    return out


def _measure(
    policy: str,
    rep: int,
    results: list[Any],
    canonical: list[tuple[int, ...]],
    status: wire.StatusReply,
    budget: int,
    writer: EvidenceWriter,
    seeds: list[bool],
    slo_ttft_s: float | None = None,
    tier: dict[str, Any] | None = None,
    guards: list[dict[str, Any]] | None = None,
) -> RepeatMeasures:
    """One policy's measures and checks as a point; ``tier``: the flash tier's cell (what
    clearing left, the cgroup and throttle counters before and after); ``guards``: the
    processes' guard failures over the cell (``extensions_healthy``)."""
    done = [r for r in results if r is not None]
    ttfts = [r.first_token_s - r.sent_s for r in done]
    makespan = max(r.done_s for r in done) - min(r.sent_s for r in done) if done else math.nan
    tokens = sum(len(r.output_token_ids) for r in done)
    same = [
        r is not None and r.output_token_ids == c for r, c in zip(results, canonical, strict=True)
    ]
    n = len(results)
    ttr = status.ttr
    errors = [r.stage_ready_s - r.ttr_est_s for r in ttr if r.stage_ready_s is not None]
    # TTU error: when retrieval was demanded after the commit, minus the TTU then (claims
    # committed with a TTU estimate: the timed policies)
    ttu_errors = [
        r.retrieval_s - r.ttu_est_s
        for r in ttr
        if r.ttu_est_s is not None and r.retrieval_s is not None
    ]
    raw = status.to_json()  # what the evidence keeps as the server sent it
    g = goodput_measures(results, slo_ttft_s, makespan)
    measures = RepeatMeasures(
        ttfts_s=tuple(round(t, 6) for t in ttfts),
        makespan_s=round(makespan, 6),
        output_tokens=tokens,
        p95_ttft_s=round(_p95(ttfts), 6),
        mean_ttft_s=round(sum(ttfts) / len(ttfts), 6) if ttfts else math.nan,
        output_tok_s=round(tokens / makespan, 3) if makespan > 0 else math.nan,
        c_byte_s=status.c_byte_s,
        c_mib_s_per_req=round(status.c_byte_s / MIB / max(1, n), 6),
        model_c_byte_s=status.model_c_byte_s,
        model_c_mib_s_per_req=round(status.model_c_byte_s / MIB / max(1, n), 6),
        peak_locked_bytes=status.peak_locked_bytes,
        peak_reserved_bytes=status.peak_reserved_bytes,
        budget_bytes=budget,
        canonical=sum(same),
        requests=n,
        committed=len(ttr),
        deferred_claims=status.deferred_claims,
        claims=len(status.claims),
        reports_dropped_since_start=raw["reports_dropped"],
        retrievals=raw["retrievals"],
        ttr_error_s=tuple(sorted(round(e, 6) for e in errors)),
        ttr_error_abs_p50_s=round(quantile([abs(e) for e in errors], 0.5), 6),
        ttr_error_abs_p95_s=round(quantile([abs(e) for e in errors], 0.95), 6),
        ttu_error_s=tuple(sorted(round(e, 6) for e in ttu_errors)),
        slo_ttft_s=None if g is None else g.slo_ttft_s,
        goodput_requests=None if g is None else g.good,
        goodput_share=None if g is None else g.share,
        goodput_req_s=None if g is None else g.req_s,
        flash_read_bytes=tier["flash_read_bytes"] if tier else None,
    )
    checks = (
        check("canonical_output", all(same), f"{sum(same)}/{n} outputs equal the canonical"),
        check(
            "protected_within_budget",
            measures.peak_locked_bytes <= budget,
            f"peak locked {measures.peak_locked_bytes} B ≤ budget {budget} B "
            f"(over {status.samples} samples)",
        ),
        check("seeded", all(seeds) or None, f"documents fully in L2: {seeds}"),
    )
    writer.add_point(
        with_guards(
            Point(
                id=f"serving/r{rep}/{policy}",
                params={"policy": policy, "repeat": rep, "requests": n},
                measures=measures.to_json(),
                checks=checks,
                extra={
                    "extra": {
                        "claims": raw["claims"],
                        "ttr": raw["ttr"],
                        "stages": raw["stages"],
                        "observed_stock_reads": raw["observed_stock_reads"],
                        **({"fast_tier": tier} if tier else {}),
                    }
                },
            ),
            guards,
        )  # fmt: skip
    )
    return measures


def goodput_measures(
    results: list[Any], slo_ttft_s: float | None, makespan: float
) -> Goodput | None:
    """The requests (of all sent) whose first token came within the SLO: their share and
    such requests per second of the makespan, rounded as the evidence keeps them; None
    without an SLO."""
    if slo_ttft_s is None:
        return None
    ttfts = [None if r is None else r.first_token_s - r.sent_s for r in results]
    g = goodput(ttfts, slo_ttft_s, makespan)
    return replace(g, share=round(g.share, 6), req_s=round(g.req_s, 6))


__all__ = ["Verdict", "deployment_for", "run_serving"]
