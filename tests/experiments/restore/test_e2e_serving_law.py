"""`law` on the real CPU stack, cpu-smoke: W = 2, 4, 8 at 2048 tokens on one deployment."""

from __future__ import annotations

import pytest

from bsrctl.evidence import Verdict

from .e2e_support import SMOKE, C, assert_nothing_left, only_run, require_server_module

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def law(tmp_path_factory: pytest.TempPathFactory):
    require_server_module()
    from bsrctl.experiments.restore.law import run_law

    out = tmp_path_factory.mktemp("law")
    return run_law(SMOKE, out, "serving", quiet=True), out, only_run(out)


def test_law_passes_with_slope_c(law) -> None:
    verdict, out, doc = law
    assert verdict == Verdict.PASS, doc["summary"]
    fit = doc["summary"]["fit"]
    assert fit["restore_pool_peak_bytes"] == [2 * C, 4 * C, 8 * C]
    assert fit["slope_bytes_per_chunk"] == C and fit["r2"] == 1.0
    assert all(p["verdict"] == "PASS" for p in doc["points"])
    assert_nothing_left(out)
