"""How a measured ladder rung is classified from its checks (pure)."""

from __future__ import annotations

import pytest

from bsrctl.evidence.verdict import Check, Verdict
from bsrctl.experiments.restore.ladder import rung_outcome

P, F, U = Verdict.PASS, Verdict.FAIL, Verdict.UNKNOWN
NAMES = ("cached_token_accounting", "tier_isolation", "registration_identity",
         "canonical_output", "post_request_health")  # fmt: skip


def checks(*verdicts: Verdict) -> tuple[Check, ...]:
    return tuple(Check(n, v) for n, v in zip(NAMES, verdicts, strict=True))


@pytest.mark.parametrize(
    ("verdicts", "outcome"),
    [
        ((P, P, P, P, P), "pass"),
        ((F, U, U, P, P), "capacity"),  # not reused, output recomputed canonically, healthy
        ((F, U, U, P, F), "unknown"),  # engine unhealthy: not a capacity answer
        ((F, U, U, F, P), "unknown"),  # wrong output as well: not capacity alone
        ((P, P, P, F, P), "fail"),  # reused but the output differs
        ((P, P, F, P, P), "fail"),  # reused another geometry
        ((U, U, U, U, U), "unknown"),  # nothing measured (stack failed)
        ((P, P, P, P, U), "unknown"),  # health not measured: never a pass
    ],
)
def test_rung_outcome(verdicts: tuple[Verdict, ...], outcome: str) -> None:
    assert rung_outcome(checks(*verdicts)) == outcome
