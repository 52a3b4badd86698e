"""A check is one of the paper's claims measured here, judged against what the spec
expects of it: `reproduce` (the claim must hold) or `deviation` (it is known not to hold,
for the stated reason). The check passes when the expectation holds. A declared deviation
that reproduces is an unexpected pass: it fails the run and says the spec needs correcting,
so a model that improves cannot hide behind an old deviation.

A claim that orders two arms measured in the same repeats (``ordering_claim``) is decided by
``bsrctl.stats.ordering_verdict``: the 95 % interval of the paired per-repeat ratio (a
difference where the other arm measured a zero) on the claimed side reproduces, on the
other side does not, straddling it (or one repeat) could not tell, and the detail names the
interval and about how many repeats would decide it. The expectation is applied on top."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bsrctl import stats
from bsrctl.evidence import Verdict
from bsrctl.tempokv.measures import PooledMeasures
from bsrctl.tempokv.spec import Expectation


@dataclass(frozen=True, slots=True)
class Claim:
    """One claim as measured: did it reproduce (None: could not tell), and the numbers."""

    name: str  # e.g. "c_reduction[llama-3.1-8b ratio=1 fast=100GiB]"
    kind: str  # the paper.CLAIMS key
    reproduced: bool | None
    detail: str


REPRODUCE = Expectation(expect="reproduce")
ORDERING_SEED = 0  # the bootstrap's: the same repeats give the same interval every time


def ordering_claim(
    name: str,
    kind: str,
    a: Sequence[float],
    b: Sequence[float],
    claim: str,
    what: str,
    threshold: float | None = None,
) -> Claim:
    """``claim`` (``a<b``, ``a>=b``, ...) of arm a against arm b over paired repeats
    (module doc); ``what`` says what a and b are, the interval follows it."""
    try:
        zero = any(y == 0 for y in b)
        o = stats.ordering_verdict(
            a, b, claim, "diff" if zero else "ratio", ORDERING_SEED, threshold
        )
    except ValueError as exc:  # a missing or non-finite repeat: nothing to decide
        return Claim(name, kind, None, f"{what}: {exc}")
    reproduced = {"PASS": True, "FAIL": False}.get(o.verdict)
    return Claim(name, kind, reproduced, f"{what}: {o.verdict}, {o.detail}")


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


def ordered_check(
    rows: Mapping[str, PooledMeasures],
    name: str,
    a: str,
    b: str,
    key: Literal["p95_ttft_s", "c_mib_s_per_req"],
    claim: str,
) -> JudgedCheck:
    """``a``'s measure below ``b``'s, decided on the paired repeats' interval
    (``expectations.ordering_claim``); the pooled values and each repeat's outcome beside."""
    per_a, per_b = getattr(rows[a].per_repeat, key), getattr(rows[b].per_repeat, key)
    held = [x < y for x, y in zip(per_a, per_b, strict=True)]
    per = ", ".join("held" if h else "failed" for h in held)
    what = (f"{a} {key} {getattr(rows[a], key)} vs {b} {getattr(rows[b], key)} pooled over "
            f"{rows[a].requests} requests; a = {a}, b = {b}")  # fmt: skip
    c = ordering_claim(name, name, per_a, per_b, "a<b", what)
    c = Claim(
        c.name, c.kind, c.reproduced, f"{c.detail}; per repeat: {per} ({sum(held)}/{len(held)})"
    )
    return judge(c, REPRODUCE, claim)


C_CLAIM = "Fig. 4: TempoKV's protected byte-time C below Immediate's"
P95_CLAIM = "Fig. 4: TempoKV's p95 TTFT below Demand's"


def run_checks(rows: Mapping[str, PooledMeasures]) -> list[JudgedCheck]:
    out = []
    if "tempokv" in rows and "immediate" in rows:
        c = "c_mib_s_per_req"
        out.append(ordered_check(rows, "c_below_immediate", "tempokv", "immediate", c, C_CLAIM))
    if "tempokv" in rows and "demand" in rows:
        p95 = "p95_ttft_s"
        out.append(ordered_check(rows, "p95_below_demand", "tempokv", "demand", p95, P95_CLAIM))
    return out
