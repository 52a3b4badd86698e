"""The mechanism's provider as the live stack runs it: the TTR and TTU each commitment was
made on (for the accuracy evidence), and the protected bytes sampled from the objects
actually locked (their integral is C). What the observed stock reads need of the provider
(their ops, their waiters, dropping an op never completed) is ``StagingProvider``'s own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bsrkv.tempokv.kv import Manifest
from bsrkv.tempokv.provider import CommitDecision, StagingProvider
from bsrkv.tempokv.ttr import QueueProjectionTtr


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


@dataclass(slots=True)
class StockRead:
    """One stock lookup's L2 read as the provider observed it."""

    request_id: str
    read_id: str  # the provider's read: the claim's id (ORDINARY claim) or "stock:<id>"
    claimed: bool
    ops: tuple[int, ...]  # ordinary ops issued for it (objects neither resident nor in flight)
    objects: int
    size_bytes: int  # bytes of those ops: what the stock lookup reads from L2
    start_s: float
    world_size: int = 1
    done_s: float | None = None  # the lookup's prefetch reported done
    chunks_found: int | None = None  # what that prefetch reported
    end_s: float | None = None
    # done | dropped (ended before done: its op removed) | adopted (read by the device for
    # a commitment) | expired (STOCK_READ_MAX_S) | ended (before done, its op left to
    # another stock read) | open
    outcome: str = "open"

    def json(self) -> dict[str, Any]:
        r6 = lambda x: None if x is None else round(x, 6)  # noqa: E731
        return {
            "request": self.request_id, "read": self.read_id, "claimed": self.claimed,
            "ops": list(self.ops), "objects": self.objects, "bytes": self.size_bytes,
            "start_s": r6(self.start_s), "done_s": r6(self.done_s), "end_s": r6(self.end_s),
            "chunks_found": self.chunks_found, "outcome": self.outcome,
        }  # fmt: skip
