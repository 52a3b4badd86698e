"""Time-to-ready: how long the matched KV would take to become resident and protected if
committed now. Metadata only: a projection of the provider's staging queue, nothing issued."""

from __future__ import annotations

from collections import deque
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


def project_finish_s(ops: tuple[OpView, ...], concurrency: int, rate_bytes_s: float) -> list[float]:
    """Finish time of each op when running ops share one aggregate rate equally and queued
    staging ops start, in issue order, as staging slots free. As in the provider, only
    staging ops count toward its concurrency (ordinary reads are issued at once) and every
    running op, of either kind, shares the device. Overlapping transfers are not summed."""
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
        per_op_bytes_s = rate_bytes_s / len(active)
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
    object is resident and protected (the latest of its dependencies), never a sum."""

    def __init__(self, rate: RateMeter) -> None:
        self.rate = rate

    def ttr_s(self, query: TtrQuery) -> float:
        ops = query.ops
        if query.new_read_bytes > 0:
            ops = (*ops, OpView(query.new_read_bytes, running=False))
        if not ops:
            return 0.0
        finish_s = project_finish_s(ops, query.concurrency, self.rate.rate_bytes_s)
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
    """Effective aggregate staging rate from completed operations over active intervals.

    Each busy period (device never idle) contributes the bytes of the operations completed
    in it over its active time so far; the estimate is revised at every completion, not only
    when the device goes idle, and pools the last `window` periods with the calibrated prior
    weighted as `prior_s` seconds."""

    def __init__(self, prior_bytes_s: float, prior_s: float = 1.0, window: int = 8) -> None:
        self.prior_bytes_s = prior_bytes_s
        self.prior_s = prior_s
        self._periods: deque[tuple[float, float]] = deque(maxlen=window)  # (bytes, seconds)
        self._open: tuple[float, float] | None = None  # the busy period still running
        self.rate_bytes_s = prior_bytes_s

    def observe(self, done_bytes: float, active_s: float, period_open: bool = False) -> None:
        """Bytes completed over active_s seconds of the current busy period; period_open
        says more operations of the same period are still running (revised again later)."""
        if active_s <= 0:
            return
        if period_open:
            self._open = (done_bytes, active_s)
        else:
            self._open = None
            self._periods.append((done_bytes, active_s))
        pooled = [*self._periods, *([self._open] if self._open else [])]
        total_bytes = self.prior_bytes_s * self.prior_s + sum(b for b, _ in pooled)
        total_s = self.prior_s + sum(s for _, s in pooled)
        self.rate_bytes_s = total_bytes / total_s
