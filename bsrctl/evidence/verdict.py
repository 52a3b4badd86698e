"""Tri-state verdicts, merged the way Jepsen merges them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Verdict(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    UNKNOWN = "UNKNOWN"


# The word a reader sees for a ladder rung whose whole plan exceeds its L1 by the capacity
# law (``rung_outcome: exceeds``): the prefix cannot be reused there, so its checks do not
# pass, yet nothing failed. Not FAIL (the system did what the law says), not UNKNOWN (the
# answer is known): its own word, kept out of the run verdict and of "not passing".
EXCEEDS = "EXCEEDS"


def shown_verdict(point: Mapping[str, Any]) -> str:
    """What a point reads as on the console and in reports: EXCEEDS for a rung past L1 by
    the law, else its verdict."""
    if point.get("rung_outcome") == "exceeds":
        return EXCEEDS
    return str(point.get("verdict", Verdict.UNKNOWN))


def merge(verdicts: Iterable[Verdict]) -> Verdict:
    """Any FAIL -> FAIL, else any UNKNOWN -> UNKNOWN, else PASS. Nothing -> UNKNOWN:
    missing evidence is never a PASS."""
    seen = [Verdict(v) for v in verdicts]
    if not seen:
        return Verdict.UNKNOWN
    if Verdict.FAIL in seen:
        return Verdict.FAIL
    if Verdict.UNKNOWN in seen:
        return Verdict.UNKNOWN
    return Verdict.PASS


def exit_code(verdict: Verdict) -> int:
    """README, verdict table: 0 PASS, 1 FAIL, 3 UNKNOWN (2 is reserved for bad input)."""
    return {Verdict.PASS: 0, Verdict.FAIL: 1, Verdict.UNKNOWN: 3}[Verdict(verdict)]


@dataclass(frozen=True)
class Check:
    name: str  # stable check name, e.g. "canonical_output"
    verdict: Verdict
    detail: str = ""  # why, with the numbers

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "verdict": str(self.verdict), "detail": self.detail}


@dataclass(frozen=True)
class Point:
    id: str  # unique within the run
    params: dict[str, Any]  # what was asked for
    measures: dict[str, Any]  # what was measured
    checks: tuple[Check, ...] = field(default_factory=tuple)
    extra: dict[str, Any] = field(default_factory=dict)  # free-form additions (traces, notes)

    @property
    def verdict(self) -> Verdict:
        return merge(c.verdict for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        out = {
            "id": self.id,
            "params": self.params,
            "measures": self.measures,
            "checks": [c.to_json() for c in self.checks],
            "verdict": str(self.verdict),
        }
        out.update(self.extra)
        return out


def check(name: str, ok: bool | None, detail: str = "") -> Check:
    """True -> PASS, False -> FAIL, None (could not tell) -> UNKNOWN."""
    verdict = Verdict.UNKNOWN if ok is None else (Verdict.PASS if ok else Verdict.FAIL)
    return Check(name=name, verdict=verdict, detail=detail)
