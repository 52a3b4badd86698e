"""Specs for the experiment tests: small geometry on the storage stack (seconds)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")

C = 262_144  # tiny-llama: bytes per 256-token chunk per rank
MIB = 1 << 20

DATA = Path(__file__).resolve().parents[2] / "data"
SMALL = (DATA / "small-storage-stack.yaml").read_text() + (DATA / "small-sections.yaml").read_text()


@pytest.fixture
def small_spec(tmp_path: Path):
    """write(tp=1, **replace) -> path of a small storage spec under tmp_path."""

    def write(tp: int = 1, extra: str = "") -> Path:
        p = tmp_path / "spec.yaml"
        p.write_text(SMALL.format(tp=tp, root=tmp_path / "storage", salt="t-small") + extra)
        return p

    return write


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
    from tests.stack.kept import KeptDeployment

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
