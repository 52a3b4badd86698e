"""Commitment policies behind one interface. They differ only in when a PLANNED claim
becomes eligible; retrieval demand makes any claim eligible (the controller handles that)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from bsrkv.tempokv.claims import Claim
from bsrkv.tempokv.provider import StagingProvider
from bsrkv.tempokv.ttr import QueueProjectionTtr, StaticTtr, TtrEstimator

# Aged TTUs are differences of floats; a crossing computed as "now + L" must count as L = 0.
LAXITY_EPS_S = 1e-9

# The paper's six, TempoKV-U (a TTU distribution instead of a point), and the oracle, the
# one policy that knows the run's future (a limit to measure the causal ones against).
PAPER_POLICIES = ("demand", "immediate", "queue-1", "queue-4", "tempokv-static", "tempokv")
POLICY_NAMES = (*PAPER_POLICIES, "tempokv-u", "oracle")
CAUSAL_POLICIES = tuple(p for p in POLICY_NAMES if p != "oracle")
# TempoKV-U's quantile: one value for every figure, chosen by bench/tempokv/u_quantile.py.
TTU_QUANTILE = 0.05


@dataclass(frozen=True, slots=True)
class EvalContext:
    now_s: float
    rank: int | None  # position in the runtime's waiting queue (0 = head), None if absent
    provider: StagingProvider


class Policy(Protocol):
    name: str
    needs_ttu: bool  # the runtime adapter only projects TTU for policies that read it
    crossing_wakeup: bool  # the controller also wakes at each predicted L = 0 crossing

    def laxity_s(self, claim: Claim, ctx: EvalContext) -> float | None:
        """TTU − TTR, or None where the policy does not time commitment."""
        ...

    def eligible(self, claim: Claim, ctx: EvalContext, laxity_s: float | None) -> bool: ...


@dataclass(frozen=True, slots=True)
class Demand:
    name: str = "demand"
    needs_ttu: bool = False
    crossing_wakeup: bool = False

    def laxity_s(self, claim: Claim, ctx: EvalContext) -> float | None:
        return None

    def eligible(self, claim: Claim, ctx: EvalContext, laxity_s: float | None) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class Immediate:
    name: str = "immediate"
    needs_ttu: bool = False
    crossing_wakeup: bool = False

    def laxity_s(self, claim: Claim, ctx: EvalContext) -> float | None:
        return None

    def eligible(self, claim: Claim, ctx: EvalContext, laxity_s: float | None) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class QueueK:
    k: int
    needs_ttu: bool = False
    crossing_wakeup: bool = False

    @property
    def name(self) -> str:
        return f"queue-{self.k}"

    def laxity_s(self, claim: Claim, ctx: EvalContext) -> float | None:
        return None

    def eligible(self, claim: Claim, ctx: EvalContext, laxity_s: float | None) -> bool:
        return ctx.rank is not None and ctx.rank < self.k


@dataclass(frozen=True, slots=True)
class Timed:
    """Eligible once the estimated laxity L = TTU − TTR is ≤ 0. With `ttu_quantile`, the
    runtime adapter projects TTU as that quantile of its distribution (TempoKV-U)."""

    name: str
    ttr: TtrEstimator
    needs_ttu: bool = True
    crossing_wakeup: bool = False
    ttu_quantile: float | None = None

    def laxity_s(self, claim: Claim, ctx: EvalContext) -> float | None:
        ttu_s = claim.ttu_now(ctx.now_s)
        if ttu_s is None:
            return None
        return ttu_s - self.ttr.ttr_s(ctx.provider.ttr_query(claim.manifest))

    def eligible(self, claim: Claim, ctx: EvalContext, laxity_s: float | None) -> bool:
        return laxity_s is not None and laxity_s <= LAXITY_EPS_S


def make_policy(
    name: str,
    provider: StagingProvider,
    static_rate_bytes_s: float,
    ttu_quantile: float = TTU_QUANTILE,
) -> Policy:
    """A causal policy by name; TempoKV's TTR reads the provider's queue and calibrated
    rate, and TempoKV-U shares it (only the TTU side differs). The oracle needs the run's
    future, so it lives with the simulation, not here."""
    if name == "demand":
        return Demand()
    if name == "immediate":
        return Immediate()
    if name.startswith("queue-") and name[6:].isdigit() and int(name[6:]) > 0:
        return QueueK(int(name[6:]))
    if name == "tempokv-static":
        return Timed(name, StaticTtr(static_rate_bytes_s))
    if name == "tempokv":
        return Timed(name, QueueProjectionTtr(provider.rate))
    if name == "tempokv-u":
        ttr = QueueProjectionTtr(provider.rate)
        return Timed(name, ttr, crossing_wakeup=True, ttu_quantile=ttu_quantile)
    valid = ", ".join(CAUSAL_POLICIES)
    raise ValueError(f"unknown causal policy {name!r}; valid: {valid} (or queue-K)")
