"""The mechanism's provider as the live stack runs it: the TTR and TTU each commitment was
made on (for the accuracy evidence), the queries the observed stock reads need, and the
protected bytes sampled from the objects actually locked (their integral is C)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bsrctl.tempokv.kv import Manifest
from bsrctl.tempokv.provider import CommitDecision, StagingProvider
from bsrctl.tempokv.ttr import QueueProjectionTtr


class LiveStagingProvider(StagingProvider):
    """The mechanism's provider, plus the TTR estimate at each commitment (for the TTR
    accuracy evidence): computed before committing, from the same queue view; and the
    claim's TTU then (`ttu_of`, the controller's aged estimate; None: none reported), so
    the evidence can tell a TTU error from a TTR error."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ttr = QueueProjectionTtr(self.rate)
        self.ttu_of: Callable[[str], float | None] = lambda _claim_id: None
        # claim -> (t, TTR estimate, TTU estimate)
        self.ttr_at_commit: dict[str, tuple[float, float, float | None]] = {}

    def commit(self, claim_id: str, manifest: Manifest) -> CommitDecision:
        est = self._ttr.ttr_s(self.ttr_query(manifest))
        ttu = self.ttu_of(claim_id)
        decision = super().commit(claim_id, manifest)
        if decision.ok:
            self.ttr_at_commit[claim_id] = (self.clock.now(), est, ttu)
        return decision

    # ---- observed stock reads (the live module's; the mechanism is unchanged) ------------
    def issued_by(self, fn: Callable[[], None]) -> tuple[int, ...]:
        """Run `fn` (an ``ordinary_read``); the ops it issued."""
        first = self._next_op
        fn()
        return tuple(range(first, self._next_op))

    def read_pending(self, read_id: str) -> set[int]:
        """The ops this read still waits on (its own and those it joined)."""
        read = self._reads.get(read_id)
        return set(read.pending_ops) if read is not None else set()

    def waiters(self, op_id: int) -> tuple[int, int]:
        """(commitments, reads) still waiting on this op."""
        return (
            sum(op_id in c.pending_ops for c in self._commitments.values()),
            sum(op_id in r.pending_ops for r in self._reads.values()),
        )

    def drop_op(self, op_id: int) -> None:
        """Remove an ordinary op nobody waits on and whose read never completed: out of
        the queue view, nothing made resident, no rate sample (it was not timed)."""
        op = self._ops.pop(op_id)
        if op.running:
            if not op.bypass:
                self.tier.inflight_bytes -= op.size_bytes
            self._advance_share()
            self._running -= 1
        for obj in op.objects:
            if self._object_op.get(obj.object_id) == op_id:
                del self._object_op[obj.object_id]
        self._changed()
        self._start_ops()
        self.on_change()

    def queue_bytes(self) -> int:
        """Bytes of every op outstanding (issued, not seen complete)."""
        return sum(op.size_bytes for op in self._ops.values())


@dataclass
class Samples:
    """Protected bytes sampled from the locked objects, and their integral C (byte·s)."""

    at_s: list[float] = field(default_factory=list)
    locked_bytes: list[int] = field(default_factory=list)
    reserved_bytes: list[int] = field(default_factory=list)
    integral_byte_s: float = 0.0
    peak_locked_bytes: int = 0
    peak_reserved_bytes: int = 0
    max_keep: int = 20000

    def add(self, t_s: float, locked: int, reserved: int) -> None:
        if self.at_s:
            self.integral_byte_s += self.locked_bytes[-1] * (t_s - self.at_s[-1])
        self.peak_locked_bytes = max(self.peak_locked_bytes, locked)
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, reserved)
        if len(self.at_s) >= self.max_keep:  # keep the integral exact, thin the trace
            self.at_s, self.locked_bytes = self.at_s[-1:], self.locked_bytes[-1:]
            self.reserved_bytes = self.reserved_bytes[-1:]
        self.at_s.append(t_s)
        self.locked_bytes.append(locked)
        self.reserved_bytes.append(reserved)
