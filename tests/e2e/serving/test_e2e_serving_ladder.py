"""`ladder` on the real CPU stack, cpu-smoke: 2048 tokens (8 chunks, 2 MiB whole plan) over
L1 rungs 1 MiB and 4 MiB, a fresh LMCache + vLLM per rung."""

from __future__ import annotations

import pytest

from bsrctl.evidence import Verdict

from .e2e_support import SMOKE, C, assert_nothing_left, only_run, require_server_module

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ladder(tmp_path_factory: pytest.TempPathFactory):
    require_server_module()
    from bsrctl.experiments.restore.ladder import run_ladder

    out = tmp_path_factory.mktemp("ladder")
    return run_ladder(SMOKE, out, "serving", quiet=True), out, only_run(out)


def test_first_passing_rung_is_4_mib(ladder) -> None:
    verdict, out, doc = ladder
    assert verdict == Verdict.PASS, doc["summary"]
    assert [(p["id"], p["rung_outcome"]) for p in doc["points"]] == [
        ("n2048-l1-1048576", "exceeds"),  # the 2 MiB whole plan past a 1 MiB L1, by the law
        ("n2048-l1-4194304", "pass"),
    ]
    (row,) = doc["summary"]["sizes"]
    assert row["first_passing_rung_bytes"] == 4 << 20
    assert row["last_failing_rung_bytes"] == 1 << 20
    assert row["whole_plan_bytes"] == 8 * C
    assert row["l1_peak_bytes"] == 8 * C
    short = doc["points"][0]["measures"]
    assert short["cached_tokens"] == 0 and short["output_sha256"] == short["canonical_sha256"]
    assert_nothing_left(out)
