"""Shared by the serving-stack e2e modules: skip without the BSR server module, run one
command per module, and check that every process it started is gone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bsrctl.evidence import load_evidence
from bsrctl.stack.launch.process import pids_alive

LADDERS = Path(__file__).parents[3] / "ladders"
SMOKE = LADDERS / "cpu-smoke.yaml"
C = 262_144


def require_server_module() -> None:
    try:
        import bsrkv.lmcache_ext.server  # noqa: F401
    except Exception as exc:  # the module is what puts BSR into the LMCache server
        pytest.skip(f"bsrkv.lmcache_ext.server does not import ({exc!r})")


def only_run(out: Path) -> dict[str, Any]:
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return load_evidence(run / "evidence.json")


def launched_pids(run_dir: Path) -> list[int]:
    pids: list[int] = []
    for state in run_dir.rglob("stack/state.json"):
        doc = json.loads(state.read_text())
        pids += [p for part in doc["launched"] for p in [part["pid"], *part["children"]] if p]
    return pids


def assert_nothing_left(out: Path) -> None:
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    pids = launched_pids(run)
    assert pids, "no launched processes recorded"
    assert pids_alive(pids) == [], f"still alive: {pids_alive(pids)}"


def assert_still_running(kept: Any) -> None:
    """A run on a kept deployment (``tests.stack.kept``) left every process of it running,
    and the spec it runs is the one the modules on it load (cpu-smoke's stack)."""
    from bsrctl.experiments.restore.spec import load_experiment

    mains = [p.pid for p in kept.stack.parts.values()]
    assert mains and pids_alive(mains) == mains
    for section in ("sweep", "law"):
        assert load_experiment(SMOKE, section, "serving")[0].stack == kept.launched.spec
