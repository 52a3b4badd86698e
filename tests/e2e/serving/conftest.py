"""The serving e2e modules' one kept deployment (law and sweep share it)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")


@pytest.fixture(scope="package")  # stopped once this package is done, not held all session
def smoke_stack(tmp_path_factory: pytest.TempPathFactory):
    """One launched cpu-smoke deployment (vLLM + LMCache with the BSR module, by PID) for the
    e2e modules that only need it running: law, then sweep (one xdist group,
    tests/conftest.py). Its first run launches it; the teardown stops it by PID and checks
    every process it started is gone and every /dev/shm segment they mapped removed."""
    from bsrctl.experiments.restore.spec import load_experiment
    from bsrctl.stack.deployments.launched import LaunchedDeployment
    from bsrctl.stack.launch.process import pids_alive
    from bsrctl.stack.launch.shm_ledger import SHM
    from tests.bsrctl.stack.kept import KeptDeployment

    from .e2e_support import SMOKE, launched_pids, require_server_module

    require_server_module()
    spec, _ = load_experiment(SMOKE, "sweep", "serving")
    root = tmp_path_factory.mktemp("smoke-stack")
    kept = KeptDeployment(LaunchedDeployment(spec.stack, root, spec.settings(0)))
    try:
        yield kept
    finally:
        kept.close()
    pids = launched_pids(root)
    assert kept.launches == 0 or pids, "no launched processes recorded"
    assert pids_alive(pids) == [], f"still alive: {pids_alive(pids)}"
    named = kept.stack.shm_named
    assert sorted(n for n in named if (SHM / n).exists()) == []
