"""Runs of every kind made in-process (storage stack, TempoKV sim), once per test module:
the report tests render them."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")
ROOT = Path(__file__).resolve().parents[3]

DATA = ROOT / "tests" / "data"
SMALL = (DATA / "small-storage-stack.yaml").read_text() + (DATA / "small-sections.yaml").read_text()


@pytest.fixture
def figures() -> None:
    """The figure tests need matplotlib (a dependency of bsrctl): fail saying so."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.fail("matplotlib is not installed: `pip install -e .` (bsrctl depends on it)")


def _only(out: Path) -> Path:
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return run


@pytest.fixture(scope="session")
def make_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """make_run(kind) -> the folder of a finished run of that kind (made once per session)."""
    made: dict[str, Path] = {}

    def make(kind: str) -> Path:
        if kind in made:
            return made[kind]
        base = tmp_path_factory.mktemp(f"run-{kind}")
        spec = base / "spec.yaml"
        spec.write_text(SMALL.format(tp=1, root=base / "storage", salt="t-report"))
        out = base / "out"
        if kind in ("sweep", "law", "ladder"):
            from bsrctl.experiments.restore.ladder import run_ladder
            from bsrctl.experiments.restore.law import run_law
            from bsrctl.experiments.restore.sweep import run_sweep

            run = {"sweep": run_sweep, "law": run_law, "ladder": run_ladder}[kind]
            run(spec, out, "storage", True)
        elif kind == "failmatrix":
            from bsrctl.experiments.failmatrix import run_matrix

            run_matrix(ROOT / "matrices" / "paper.yaml", out, "storage", lambda _: None)
        elif kind == "tempokv":
            from bsrctl.tempokv.experiments import run_tempokv

            doc = yaml.safe_load((ROOT / "ladders" / "tempokv-fig5.yaml").read_text())
            doc["workload"]["documents_tokens"] = [4096, 8192, 2048]
            doc["experiment"]["fast_tier_gib"] = [100, 25]
            spec.write_text(yaml.safe_dump(doc))
            run_tempokv(spec, out, "sim", True)
        else:
            raise ValueError(kind)
        made[kind] = _only(out)
        return made[kind]

    return make
