"""`law` on the real CPU stack, cpu-smoke: W = 2, 4, 8 at 2048 tokens on one deployment (the
package's kept one, shared with sweep)."""

from __future__ import annotations

import pytest

from bsrctl.evidence import Verdict

from .e2e_support import SMOKE, C, assert_still_running, only_run, require_server_module

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def law(tmp_path_factory: pytest.TempPathFactory, smoke_stack):
    """On the package's kept cpu-smoke deployment (launched by this run when it is first)."""
    require_server_module()
    from bsrctl.experiments.restore.law import run_law

    out = tmp_path_factory.mktemp("law")
    verdict = run_law(SMOKE, out, "serving", quiet=True, deployment=smoke_stack)
    return verdict, out, only_run(out)


def test_law_passes_with_slope_c(law, smoke_stack) -> None:
    verdict, out, doc = law
    assert verdict == Verdict.PASS, doc["summary"]
    fit = doc["summary"]["fit"]
    assert fit["restore_pool_peak_bytes"] == [2 * C, 4 * C, 8 * C]
    assert fit["slope_bytes_per_chunk"] == C and fit["r2"] == 1.0
    assert all(p["verdict"] == "PASS" for p in doc["points"])
    assert not list(out.glob("*/deploy-*"))  # one deployment; kept up for sweep (conftest.py)
    assert doc["stack"]["parts"]["lmcache"]["pid"] == smoke_stack.stack.parts["lmcache"].pid
    assert_still_running(smoke_stack)
