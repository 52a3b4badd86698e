"""How a measured ladder rung is classified from its checks and the capacity law (pure)."""

from __future__ import annotations

import pytest

from bsrctl.evidence.verdict import Check, Verdict
from bsrctl.experiments.restore.ladder import rung_outcome, whole_plan_bytes

P, F, U = Verdict.PASS, Verdict.FAIL, Verdict.UNKNOWN
NAMES = ("cached_token_accounting", "tier_isolation", "registration_identity",
         "canonical_output", "post_request_health")  # fmt: skip


def checks(*verdicts: Verdict) -> tuple[Check, ...]:
    return tuple(Check(n, v) for n, v in zip(NAMES, verdicts, strict=True))


@pytest.mark.parametrize(
    ("verdicts", "fits", "outcome"),
    [
        ((P, P, P, P, P), True, "pass"),
        ((F, U, U, P, P), False, "exceeds"),  # past L1 by the law: not reused, canonical, healthy
        ((F, U, U, P, P), True, "fail"),  # the same, but the whole plan fits: a real failure
        ((F, U, U, P, F), False, "unknown"),  # engine unhealthy: not the law's answer
        ((F, U, U, F, P), False, "unknown"),  # wrong output as well: not capacity alone
        ((P, P, P, F, P), True, "fail"),  # reused but the output differs
        ((P, P, F, P, P), True, "fail"),  # reused another geometry
        ((U, U, U, U, U), False, "unknown"),  # nothing measured (stack failed)
        ((P, P, P, P, U), True, "unknown"),  # health not measured: never a pass
    ],
)
def test_rung_outcome(verdicts: tuple[Verdict, ...], fits: bool, outcome: str) -> None:
    assert rung_outcome(checks(*verdicts), plan_fits=fits) == outcome


def test_whole_plan_bytes_is_whole_chunks_times_c_times_ranks_per_l1() -> None:
    # make demo's tiny Llama: 8192 tokens = 32 chunks x 262,144 B = 8 MiB, past a 4 MiB rung
    assert whole_plan_bytes(8192, 256, 262_144, 1) == 8 << 20
    assert whole_plan_bytes(8191, 256, 262_144, 1) == 31 * 262_144  # a partial chunk: none
    assert whole_plan_bytes(2048, 256, 131_072, 2) == 2 << 20  # serving TP 2: one L1, 2 ranks
