"""One policy on one request trace in virtual time: clock, device, provider, controller,
runtime adapter (the live adapter's core, ``sim/runtime.py``) and engine wired together,
and the measures the evidence needs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bsrctl.tempokv.measures import SimMeasures
from bsrctl.tempokv.oracle import Oracle, OraclePlan
from bsrctl.tempokv.sim.device import DeviceConfig, SimStagingDevice
from bsrctl.tempokv.sim.engine import RequestLog, SimEngine
from bsrctl.tempokv.sim.models import ModelProfile
from bsrctl.tempokv.sim.runtime import SimRuntime, adapter_settings
from bsrctl.tempokv.sim.workload import Request
from bsrkv.clock import Clock, VirtualClock
from bsrkv.tempokv.controller import Controller
from bsrkv.tempokv.kv import GIB
from bsrkv.tempokv.policies import TTU_QUANTILE, Policy, make_policy
from bsrkv.tempokv.provider import CommitRefusal, StagingProvider
from bsrkv.tempokv.ttr import RateMeter
from bsrkv.tempokv.ttu import EngineLimits


@dataclass(frozen=True, slots=True)
class ControlConfig:
    tick_s: float = 0.05  # periodic re-evaluation
    rate_prior_s: float = 1.0  # weight of the calibrated staging rate in the TTR estimate
    output_limit_tokens: int = 128  # generation limit the TTU predictor caps at
    output_prior_tokens: tuple[int, ...] = (128,)  # calibration completions seeding TTU
    # (the spec draws them from the model's output distribution with a separate seed)
    crossing_wakeup: bool = False  # also re-evaluate at each predicted L = 0 crossing
    ttu_quantile: float = TTU_QUANTILE  # TempoKV-U: commit when this TTU quantile reaches TTR


@dataclass(frozen=True, slots=True)
class SimResult:
    policy: str
    logs: tuple[RequestLog, ...]
    byte_time_byte_s: float  # ∫ P(t) dt over the whole run
    peak_reserved_bytes: int
    budget_bytes: int
    deferred_commits: int  # claims refused at least once for lack of protected budget
    capacity_refusals: int  # refused attempts in all
    ordinary_retrievals: int
    end_s: float  # last completion and every reservation released
    claim_traces: dict[str, list[list[float | str]]] = field(default_factory=dict)
    p_trace: tuple[tuple[float, int], ...] = ()  # P(t) steps (bytes), when kept
    notes: dict[str, Any] = field(default_factory=dict)  # policy-specific measures (oracle)
    oracle_delayed: frozenset[str] = frozenset()  # oracle: claims held past their plan
    budget_refused: frozenset[str] = frozenset()  # claims refused for budget at least once

    def byte_time_between(self, from_s: float, to_s: float) -> float:
        """∫ P dt over [from_s, to_s], byte·s, from the kept P(t) trace."""
        points = [*self.p_trace, (max(to_s, self.end_s), 0)]
        total = 0.0
        for (t0, level), (t1, _) in zip(points, points[1:], strict=False):
            lo, hi = max(t0, from_s), min(t1, to_s)
            if hi > lo:
                total += level * (hi - lo)
        return total

    @property
    def ttfts_s(self) -> list[float]:
        return [
            lg.first_token_s - lg.req.arrival_s for lg in self.logs if lg.first_token_s is not None
        ]

    def measures(self) -> SimMeasures:
        ttfts = self.ttfts_s
        done = [lg for lg in self.logs if lg.done_s is not None]
        first_s = min(lg.req.arrival_s for lg in self.logs)
        last_s = max(lg.done_s for lg in done) if done else math.nan
        out_tokens = sum(lg.req.output_tokens for lg in done)
        return SimMeasures(
            c_gib_s_per_req=self.byte_time_byte_s / GIB / max(1, len(done)),
            p95_ttft_s=percentile(ttfts, 95.0),
            mean_ttft_s=sum(ttfts) / len(ttfts) if ttfts else math.nan,
            output_tok_s=out_tokens / (last_s - first_s) if done else math.nan,
            deferred_commits=self.deferred_commits,
            capacity_refusals=self.capacity_refusals,
            ordinary_retrievals=self.ordinary_retrievals,
            completed=len(done),
            requests=len(self.logs),
            peak_reserved_gib=self.peak_reserved_bytes / GIB,
            budget_gib=self.budget_bytes / GIB,
            makespan_s=last_s - first_s,
            **self.notes,
        )


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _delayed(policy: Policy, controller: Controller) -> frozenset[str]:
    """Oracle: claims it could not commit at their planned start (the staging device busy,
    or the protected budget full)."""
    if not isinstance(policy, Oracle):
        return frozenset()
    refused = {a.claim_id for a in controller.attempts if a.refusal is CommitRefusal.CAPACITY}
    return frozenset(policy.delayed | refused)


def simulate(
    requests: Sequence[Request],
    model: ModelProfile,
    device_cfg: DeviceConfig,
    limits: EngineLimits,
    control: ControlConfig,
    policy_name: str,
    keep_trace: bool = True,
    clock: Clock | None = None,
    oracle: OraclePlan | None = None,
) -> SimResult:
    """Run one policy; virtual time unless a clock is given (a WallClock runs the very same
    controller, provider and engine code in real time). The oracle runs from a plan of the
    run's retrieval instants (`sim/oracle.py` finds it)."""
    clock = VirtualClock() if clock is None else clock
    device = SimStagingDevice(clock, device_cfg)
    rate = RateMeter(device_cfg.staging_bytes_s, control.rate_prior_s)
    provider = StagingProvider(
        clock,
        device,
        device_cfg.capacity_bytes,
        device_cfg.budget_bytes,
        device_cfg.concurrency,
        rate,
        keep_trace,
    )
    for req in requests:
        provider.store(req.manifest.objects)  # precomputed KV retained on SSD
    policy: Policy
    if policy_name == "oracle":
        if oracle is None:
            raise ValueError("the oracle runs from a plan: use sim.oracle.simulate_oracle")
        policy = Oracle(oracle, provider)
    else:
        policy = make_policy(
            policy_name, provider, device_cfg.staging_bytes_s, control.ttu_quantile
        )
    crossing = control.crossing_wakeup or policy.crossing_wakeup
    controller = Controller(clock, provider, policy, control.tick_s, crossing)
    if isinstance(policy, Oracle):
        policy.bind(controller.claims)
    engine = SimEngine(clock, model.cost, limits, device_cfg.retrieval_bytes_s, controller)
    settings = adapter_settings(
        policy,
        model,
        device_cfg,
        control.output_limit_tokens,
        control.output_prior_tokens,
        len(requests),
    )
    runtime = SimRuntime(engine, controller, settings, requests)
    engine.on_iteration = runtime.on_iteration
    engine.on_arrival = runtime.on_arrival
    engine.on_complete = runtime.on_complete
    logs = [RequestLog(req) for req in requests]

    def hit(req: Request) -> None:
        if req.manifest.objects:
            controller.report_hit(req.req_id, req.manifest)

    for log in logs:
        clock.call_at(log.req.hit_s, lambda r=log.req: hit(r))
        clock.call_at(log.req.arrival_s, lambda lg=log: engine.submit(lg))
    clock.run()
    meter = provider.meter
    meter.set(clock.now(), meter.level_bytes)
    return SimResult(
        policy=policy_name,
        logs=tuple(logs),
        byte_time_byte_s=meter.integral_byte_s,
        peak_reserved_bytes=meter.peak_bytes,
        budget_bytes=device_cfg.budget_bytes,
        deferred_commits=controller.deferred_claims,
        capacity_refusals=sum(c.capacity_refusals for c in controller.claims.values()),
        ordinary_retrievals=sum(1 for lg in logs if lg.path == "ordinary"),
        end_s=clock.now(),
        claim_traces={cid: c.trace_json() for cid, c in controller.claims.items()}
        if keep_trace
        else {},
        p_trace=tuple(meter.trace or ()),
        oracle_delayed=_delayed(policy, controller),
        budget_refused=frozenset(
            c.claim_id for c in controller.claims.values() if c.capacity_refusals
        ),
    )
