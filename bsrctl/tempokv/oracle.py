"""The oracle policy: it knows when each claim's retrieval will begin in this run and
commits the claim at the latest instant that still makes it stage-ready then.

It is not causal; it is the limit the causal policies are measured against. Given the
retrieval instants R (from a replay of the same seeded run, `sim/oracle.py`), it plans the
staging device backwards, as a latest-start schedule on one FIFO server: claims not yet
committed, taken in order of R, each needing d = (bytes it would read anew, less those an
earlier claim in the plan reads) / the one-op staging rate. Going back from the last, a
claim must be stage-ready by f = min(R, the planned start of the claim after it, or that
claim's hit if later: no claim starts before its hit) and starts at s = f − d. A claim
commits at s, and not before the staging device would start its read (committing while
queued behind other staging gains nothing: FIFO, it is stage-ready no sooner, and it holds
capacity longer). Where a retrieval comes too soon for any commitment (s before the hit, or
the device still busy at s), the claim commits as soon as it can and is late; the oracle
notes it as delayed.

`advance_s` moves a claim's start earlier by what the previous replay saw it late by
(contention or coalescing the plan did not foresee), and a 1 µs guard keeps float noise
from making a claim stage-ready a hair after its retrieval begins."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from bsrkv.tempokv.claims import Claim, ClaimState
from bsrkv.tempokv.kv import Manifest
from bsrkv.tempokv.policies import LAXITY_EPS_S, EvalContext
from bsrkv.tempokv.provider import StagingProvider
from bsrkv.tempokv.ttr import QueueProjectionTtr

GUARD_S = 1e-6


@dataclass(frozen=True, slots=True)
class OraclePlan:
    retrieval_s: Mapping[str, float]  # claim id -> when its retrieval begins in the run
    manifests: Mapping[str, Manifest]  # claim id -> its manifest (claims not yet reported too)
    reported_s: Mapping[str, float]  # claim id -> when its hit is reported (none start sooner)
    advance_s: Mapping[str, float] = field(default_factory=dict)  # claim id -> start earlier


class Oracle:
    name = "oracle"
    needs_ttu = False
    crossing_wakeup = True  # it commits at its planned instant, not at the next tick

    def __init__(self, plan: OraclePlan, provider: StagingProvider) -> None:
        self.plan = plan
        self.provider = provider
        self.ttr = QueueProjectionTtr(provider.rate)
        self.claims: Mapping[str, Claim] = {}  # the controller's, bound by the caller
        self.delayed: set[str] = set()  # planned start passed while the device was busy
        self._order = {cid: i for i, cid in enumerate(plan.retrieval_s)}
        self._cache: tuple[tuple[float, int, int], dict[str, tuple[float, float]]] | None = None

    def bind(self, claims: Mapping[str, Claim]) -> None:
        self.claims = claims

    def laxity_s(self, claim: Claim, ctx: EvalContext) -> float | None:
        """Time until the claim may commit: its planned start, or, once that has passed,
        until the staging device would start its read."""
        planned = self._schedule(ctx.now_s).get(claim.claim_id)
        if planned is None:  # not in the plan: never retrieved in the replay
            return None
        ready_by_s, need_s = planned
        advance_s = self.plan.advance_s.get(claim.claim_id, 0.0)
        to_start_s = ready_by_s - need_s - advance_s - GUARD_S - ctx.now_s
        wait_s = 0.0
        query = self.provider.ttr_query(claim.manifest)
        if query.new_read_bytes > 0 and not self.provider.staging_slot_free():
            alone_s = query.new_read_bytes / self.provider.rate.aggregate_bytes_s(1)
            wait_s = max(0.0, self.ttr.ttr_s(query) - alone_s)
            if to_start_s <= LAXITY_EPS_S:
                self.delayed.add(claim.claim_id)
        return max(to_start_s, wait_s if wait_s > 0 else -math.inf)

    def eligible(self, claim: Claim, ctx: EvalContext, laxity_s: float | None) -> bool:
        return laxity_s is not None and laxity_s <= LAXITY_EPS_S

    def _pending(self) -> list[str]:
        """Claims still to commit: planned, or not yet reported."""
        out = []
        for cid in self.plan.retrieval_s:
            claim = self.claims.get(cid)
            if claim is None or claim.state is ClaimState.PLANNED:
                out.append(cid)
        return out

    def _schedule(self, now_s: float) -> dict[str, tuple[float, float]]:
        """Every pending claim's latest stage-ready instant and staging need (seconds)."""
        pending = self._pending()
        key = (now_s, self.provider.version, len(pending))
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        r = self.plan.retrieval_s
        pending.sort(key=lambda cid: (r[cid], self._order[cid]))
        rate_bytes_s = self.provider.rate.aggregate_bytes_s(1)
        covered: set[str] = set()
        need_s = []
        for cid in pending:
            fresh = [
                o
                for o in self.provider.unstaged_objects(self.plan.manifests[cid])
                if o.object_id not in covered
            ]
            covered.update(o.object_id for o in fresh)
            need_s.append(sum(o.size_bytes for o in fresh) / rate_bytes_s)
        out: dict[str, tuple[float, float]] = {}
        bound_s = math.inf
        for cid, d_s in zip(reversed(pending), reversed(need_s), strict=True):
            ready_by_s = min(r[cid], bound_s)
            out[cid] = (ready_by_s, d_s)
            # the claim before it must be done when it starts, and it starts no sooner
            # than its hit is reported (if that is too late, it is late whatever comes before)
            bound_s = max(ready_by_s - d_s, self.plan.reported_s[cid])
        self._cache = (key, out)
        return out
