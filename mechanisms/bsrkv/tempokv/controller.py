"""The TempoKV controller: claim states, timing-based eligibility and commitment ordering.

Committed claims are never revoked; a claim whose retrieval is requested either commits at
once or takes the ordinary path, and from then on the two are mutually exclusive."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

from bsrkv.clock import Clock, Timer
from bsrkv.tempokv.claims import Claim, ClaimState
from bsrkv.tempokv.kv import Manifest
from bsrkv.tempokv.policies import EvalContext, Policy
from bsrkv.tempokv.provider import CommitRefusal, StagingProvider

MIN_WAKEUP_S = 1e-3  # floor on laxity-crossing wakeups, so L ≈ 0⁺ cannot spin


class RetrievalGrant(IntEnum):
    READY = 0  # stage-ready: begin the fast-tier→GPU transfer now
    WAIT = 1  # committed and staging: the callback fires at stage-ready
    ORDINARY = 2  # not committable now: use the ordinary (demand) path


@dataclass(frozen=True, slots=True)
class CommitAttempt:
    """One decision, kept for the evidence."""

    t_s: float  # control time
    claim_id: str
    trigger: str  # "retrieval" or the policy's name
    laxity_s: float | None  # TTU − TTR at the decision, for timed policies
    refusal: CommitRefusal | None  # None: committed


class Controller:
    def __init__(
        self,
        clock: Clock,
        provider: StagingProvider,
        policy: Policy,
        tick_s: float = 0.05,
        crossing_wakeup: bool = False,
    ) -> None:
        self.clock = clock
        self.provider = provider
        self.policy = policy
        self.tick_s = tick_s
        # The paper's controller re-evaluates on events and a periodic tick only (§3.2, §5
        # "event-driven updates with a 50 ms periodic tick"); a timer at the predicted L = 0
        # crossing is an extra, off by default (tests use it for exact crossing traces).
        self.crossing_wakeup = crossing_wakeup
        self.claims: dict[str, Claim] = {}
        self.attempts: list[CommitAttempt] = []
        self._planned: dict[str, Claim] = {}  # uncommitted, still eligible for commitment
        self._rank: dict[str, int] = {}
        self._waiters: dict[str, Callable[[], None]] = {}
        self._tick: Timer | None = None
        self._wakeup: Timer | None = None
        self._evaluating = False
        self._dirty = False
        self._next_laxity_s: float | None = None  # smallest positive L seen last pass
        provider.on_ready = self._on_ready
        provider.on_change = self.evaluate

    # ---- runtime adapter → controller ---------------------------------------------------
    def report_hit(self, claim_id: str, manifest: Manifest) -> Claim:
        """Metadata only: no I/O, no capacity."""
        claim = Claim(claim_id, manifest, self.clock.now())
        self.claims[claim_id] = claim
        self._planned[claim_id] = claim
        self.evaluate()
        return claim

    def update_runtime(
        self, order: Sequence[str], ttus_s: Mapping[str, float] | None, at_s: float
    ) -> None:
        """Latest waiting-queue order and timestamped TTU estimates (taken at at_s)."""
        self._rank = {claim_id: i for i, claim_id in enumerate(order)}
        if ttus_s:
            for claim_id, ttu_s in ttus_s.items():
                claim = self._planned.get(claim_id)
                if claim is not None:
                    claim.ttu_s, claim.ttu_at_s = ttu_s, at_s
        self.evaluate()

    def request_retrieval(self, claim_id: str, on_ready: Callable[[], None]) -> RetrievalGrant:
        claim = self.claims[claim_id]
        claim.retrieval_requested = True
        if claim.state is ClaimState.PLANNED:
            self._attempt(claim, "retrieval", None)
            if claim.state is ClaimState.PLANNED:
                self._planned.pop(claim_id, None)
                claim.move(ClaimState.ORDINARY, self.clock.now())
                return RetrievalGrant.ORDINARY
        if claim.state is ClaimState.STAGEREADY:
            return RetrievalGrant.READY
        if claim.state is ClaimState.STAGING:
            self._waiters[claim_id] = on_ready
            return RetrievalGrant.WAIT
        raise RuntimeError(f"claim {claim_id}: retrieval requested in state {claim.state.name}")

    def begin_transfer(self, claim_id: str) -> None:
        claim = self.claims[claim_id]
        claim.move(ClaimState.TRANSFERRING, self.clock.now())
        self.provider.touch(claim.manifest)

    def end_transfer(self, claim_id: str) -> None:
        self.claims[claim_id].move(ClaimState.RELEASED, self.clock.now())
        self.provider.release(claim_id)

    def ordinary_read(self, claim_id: str, on_done: Callable[[], None]) -> None:
        claim = self.claims[claim_id]
        if claim.state is not ClaimState.ORDINARY:
            raise RuntimeError(f"claim {claim_id}: ordinary read in state {claim.state.name}")
        self.provider.ordinary_read(claim_id, claim.manifest, on_done)

    def end_ordinary(self, claim_id: str) -> None:
        self.provider.end_ordinary(claim_id)

    def cancel(self, claim_id: str) -> None:
        """Uncommitted: immediate. Committed: protection kept until its I/O cannot use it."""
        claim = self.claims[claim_id]
        was_committed = claim.committed
        claim.move(ClaimState.CANCELLED, self.clock.now())
        self._planned.pop(claim_id, None)
        self._waiters.pop(claim_id, None)
        if was_committed:
            self.provider.release(claim_id)

    # ---- decisions ----------------------------------------------------------------------
    def evaluate(self) -> None:
        """Try every eligible PLANNED claim: retrieval requests first, then runtime order.
        An ineligible or refused claim never blocks the ones after it."""
        if self._evaluating:
            self._dirty = True
            return
        self._evaluating = True
        try:
            self._dirty = True
            while self._dirty:
                self._dirty = False
                self._evaluate_once()
        finally:
            self._evaluating = False
        self._arm_timers()

    def _evaluate_once(self) -> None:
        now_s = self.clock.now()
        inf = len(self._rank) + 1
        order = sorted(
            self._planned.values(),
            key=lambda c: (not c.retrieval_requested, self._rank.get(c.claim_id, inf)),
        )
        self._next_laxity_s = None
        for claim in order:
            ctx = EvalContext(now_s, self._rank.get(claim.claim_id), self.provider)
            laxity_s = self.policy.laxity_s(claim, ctx)
            if claim.retrieval_requested or self.policy.eligible(claim, ctx, laxity_s):
                self._attempt(claim, self.policy.name, laxity_s)
            elif laxity_s is not None:
                best = self._next_laxity_s
                self._next_laxity_s = laxity_s if best is None else min(best, laxity_s)

    def _attempt(self, claim: Claim, trigger: str, laxity_s: float | None) -> None:
        now_s = self.clock.now()
        decision = self.provider.commit(claim.claim_id, claim.manifest)
        self.attempts.append(
            CommitAttempt(now_s, claim.claim_id, trigger, laxity_s, decision.refusal)
        )
        if not decision.ok:
            if decision.refusal is CommitRefusal.CAPACITY:
                claim.capacity_refusals += 1
            return
        del self._planned[claim.claim_id]
        state = ClaimState.STAGEREADY if decision.ready else ClaimState.STAGING
        claim.move(state, now_s)

    def _on_ready(self, claim_id: str) -> None:
        claim = self.claims[claim_id]
        claim.move(ClaimState.STAGEREADY, self.clock.now())
        waiter = self._waiters.pop(claim_id, None)
        if waiter is not None:
            waiter()

    # ---- re-evaluation timers -----------------------------------------------------------
    def _arm_timers(self) -> None:
        if not self._planned:
            return
        if self.tick_s > 0 and self._tick is None:
            self._tick = self.clock.call_later(self.tick_s, self._on_tick)
        laxity_s = self._next_laxity_s
        if self.crossing_wakeup and laxity_s is not None:  # wake when L would cross 0
            at_s = self.clock.now() + max(laxity_s, MIN_WAKEUP_S)
            if self._wakeup is None or self._wakeup.cancelled or self._wakeup.at_s != at_s:
                if self._wakeup is not None:
                    self._wakeup.cancel()
                self._wakeup = self.clock.call_at(at_s, self._on_wakeup)

    def _on_tick(self) -> None:
        self._tick = None
        self.evaluate()

    def _on_wakeup(self) -> None:
        self._wakeup = None
        self.evaluate()

    def ready_eta_s(self, claim_id: str) -> float:
        """For the runtime adapter's projection: how long until this claim's KV is in the
        fast tier (committed staging, or the ordinary read under way); 0 if ready, unknown
        or uncommitted (the projection then assumes it stage-ready)."""
        claim = self.claims.get(claim_id)
        if claim is None or claim.state not in (ClaimState.STAGING, ClaimState.ORDINARY):
            return 0.0
        return self.provider.pending_eta_s(claim_id)

    def has_planned(self) -> bool:
        return bool(self._planned)

    def planned_ids(self) -> Collection[str]:
        """Claims still uncommitted and eligible for commitment (a live view)."""
        return self._planned.keys()

    # ---- what the evidence reads --------------------------------------------------------
    @property
    def deferred_claims(self) -> int:
        """Claims whose commitment was refused at least once for lack of protected budget."""
        return sum(1 for c in self.claims.values() if c.capacity_refusals)
