"""Staging claims: request-scoped, metadata-only records of a reusable-KV hit."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from bsrkv.tempokv.kv import Manifest


class ClaimState(IntEnum):
    PLANNED = 0  # hit known; no I/O issued, no capacity held
    STAGING = 1  # committed: reserved and protected, staging I/O outstanding
    STAGEREADY = 2  # every object resident and protected
    TRANSFERRING = 3  # fast-tier→GPU retrieval in progress
    RELEASED = 4  # retrieval done; protection on this claim's behalf ended
    CANCELLED = 5  # request gone; protection kept only while I/O may still use it
    ORDINARY = 6  # demand retrieval chosen instead; never committed from here on


TERMINAL = frozenset({ClaimState.RELEASED, ClaimState.CANCELLED, ClaimState.ORDINARY})
COMMITTED = frozenset({ClaimState.STAGING, ClaimState.STAGEREADY, ClaimState.TRANSFERRING})

# Legal moves; anything else is a bug and raises.
_NEXT: dict[ClaimState, frozenset[ClaimState]] = {
    ClaimState.PLANNED: frozenset(
        {ClaimState.STAGING, ClaimState.STAGEREADY, ClaimState.CANCELLED, ClaimState.ORDINARY}
    ),
    ClaimState.STAGING: frozenset({ClaimState.STAGEREADY, ClaimState.CANCELLED}),
    ClaimState.STAGEREADY: frozenset({ClaimState.TRANSFERRING, ClaimState.CANCELLED}),
    ClaimState.TRANSFERRING: frozenset({ClaimState.RELEASED, ClaimState.CANCELLED}),
    ClaimState.RELEASED: frozenset(),
    ClaimState.CANCELLED: frozenset(),
    ClaimState.ORDINARY: frozenset(),
}


class IllegalTransition(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class Transition:
    t_s: float  # clock time of the move
    state: ClaimState  # state entered


@dataclass(slots=True)
class Claim:
    """Mutable only through `move`; every move is appended to `trace`."""

    claim_id: str  # the request id
    manifest: Manifest
    reported_s: float  # when the hit was reported
    ttu_s: float | None = None  # latest runtime TTU estimate, valid at ttu_at_s
    ttu_at_s: float = 0.0
    retrieval_requested: bool = False
    capacity_refusals: int = 0  # commitment attempts refused for lack of budget
    state: ClaimState = ClaimState.PLANNED
    trace: list[Transition] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.trace:
            self.trace.append(Transition(self.reported_s, ClaimState.PLANNED))

    def move(self, state: ClaimState, t_s: float) -> None:
        if state not in _NEXT[self.state]:
            raise IllegalTransition(f"claim {self.claim_id}: {self.state.name} -> {state.name}")
        self.state = state
        self.trace.append(Transition(t_s, state))

    def ttu_now(self, now_s: float) -> float | None:
        """The latest timestamped TTU, aged by the time elapsed since it was made."""
        return None if self.ttu_s is None else self.ttu_s - (now_s - self.ttu_at_s)

    @property
    def committed(self) -> bool:
        return self.state in COMMITTED

    def trace_json(self) -> list[list[float | str]]:
        return [[round(tr.t_s, 6), tr.state.name] for tr in self.trace]
