"""The runtime adapter against stock vLLM, side by side (``bench/tempokv/adapter_cost.py``):
every arm's deployment up at once (``CostArm``: what of the adapter it runs), then rounds of
one cell per arm at the same rate, the arms' order rotated and reversed round by round, so
drift and an idle neighbour stack hit every arm alike; each arm's throughput against the
stock arm's of the same round is a paired sample (``cost_ratios``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil

from bsrctl import stats
from bsrctl.stack.contracts.deployment import Deployment
from bsrctl.stack.launch.extensions import TempoKVLaunch
from bsrctl.tempokv.experiments import calls
from bsrctl.tempokv.experiments.engine_profile import ENGINE_TITLE
from bsrctl.tempokv.experiments.pooled import quantile
from bsrctl.tempokv.experiments.serving import (
    Prepared,
    _arrivals,
    adapter_settings,
    deployment_for,
    stack_spec,
)
from bsrctl.tempokv.spec import TempoKVSpec

RECORDER = "bsrkv.vllm_ext.scheduler.RecordingScheduler"
STOCK = "stock"


@dataclass(frozen=True)
class CostArm:
    """One deployment of the bench: which of the adapter's parts vLLM runs. Every arm but
    ``stock`` has TempoKV's LMCache options (``retain``, the long read TTL) and the TempoKV
    controller off, as Figure 6's adapter arm has."""

    name: str
    what: str
    with_adapter: bool = True
    transport: str = "connector"  # the adapter's updates: to the server, or kept in-process
    trace: bool = True  # the per-step JSON-lines trace
    scheduler: str | None = None  # a class instead of the adapter (None: the adapter)
    tempokv_l1: bool = True  # TempoKV's LMCache L1 options


COST_ARMS: dict[str, CostArm] = {
    a.name: a
    for a in (
        CostArm(STOCK, "vLLM's stock scheduler, LMCache's stock options", False, tempokv_l1=False),
        CostArm("adapter", "the TempoKV adapter, controller off (Figure 6's adapter arm)"),
        CostArm("adapter-notrace", "the adapter, its updates to the server, no trace",
                trace=False),
        CostArm("adapter-local", "the adapter, updates kept in vLLM, no trace",
                transport="record", trace=False),
        CostArm("recorder", "the stock scheduler under a subclass writing the step trace",
                scheduler=RECORDER),
        CostArm("stock-retain", "stock vLLM, TempoKV's LMCache options", False),
        CostArm("stock-b", "a second stock deployment: the bench's own noise (A/A)", False,
                tempokv_l1=False),
    )
}  # fmt: skip
DEFAULT_ARMS = (STOCK, "adapter")


def cost_deployment(spec: TempoKVSpec, arm: CostArm, run_dir: Path) -> Deployment:
    """The arm's deployment (not started), through the serving run's own path."""

    def launch(tk: TempoKVLaunch) -> TempoKVLaunch:
        trace = tk.trace_path if arm.trace else None
        return replace(tk, transport=arm.transport, trace_path=trace, scheduler=arm.scheduler)

    l1 = TempoKVLaunch(adapter_settings(spec, stack_spec(spec.serving))).l1_options
    dep, _info = deployment_for(
        spec,
        run_dir,
        with_adapter=arm.with_adapter,
        launch=launch,
        l1=l1 if arm.tempokv_l1 else None,
    )
    return dep


def round_orders(arms: Sequence[str], rounds: int, first: int = 0) -> list[tuple[str, ...]]:
    """Round k's order: the arms rotated by k, reversed every other round (each arm takes
    every position, and follows and precedes each other arm, about equally often)."""
    out = []
    n = len(arms)
    for k in range(first, first + rounds):
        rot = tuple(arms[(k // 2 + i) % n] for i in range(n))
        out.append(rot if k % 2 == 0 else rot[::-1])
    return out


@dataclass(frozen=True)
class CostCell:
    """One arm's cell: the workload once at one rate."""

    arm: str
    launch: int
    round: int
    tok_s: float  # output tokens over the makespan (first send to last token)
    p95_s: float  # client-side TTFT
    canonical: int  # outputs equal to the canonical ones
    requests: int
    # CPU seconds the arm's processes used during the cell (user + system, every thread):
    # vLLM's EngineCore, the rest of vLLM (API server), the LMCache server. Another
    # tenant's load on the machine stretches wall time, much less these
    engine_cpu_s: float = math.nan
    api_cpu_s: float = math.nan
    lmcache_cpu_s: float = math.nan

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def run_cell(
    dep: Deployment, spec: TempoKVSpec, prep: Prepared, rate: float, arm: str, at: tuple[int, int]
) -> CostCell:
    """The workload at ``rate`` on a running arm, from a cold L1 and prefix cache, the
    controller off (as Figure 6's cells)."""
    stack, client = dep.stack, dep.client
    assert client is not None
    client.forget(wait_s=30.0)
    stack.forget_local()
    calls.configure(client, None)
    run = spec.serving.model_copy(update={"interval_s": 1.0 / rate})
    before = stack_cpu(dep)
    res = _arrivals(stack, prep.reqs, run)
    cpu = {k: v - before.get(k, 0.0) for k, v in stack_cpu(dep).items()}
    done = [r for r in res if r is not None]
    span = max(r.done_s for r in done) - min(r.sent_s for r in done) if done else 0.0
    toks = sum(len(r.output_token_ids) for r in done)
    same = sum(
        r is not None and r.output_token_ids == c for r, c in zip(res, prep.canonical, strict=True)
    )
    ttfts = [r.first_token_s - r.sent_s for r in done]
    return CostCell(
        arm, at[0], at[1], toks / span if span > 0 else math.nan,
        quantile(ttfts, 0.95) if ttfts else math.nan, same, len(res),
        cpu.get("engine", math.nan), cpu.get("api", math.nan), cpu.get("lmcache", math.nan),
    )  # fmt: skip


def _cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def stack_cpu(dep: Deployment) -> dict[str, float]:
    """CPU seconds used so far by the arm's EngineCore, the rest of vLLM and LMCache."""
    out: dict[str, float] = {}
    parts = dep.stack.parts
    for name, key in (("vllm", "api"), ("lmcache", "lmcache")):
        part = parts.get(name)
        if part is None or part.pid is None:
            continue
        try:
            root = psutil.Process(part.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in procs:
            try:
                title = " ".join(p.cmdline()) + p.name()
                bucket = "engine" if ENGINE_TITLE in title else key
                out[bucket] = out.get(bucket, 0.0) + _cpu_s(p)
            except psutil.Error:
                continue
    return out


@dataclass(frozen=True)
class ArmRatio:
    arm: str
    tput: stats.Interval  # arm / stock throughput, median of the rounds' ratios
    p95: stats.Interval  # arm / stock p95 TTFT
    rounds: int
    engine_cpu: stats.Interval  # arm / stock EngineCore CPU seconds per cell
    lmcache_cpu: stats.Interval  # arm / stock LMCache server CPU seconds per cell


def cost_ratios(cells: Sequence[CostCell], seed: int) -> list[ArmRatio]:
    """Each arm against the stock arm of the same (launch, round): paired ratios."""
    stock = {(c.launch, c.round): c for c in cells if c.arm == STOCK}
    arms = list(dict.fromkeys(c.arm for c in cells if c.arm != STOCK))
    out = []
    for arm in arms:
        pairs = [(c, stock[(c.launch, c.round)]) for c in cells
                 if c.arm == arm and (c.launch, c.round) in stock]  # fmt: skip
        ratio = {
            k: stats.paired_ratio_ci(
                [getattr(a, k) for a, _ in pairs], [getattr(b, k) for _, b in pairs], seed
            )
            for k in ("tok_s", "p95_s", "engine_cpu_s", "lmcache_cpu_s")
        }
        out.append(
            ArmRatio(arm, ratio["tok_s"], ratio["p95_s"], len(pairs),
                     ratio["engine_cpu_s"], ratio["lmcache_cpu_s"])
        )  # fmt: skip
    return out


def last_line(ratios: Sequence[ArmRatio]) -> str:
    """``adapter-cost tput adapter/stock=R [lo, hi] ... p95 adapter/stock=...``."""
    tput = " ".join(f"{r.arm}/stock={r.tput.text(3)}" for r in ratios)
    p95 = " ".join(f"{r.arm}/stock={r.p95.text(3)}" for r in ratios)
    return f"adapter-cost tput {tput} p95 {p95}"
