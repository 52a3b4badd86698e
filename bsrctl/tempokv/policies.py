"""Commitment policies behind one interface. They differ only in when a PLANNED claim
becomes eligible; retrieval demand makes any claim eligible (the controller handles that)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from bsrctl.tempokv.claims import Claim
from bsrctl.tempokv.provider import StagingProvider
from bsrctl.tempokv.ttr import QueueProjectionTtr, StaticTtr, TtrEstimator

# Aged TTUs are differences of floats; a crossing computed as "now + L" must count as L = 0.
LAXITY_EPS_S = 1e-9

POLICY_NAMES = ("demand", "immediate", "queue-1", "queue-4", "tempokv-static", "tempokv")


@dataclass(frozen=True, slots=True)
class EvalContext:
    now_s: float
    rank: int | None  # position in the runtime's waiting queue (0 = head), None if absent
    provider: StagingProvider


class Policy(Protocol):
    name: str
    needs_ttu: bool  # the runtime adapter only projects TTU for policies that read it

    def laxity_s(self, claim: Claim, ctx: EvalContext) -> float | None:
        """TTU − TTR, or None where the policy does not time commitment."""
        ...

    def eligible(self, claim: Claim, ctx: EvalContext, laxity_s: float | None) -> bool: ...


@dataclass(frozen=True, slots=True)
class Demand:
    name: str = "demand"
    needs_ttu: bool = False

    def laxity_s(self, claim: Claim, ctx: EvalContext) -> float | None:
        return None

    def eligible(self, claim: Claim, ctx: EvalContext, laxity_s: float | None) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class Immediate:
    name: str = "immediate"
    needs_ttu: bool = False

    def laxity_s(self, claim: Claim, ctx: EvalContext) -> float | None:
        return None

    def eligible(self, claim: Claim, ctx: EvalContext, laxity_s: float | None) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class QueueK:
    k: int
    needs_ttu: bool = False

    @property
    def name(self) -> str:
        return f"queue-{self.k}"

    def laxity_s(self, claim: Claim, ctx: EvalContext) -> float | None:
        return None

    def eligible(self, claim: Claim, ctx: EvalContext, laxity_s: float | None) -> bool:
        return ctx.rank is not None and ctx.rank < self.k


@dataclass(frozen=True, slots=True)
class Timed:
    """Eligible once the estimated laxity L = TTU − TTR is ≤ 0."""

    name: str
    ttr: TtrEstimator
    needs_ttu: bool = True

    def laxity_s(self, claim: Claim, ctx: EvalContext) -> float | None:
        ttu_s = claim.ttu_now(ctx.now_s)
        if ttu_s is None:
            return None
        return ttu_s - self.ttr.ttr_s(ctx.provider.ttr_query(claim.manifest))

    def eligible(self, claim: Claim, ctx: EvalContext, laxity_s: float | None) -> bool:
        return laxity_s is not None and laxity_s <= LAXITY_EPS_S


def make_policy(name: str, provider: StagingProvider, static_rate_bytes_s: float) -> Policy:
    """A policy by name; TempoKV's TTR reads the provider's queue and calibrated rate."""
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
    raise ValueError(f"unknown policy {name!r}; valid: {', '.join(POLICY_NAMES)} (or queue-K)")
