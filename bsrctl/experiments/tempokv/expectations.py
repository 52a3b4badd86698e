"""A check is one of the paper's claims measured here, judged against what the spec
expects of it: `reproduce` (the claim must hold) or `deviation` (it is known not to hold,
for the stated reason). The check passes when the expectation holds. A declared deviation
that reproduces is an unexpected pass: it fails the run and says the spec needs correcting,
so a model that improves cannot hide behind an old deviation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bsrctl.evidence import Verdict
from bsrctl.tempokv.spec import Expectation


@dataclass(frozen=True, slots=True)
class Claim:
    """One claim as measured: did it reproduce (None: could not tell), and the numbers."""

    name: str  # e.g. "c_reduction[llama-3.1-8b ratio=1 fast=100GiB]"
    kind: str  # the paper.CLAIMS key
    reproduced: bool | None
    detail: str


@dataclass(frozen=True, slots=True)
class JudgedCheck:
    name: str
    verdict: Verdict
    detail: str
    claim: str  # the paper's figure and sentence
    expect: str  # "reproduce" or "deviation"
    reason: str | None
    outcome: str  # what happened, in words

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": str(self.verdict),
            "detail": self.detail,
            "claim": self.claim,
            "expect": self.expect,
            "reason": self.reason,
            "outcome": self.outcome,
        }


REPRODUCES = "reproduces"
DEVIATES_AS_DECLARED = "deviation, as declared"
UNEXPECTED_PASS = "unexpected pass: the claim reproduces; correct the spec to expect: reproduce"
DOES_NOT_REPRODUCE = "does not reproduce"
UNKNOWN = "could not tell"


def judge(claim: Claim, expectation: Expectation, statement: str) -> JudgedCheck:
    if claim.reproduced is None:
        verdict, outcome = Verdict.UNKNOWN, UNKNOWN
    elif expectation.expect == "reproduce":
        verdict = Verdict.PASS if claim.reproduced else Verdict.FAIL
        outcome = REPRODUCES if claim.reproduced else DOES_NOT_REPRODUCE
    elif claim.reproduced:
        verdict, outcome = Verdict.FAIL, UNEXPECTED_PASS
    else:
        verdict, outcome = Verdict.PASS, DEVIATES_AS_DECLARED
    return JudgedCheck(
        claim.name,
        verdict,
        claim.detail,
        statement,
        expectation.expect,
        expectation.reason,
        outcome,
    )
