"""The `bsrctl tempokv` spec (YAML, extra="forbid"). Each experiment kind is one of the
paper's: a policy grid (Figures 4 and 5), a staging-lead sweep (Figure 1) or a queue-rank
grid (Figure 2). Defaults are the paper's setup; which numbers are calibrated is stated on
each field."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from bsrctl.spec_io import Strict, load_spec
from bsrctl.specs import StackSpec
from bsrctl.tempokv.flash_spec import FastTierSpec
from bsrctl.tempokv.serving_workload import ArrivalSpec
from bsrctl.tempokv.sim.models import CATALOGUE
from bsrkv.tempokv.policies import POLICY_NAMES, TTU_QUANTILE

# The paper's 12 NarrativeQA documents are not redistributable: lengths spanning its
# 16,078–67,744 tokens, four per length group, interleaved (synthetic, not calibrated).
PAPER_DOCS_TOKENS = [34600, 16078, 63900, 20300, 41300, 59700, 17500, 31200, 67744, 18900,
                     55800, 37900]  # fmt: skip


class ModelSpec(Strict):
    name: str = Field(description="a catalogued model profile")
    step_overhead_s: float | None = Field(
        None, ge=0, description="per-step scheduling/launch overhead; calibrated on Figure 5"
    )

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in CATALOGUE:
            raise ValueError(f"unknown model {name!r}; valid: {', '.join(CATALOGUE)}")
        return name


class DeviceSpec(Strict):
    staging_gib_s: float = Field(11.0, gt=0, description="SSD→fast tier, one op (paper)")
    contention: float = Field(
        0.173,
        ge=0,
        description="aggregate falls as 1/(1+c·(n−1)) with n reads on the device; 0.173 from "
        "Fig. 2's −6.02 s cell (44 GiB over five ops stage-ready at 6.52 s), see sim/device.py",
    )
    concurrency: int = Field(
        1,
        ge=1,
        description="staging ops the provider keeps in flight, in issue order, sharing the "
        "aggregate rate (§3.1); 1 (FIFO) maximises the aggregate under contention; Fig. 2's "
        "−6.02 s margin needs its four-op backlog and the target in flight together (≥ 5)",
    )
    retrieval_gib_s: float = Field(16.1, gt=0, description="fast tier→GPU; calibrated, Fig. 1")
    fast_tier_gib: float = Field(100.0, gt=0)
    budget_fraction: float = Field(0.5, gt=0, le=1, description="protected budget / capacity")


class EngineSpec(Strict):
    max_seqs: int = Field(4, ge=1)
    max_batched_tokens: int = Field(8192, ge=1)
    loads: Literal["sync", "async", "queued"] = Field(
        "sync",
        description="sync: a step waits for the KV loads it carries (the batch stalls); "
        "async: loading requests hold a slot while the batch keeps stepping; queued: vLLM "
        "with LMCache's MP connector, loading requests wait outside the running set and a "
        "pass with a free slot starts loads for every waiting request that fits the GPU KV",
    )
    gpu_kv_gib: float | None = Field(
        None,
        gt=0,
        description="queued loads: GPU KV capacity; default from the model (80 GB H100 at "
        "vLLM's 0.9 utilisation, less weights and activations), see sim/models.py",
    )
    release: Literal["first_step", "transfer_end"] = Field(
        "first_step",
        description="when protection ends: after the first step computing over the restored "
        "KV, or as soon as its fast tier→GPU transfer ends",
    )
    chunk_tokens: int = Field(256, ge=1)


class ControlSpec(Strict):
    tick_s: float = Field(0.05, ge=0, description="periodic re-evaluation; 0 disables")
    rate_prior_s: float = Field(1.0, gt=0, description="weight of the calibrated staging rate")
    output_prior_samples: int = Field(
        32, ge=0, description="calibration completions seeding the TTU output predictor"
    )
    ttu_quantile: float = Field(
        TTU_QUANTILE,
        gt=0,
        le=1,
        description="TempoKV-U commits when this quantile of its TTU distribution reaches "
        "TTR; one default for every figure, from `python bench/tempokv/u_quantile.py`",
    )
    crossing_wakeup: bool = Field(
        False,
        description="also re-evaluate when a claim's laxity is predicted to reach 0 (the "
        "paper's controller has events and the tick only, so a commitment may land up to "
        "one tick after the crossing)",
    )


class OutputSpec(Strict):
    max_tokens: int = Field(128, ge=1, description="generation limit")
    eos_fraction: float = Field(
        0.05, ge=0, le=1, description="requests ending early on EOS; calibrated on Figure 5"
    )
    min_tokens: int = Field(16, ge=1)

    @model_validator(mode="after")
    def _order(self) -> OutputSpec:
        if self.min_tokens >= self.max_tokens:
            raise ValueError("min_tokens must be below max_tokens; lower min_tokens")
        return self


class FixedArrivals(Strict):
    kind: Literal["fixed"] = "fixed"
    interval_s: float = Field(0.5, ge=0)


class PoissonArrivals(Strict):
    kind: Literal["poisson"]
    rate_rps: float = Field(gt=0)
    num_requests: int = Field(gt=0)


class TraceArrivals(Strict):
    kind: Literal["trace"]
    path: Path = Field(description="JSON lines: arrival_s, doc, prompt_tokens[, output_tokens]")


Arrivals = Annotated[FixedArrivals | PoissonArrivals | TraceArrivals, Field(discriminator="kind")]


class WorkloadSpec(Strict):
    documents_tokens: list[int] = Field(
        default_factory=lambda: list(PAPER_DOCS_TOKENS), min_length=1
    )
    question_tokens: int = Field(24, ge=0)
    arrivals: Arrivals = FixedArrivals()
    output: OutputSpec = OutputSpec()


class Expectation(Strict):
    """What the run expects of one of the paper's claims: that it reproduces, or that it
    does not (a declared deviation, with the measured reason in one line)."""

    expect: Literal["reproduce", "deviation"] = Field(
        description="reproduce: the claim must hold; deviation: it is known not to hold here"
    )
    reason: str | None = Field(None, description="one line; required for a deviation")

    @model_validator(mode="after")
    def _reasoned(self) -> Expectation:
        if self.reason is not None and ("\n" in self.reason or not self.reason.strip()):
            raise ValueError("reason must be one non-empty line")
        if self.expect == "deviation" and self.reason is None:
            raise ValueError("a declared deviation needs a one-line reason; add reason")
        return self


class CReductionCheck(Expectation):
    at_least_pct: float = Field(
        description="TempoKV's C at least this % below Immediate's, every cell (the paper's "
        "63–91% is a range over cells; its claim is the lower end, one-sided)"
    )
    tolerance_pct: float = Field(
        0.0, ge=0, description="points below at_least_pct still accepted, stated in the spec"
    )


class P95BelowDemandCheck(Expectation):
    tolerance_pct: float = Field(
        0.0, ge=0, description="TempoKV's p95 TTFT may be this % above Demand's and pass"
    )


class BestAtFastTierCheck(Expectation):
    fast_tier_gib: float = Field(gt=0, description="the sweep size the claim is about")
    tolerance_pct: float = Field(
        0.0, ge=0, description="within this % of the best of the paper's other five still counts"
    )


class FlatAcrossFastTierCheck(Expectation):
    tolerance_pct: float = Field(
        ge=0,
        description="TempoKV's throughput and p95 TTFT within this % of their values "
        "at the largest fast tier, at every size",
    )


class PolicyAcceptance(Strict):
    c_reduction_vs_immediate: CReductionCheck | None = None
    p95_below_demand: P95BelowDemandCheck | None = None
    best_at_fast_tier: BestAtFastTierCheck | None = None
    flat_across_fast_tier: FlatAcrossFastTierCheck | None = None


class PolicyGrid(Strict):
    kind: Literal["policies"]
    policies: list[str] = Field(default_factory=lambda: list(POLICY_NAMES), min_length=1)
    cache_ratios: list[Annotated[float, Field(gt=0, le=1)]] = Field(min_length=1)
    fast_tier_gib: list[Annotated[float, Field(gt=0)]] | None = Field(
        None, description="sweep sizes (budget = budget_fraction of each); default device's"
    )
    acceptance: PolicyAcceptance = PolicyAcceptance()

    @field_validator("policies")
    @classmethod
    def _known(cls, names: list[str]) -> list[str]:
        for name in names:
            if name not in POLICY_NAMES:
                raise ValueError(f"unknown policy {name!r}; valid: {', '.join(POLICY_NAMES)}")
        if len(set(names)) != len(names):
            raise ValueError("a policy is listed twice; list each once")
        return names


class PlateauCheck(Expectation):
    plateau_from_s: float = Field(1.0, ge=0, description="latency flat from this lead on")
    plateau_tolerance: float = Field(0.05, ge=0, description="relative spread allowed")


class LeadAcceptance(Strict):
    latency_non_increasing: Expectation | None = None
    latency_falls_then_plateaus: PlateauCheck | None = None
    byte_time_grows_with_lead: Expectation | None = None


class LeadSweep(Strict):
    """Figure 1: one SSD-resident prefix, staging started lead_s before submission."""

    kind: Literal["lead"]
    leads_s: list[Annotated[float, Field(ge=0)]] = Field(min_length=2)
    doc_tokens: int = Field(65536, gt=0)
    acceptance: LeadAcceptance = LeadAcceptance()


class RankAcceptance(Strict):
    rank_is_not_a_deadline: Expectation | None = None
    backlog_flips_early_to_late: Expectation | None = None


class RankGrid(Strict):
    """Figure 2: the sole waiter behind one running predecessor, staged at rank one."""

    kind: Literal["rank"]
    predecessor_s: list[Annotated[float, Field(gt=0)]] = Field(min_length=1)
    footprint_gib: list[Annotated[float, Field(gt=0)]] = Field(min_length=1)
    backlog_ops: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)
    backlog_op_gib: float = Field(8.0, gt=0)
    acceptance: RankAcceptance = RankAcceptance()


Experiment = Annotated[PolicyGrid | LeadSweep | RankGrid, Field(discriminator="kind")]


# The deployment a serving run gets where its `stack:` says nothing: the shorthands below
# (max_num_seqs, engine_cpus, l1_mib) fill their stack fields, and prompts up to 8192 tokens.
SERVING_MAX_MODEL_LEN = 8192


def _mib_to_bytes(m: Any) -> Any:
    """MiB to bytes; anything else is left for the fields' own validation to name."""
    return m * (1 << 20) if isinstance(m, int | float) and not isinstance(m, bool) else m


SHORTHANDS = {  # shorthand -> (section, field, to the stack's unit)
    "max_num_seqs": ("vllm", "max_num_seqs", lambda n: n),
    "engine_cpus": ("vllm", "cpu_threads_bind", lambda c: c),
    "l1_mib": ("lmcache", "l1_size_bytes", _mib_to_bytes),
}


class ServingRun(Strict):
    """`--stack serving`: the policy grid on real vLLM + LMCache (the stack's model and
    device; the shipped spec serves the tiny model on CPU). A fast tier of MiBs over a
    shaped FS L2 stands in for the paper's GiBs; prompts are made locally (no hub);
    arrivals at a fixed interval or seeded Poisson (`arrivals`), documents reused across
    `turns`; one stack shared by every policy.

    `stack` is the deployment (model, chunk size, max_model_len, ...: the one home of
    each); `max_num_seqs`, `engine_cpus` and `l1_mib` are shorthands for three of its
    fields, and a spec may set either, not both to different values."""

    documents_tokens: list[Annotated[int, Field(ge=256)]] = Field(
        default_factory=lambda: [3072, 2048, 4096, 2560, 3072, 2048, 4096, 2560],
        min_length=1,
        description="request i reads document i mod n; a document repeated while vLLM still "
        "holds it locally is a local prefix hit (no external retrieval, its claim wasted)",
    )
    question_tokens: int = Field(32, ge=1)
    num_requests: int = Field(8, ge=1)
    interval_s: float = Field(0.5, ge=0, description="mean time between two requests sent")
    arrivals: ArrivalSpec = Field(default_factory=ArrivalSpec)
    turns: int = Field(
        1,
        ge=1,
        le=64,
        description="turns per conversation: turn t's prompt is its document and the "
        "questions of turns 0..t, sent one round after turn t-1 (serving_workload.py)",
    )
    slo_ttft_s: float | None = Field(
        None, gt=0, description="TTFT bound of the goodput measures (None: not measured)"
    )
    max_tokens: int = Field(16, ge=1)
    l2_bandwidth_mib_s: float = Field(
        16.0, gt=0, description="shaped FS L2 read rate (the SSD stand-in)"
    )
    l2_latency_s: float = Field(0.005, ge=0, description="shaped FS L2 latency per load")
    l1_mib: int = Field(256, gt=0, description="LMCache L1 (the fast tier)")
    budget_mib: float = Field(8.0, gt=0, description="protected-capacity budget")
    claims_k: int = Field(
        16,
        ge=1,
        description="the runtime adapter claims the first K waiting requests. With LMCache's "
        "MP connector a request not among the first K when it arrives is never claimed (vLLM "
        "looks it up in the same pass that brings it into the first K), so K should cover "
        "the longest waiting queue",
    )
    step_base_s: float = Field(0.02, gt=0, description="TTU cost model prior, calibrated live")
    token_s: float = Field(5e-5, ge=0)
    max_num_seqs: int = Field(2, ge=1, description="vLLM slots (a queue forms behind them)")
    engine_cpus: str | None = Field(
        None,
        description="cores vLLM computes on (VLLM_CPU_OMP_THREADS_BIND, e.g. '0-6'); default: "
        "every core but the last, left to LMCache's staging, the API server and the client, so "
        "that a policy which stages more does not also slow the engine (on a GPU node the "
        "engine never shares its device with staging)",
    )
    repeats: int = Field(
        1,
        ge=1,
        description="the whole policy grid again on the same stack (order reversed "
        "every other repeat); measures and checks pool every repeat's requests",
    )
    retrieval_bytes_s: float = Field(
        1e9,
        gt=0,
        description="fast tier → engine rate the adapter's TTU projection assumes for a "
        "claimed request's load (and the sim cross-check's retrieval rate)",
    )
    stack: StackSpec = Field(
        default_factory=lambda: StackSpec.model_validate(_stack_of({})),
        description="the deployment; unset fields: the shorthands', max_model_len 8192, "
        "else StackSpec's defaults (the tiny model, 256-token chunks)",
    )
    registration: str | dict[str, Any] = Field(
        "auto",
        description="the served model's KV registration, as the restore specs name it "
        "('auto' derives it from stack.vllm.model's config.json, TP and dtypes; a preset, a "
        "registration YAML file or one inline): the adapter's KV bytes per token",
    )
    fast_tier: FastTierSpec | None = Field(
        None,
        description="L1 on a memory-semantic flash tier (the paper's §5.3) instead of "
        "DRAM L1 + shaped FS L2: l1_mib and the l2_* fields do not apply; budget_mib within it",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_stack(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {**data, **_shorthands_of(data), "stack": _stack_of(data)}

    @model_validator(mode="after")
    def _budget_fits(self) -> ServingRun:
        ft = self.fast_tier
        if ft is not None and self.budget_mib > ft.fast_tier_mib:
            raise ValueError(
                f"budget_mib {self.budget_mib} exceeds fast_tier.fast_tier_mib "
                f"{ft.fast_tier_mib}: protection lives in the fast tier; lower it"
            )
        return self

    @model_validator(mode="after")
    def _prompts_fit(self) -> ServingRun:
        longest = max(self.documents_tokens) + self.turns * self.question_tokens + self.max_tokens
        if longest > self.stack.vllm.max_model_len:
            raise ValueError(
                f"the longest prompt (largest of documents_tokens + turns x question_tokens) "
                f"and max_tokens need {longest} tokens > stack.vllm.max_model_len "
                f"{self.stack.vllm.max_model_len}; raise it or shorten documents_tokens/turns"
            )
        return self


def _shorthands_of(data: dict[str, Any]) -> dict[str, Any]:
    """Each shorthand as the stack sets it (the stack's value wins where only it is set)."""
    stack = data.get("stack") or {}
    out = {}
    for short, (section, name, _to) in SHORTHANDS.items():
        given = (stack.get(section) or {}) if isinstance(stack, dict) else {}
        if short not in data and isinstance(given, dict) and name in given:
            v = given[name]
            out[short] = v // (1 << 20) if short == "l1_mib" and isinstance(v, int) else v
    return out


def _stack_of(data: dict[str, Any]) -> Any:
    """The run's `stack:` with the shorthands and the serving defaults filled in; a
    shorthand and its stack field both set to different values is an error naming both."""
    stack = data.get("stack")
    if stack is not None and not isinstance(stack, dict):
        return stack  # StackSpec's own validation names what is wrong
    stack = {k: dict(v) if isinstance(v, dict) else v for k, v in (stack or {}).items()}
    fields = ServingRun.model_fields
    for short, (section, name, to) in SHORTHANDS.items():
        part = stack.setdefault(section, {})
        if not isinstance(part, dict):
            continue
        value = data.get(short, fields[short].default)
        if short in data and name in part and part[name] != to(value):
            raise ValueError(
                f"{short} {value!r} and stack.{section}.{name} {part[name]!r} both set the "
                f"deployment's {name}; set one"
            )
        part.setdefault(name, to(value))
    vllm = stack["vllm"]
    if isinstance(vllm, dict):
        vllm.setdefault("max_model_len", SERVING_MAX_MODEL_LEN)
    return stack


class TempoKVSpec(Strict):
    kind: Literal["tempokv"] = "tempokv"
    name: str = Field("tempokv", min_length=1)
    seed: int = 7
    models: list[ModelSpec] = Field(min_length=1)
    device: DeviceSpec = DeviceSpec()
    engine: EngineSpec = EngineSpec()
    control: ControlSpec = ControlSpec()
    workload: WorkloadSpec = WorkloadSpec()
    serving: ServingRun = ServingRun()
    experiment: Experiment


def load(path: Path) -> tuple[TempoKVSpec, dict]:
    """Validate; BadInput (exit 2) with one line naming the field and the fix."""
    return load_spec(path, TempoKVSpec)
