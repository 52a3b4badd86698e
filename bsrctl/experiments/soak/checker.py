"""The soak's checker: pure functions over what the soak recorded, each finding a
``Violation`` named by its request and the fault armed when it ran.

Throughout: every answer's output is the canonical one (a recomputed request's is too:
never wrong), a request whose restore failed used none of it (0 cached tokens: vLLM was told
and recomputed), every request answers within its deadline and without an error, the restore
pool's high-water mark stays within B x c + aux at every sample. After the quiesce: no
force-local marker, no admission budget in use, no restore pool bytes, no tracked request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Sent:
    """One request of the soak, as it ended."""

    index: int
    round: int
    prefix: int  # index into soak.prefix_tokens
    sent_s: float  # from the soak's start
    answer_s: float | None  # send -> answer (or explicit error); None: nothing by the deadline
    output_sha256: str  # "" without an answer
    cached_tokens: int | None
    error: str  # the request's explicit error ("" when it answered)
    fault: int | None  # the schedule's index of the fault armed during its round
    request_id: str = ""  # the X-Request-Id it was sent with
    failed_restore: str = ""  # the failure of its restore on any rank ("" when none failed)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class Violation:
    kind: str  # wrong_output | fail_open | error | deadline | pool_bound | left_after_quiesce
    detail: str
    request: int | None = None  # Sent.index
    fault: int | None = None  # the schedule's index

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "detail": self.detail, "request": self.request,
                "fault": self.fault}  # fmt: skip


def request_violations(sent: Sent, canonical_sha256: str, deadline_s: float) -> list[Violation]:
    """A request's: no answer by its deadline, an explicit error, or an output that is not
    the canonical one (a restore that installed wrong bytes, never a recompute)."""
    out: list[Violation] = []

    def bad(kind: str, detail: str) -> None:
        out.append(Violation(kind, f"request {sent.index} (prefix {sent.prefix}): {detail}",
                             sent.index, sent.fault))  # fmt: skip

    if sent.answer_s is None or sent.answer_s > deadline_s:
        took = "no answer" if sent.answer_s is None else f"answered after {sent.answer_s:.1f} s"
        bad("deadline", f"{took}, deadline {deadline_s:g} s")
    if sent.failed_restore and (sent.cached_tokens or 0) > 0:
        used = f"{sent.cached_tokens} cached tokens"
        bad("fail_open", f"its restore failed ({sent.failed_restore}) yet vLLM used {used} "
                         "(blocks never invalidated)")  # fmt: skip
    if sent.error:
        bad("error", sent.error)
    elif sent.output_sha256 and sent.output_sha256 != canonical_sha256:
        got, want = sent.output_sha256[:16], canonical_sha256[:16]
        bad("wrong_output", f"output {got} is not the canonical {want} "
                            f"(cached {sent.cached_tokens} tokens)")  # fmt: skip
    return out


def pool_violations(
    samples: Sequence[tuple[float, int]], bound_bytes: int, fault_at: Any = None
) -> list[Violation]:
    """Samples (seconds from the start, the pool's high-water mark over ranks) above B x c
    + aux. ``fault_at(t)``: the fault placed in the round the sample at t ended (None:
    none), named in the violation."""
    return [
        Violation(
            "pool_bound",
            f"restore pool peak {peak} B at {t:.1f} s > bound {bound_bytes} B",
            None,
            fault_at(t) if fault_at else None,
        )  # fmt: skip
        for t, peak in samples
        if peak > bound_bytes
    ]


def quiesce_violations(state: dict[str, Any]) -> list[Violation]:
    """What must be left after the load stopped and the quiesce passed: nothing."""
    found = {
        "force-local markers": state.get("markers"),
        "admission budget chunks in use": state.get("budget_in_use_chunks"),
        "restore pool bytes": sum((state.get("pool_level_bytes_by_rank") or {}).values()),
        "tracked requests": state.get("tracked_requests"),
    }
    return [
        Violation("left_after_quiesce", f"{what}: {n}" if n is not None else f"{what}: unread")
        for what, n in found.items()
        if n != 0
    ]


def summary_line(violations: Sequence[Violation], faults: int, completed: int) -> str:
    """The line the soak prints last (and its summary keeps)."""
    return (
        f"violations: {len(violations)}; faults injected: {faults}; requests completed: {completed}"
    )
