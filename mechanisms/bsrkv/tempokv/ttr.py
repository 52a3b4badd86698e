"""Time-to-ready: how long the matched KV would take to become resident and protected if
committed now. Metadata only: a projection of the provider's staging queue, nothing issued."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class OpView:
    remaining_bytes: int  # bytes still to read for this op
    running: bool  # issued to the device (else queued behind the concurrency limit)
    staging: bool = True  # a staging op (counts toward the provider's concurrency); False:
    # an ordinary demand read, issued at once outside that limit but sharing the device


@dataclass(frozen=True, slots=True)
class TtrQuery:
    """What the provider knows about one hypothetical commitment, taken under no lock."""

    ops: tuple[OpView, ...]  # the staging queue in issue order
    dep_ops: frozenset[int]  # indices into ops that carry objects the claim needs
    new_read_bytes: int  # bytes neither resident nor covered by staging: one new op
    missing_bytes: int  # bytes not resident now, staged or not (the static view)
    concurrency: int  # ops the provider keeps in flight at once


class TtrEstimator(Protocol):
    def ttr_s(self, query: TtrQuery) -> float: ...


RateLaw = float | Callable[[int], float]  # aggregate bytes/s, or of the number of ops running


def project_finish_s(ops: tuple[OpView, ...], concurrency: int, rate: RateLaw) -> list[float]:
    """Finish time of each op when running ops share one aggregate rate equally (processor
    sharing, §3.1 "concurrent operations share an effective aggregate service rate") and
    queued staging ops start, in issue order, as staging slots free. The aggregate may depend
    on how many ops run (load-aware, §3.1 [20]): `rate` is then a function of that number.
    As in the provider, only staging ops count toward its concurrency (ordinary reads are
    issued at once) and every running op, of either kind, shares the device. Overlapping
    transfers are not summed."""
    aggregate = rate if callable(rate) else lambda n: rate
    finish_s = [0.0] * len(ops)
    remaining = [float(op.remaining_bytes) for op in ops]
    queued = deque(i for i, op in enumerate(ops) if not op.running)
    active = [i for i, op in enumerate(ops) if op.running]
    t_s = 0.0
    while True:
        staging = sum(ops[i].staging for i in active)
        while queued and (staging < concurrency or not ops[queued[0]].staging):
            i = queued.popleft()
            active.append(i)
            staging += ops[i].staging
        if not active:
            return finish_s
        per_op_bytes_s = aggregate(len(active)) / len(active)
        step = min(remaining[i] for i in active)
        t_s += step / per_op_bytes_s
        still = []
        for i in active:
            remaining[i] -= step
            if remaining[i] <= 1e-6:
                finish_s[i] = t_s
            else:
                still.append(i)
        active = still


class QueueProjectionTtr:
    """State-aware TTR: the new op joins the end of the queue; TTR is when the last required
    object is resident and protected (the latest of its dependencies), never a sum. The
    queue is projected under the load-aware aggregate rate learnt from completed ops, so
    contention from a deeper queue lengthens TTR (§3.1, [20])."""

    def __init__(self, rate: RateMeter) -> None:
        self.rate = rate

    def ttr_s(self, query: TtrQuery) -> float:
        ops = query.ops
        if query.new_read_bytes > 0:
            ops = (*ops, OpView(query.new_read_bytes, running=False))
        if not ops:
            return 0.0
        finish_s = project_finish_s(ops, query.concurrency, self.rate.aggregate_bytes_s)
        need = set(query.dep_ops)
        if query.new_read_bytes > 0:
            need.add(len(ops) - 1)
        return max((finish_s[i] for i in need), default=0.0)


class StaticTtr:
    """TempoKV-Static: the claim in isolation at a fixed premeasured rate; no queueing,
    contention or staging progress."""

    def __init__(self, rate_bytes_s: float) -> None:
        self.rate_bytes_s = rate_bytes_s

    def ttr_s(self, query: TtrQuery) -> float:
        return query.missing_bytes / self.rate_bytes_s


class RateMeter:
    """Load-aware effective aggregate staging rate, calibrated from completed operations.

    §3.1: concurrent operations "share an effective aggregate service rate calibrated and
    updated from completed operations over active staging intervals", and TTR accounts "for
    contention in line with load-aware informed prefetching [20]". So the rate is learnt per
    load level rather than as one average: each completed op reports its bytes and its share
    of the device over its life, ∫ 1/n(t) dt with n ops running (what the provider knows
    from its own issue and completion times). Under processor sharing at aggregate A,
    bytes = A · ∫ 1/n dt exactly, so bytes / ∫ 1/n dt is a sample of A at the op's harmonic
    mean load d / ∫ 1/n dt. Samples pool per load level (the last `window` ops), each level
    with the calibrated prior (flat: no contention assumed) weighted as `prior_s` seconds;
    a level never observed is interpolated between observed ones (flat beyond the highest;
    the prior stands for level 1 until one op alone is observed). Any
    fixed per-op overhead to stage-ready is folded into these effective rates."""

    def __init__(self, prior_bytes_s: float, prior_s: float = 1.0, window: int = 8) -> None:
        self.prior_bytes_s = prior_bytes_s
        self.prior_s = prior_s
        self.window = window
        self._levels: dict[int, deque[tuple[float, float]]] = {}  # n -> (bytes, share_s)
        self._by_level: dict[int, float] = {}  # pooled estimate per observed level
        self._cache: dict[int, float] = {}

    def observe_op(self, size_bytes: float, share_s: float, busy_s: float) -> None:
        """One completed op: size_bytes moved over busy_s seconds with ∫ 1/n dt = share_s."""
        if share_s <= 0 or busy_s <= 0:
            return
        level = max(1, round(busy_s / share_s))
        samples = self._levels.setdefault(level, deque(maxlen=self.window))
        samples.append((size_bytes, share_s))
        total_bytes = self.prior_bytes_s * self.prior_s + sum(b for b, _ in samples)
        total_s = self.prior_s + sum(s for _, s in samples)
        self._by_level[level] = total_bytes / total_s
        self._cache.clear()

    def aggregate_bytes_s(self, running: int) -> float:
        """Estimated aggregate rate with `running` ops sharing the device."""
        n = max(1, running)
        hit = self._cache.get(n)
        if hit is not None:
            return hit
        # The calibrated prior is a measurement of one op alone (§5's premeasured rate).
        by_level = {1: self.prior_bytes_s, **self._by_level}
        levels = sorted(by_level)
        if n >= levels[-1]:
            out = by_level[levels[-1]]
        else:
            hi = next(lv for lv in levels if lv >= n)
            lo = max(lv for lv in levels if lv <= n)
            a, b = by_level[lo], by_level[hi]
            out = a if hi == lo else a + (b - a) * (n - lo) / (hi - lo)
        self._cache[n] = out
        return out

    @property
    def rate_bytes_s(self) -> float:
        """One op alone (what a load-blind estimate would use)."""
        return self.aggregate_bytes_s(1)
