"""The TEST-ONLY mutant server module: known mutations only; loaded only when the caller
passes it, with the PYTHONPATH the LMCache server needs to import it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from failmatrix_mutants import MODULE_DIR, MUTATIONS, check_mutations

import bsrctl.experiments.failmatrix as failmatrix
from bsrctl.experiments.failmatrix.rig import ModuleStack, ServerModule
from bsrctl.settings import RestoreSettings
from bsrctl.specs import StackSpec
from bsrctl.stack.process import Supervised
from bsrctl.stack.serving import SERVER_MODULE, ServingStack

from .serving_mutants import MUTANT_SERVER, REPO

SPEC = StackSpec()
SETTINGS = RestoreSettings(window_chunks=4)


def test_check_mutations() -> None:
    assert check_mutations(["skip_invalidation"]) == frozenset({"skip_invalidation"})
    assert check_mutations([]) == frozenset()
    with pytest.raises(ValueError, match="unknown mutation"):
        check_mutations(["skip_everything"])
    with pytest.raises(ValueError, match="must be a list"):
        check_mutations("skip_invalidation")
    assert "partial_lookup" in MUTATIONS


def test_the_package_ships_no_mutant() -> None:
    import importlib.util

    assert importlib.util.find_spec("bsrctl.lmcache_ext.failmatrix_mutants") is None


def test_real_module_unless_the_caller_passes_one(tmp_path: Path) -> None:
    real = ModuleStack(SPEC, tmp_path, SETTINGS)._server_module_arg()
    assert real["module_path"] == SERVER_MODULE
    assert "mutations" not in real["config"]
    mutant = ModuleStack(SPEC, tmp_path, SETTINGS, MUTANT_SERVER)._server_module_arg()
    assert mutant["module_path"] == MUTANT_SERVER.path
    assert mutant["config"] == {**real["config"], "mutations": []}
    ghost = ServerModule(MUTANT_SERVER.path, {"mutations": ["ghost_hits"]})
    assert ModuleStack(SPEC, tmp_path, SETTINGS, ghost)._server_module_arg()["config"] == {
        **real["config"],
        "mutations": ["ghost_hits"],
    }


def test_the_lmcache_server_gets_the_modules_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launched: list[Supervised] = []
    monkeypatch.setattr(ServingStack, "_launch", lambda self, part: launched.append(part))
    monkeypatch.setenv("PYTHONPATH", "/inherited")
    stack = ModuleStack(SPEC, tmp_path, SETTINGS, MUTANT_SERVER)
    for name in ("lmcache", "vllm"):
        stack._launch(Supervised(name, ["true"], tmp_path / f"{name}.log", env={"A": "1"}))
    assert [p.env for p in launched] == [
        {"A": "1", "PYTHONPATH": f"{MODULE_DIR}{os.pathsep}{REPO}{os.pathsep}/inherited"},
        {"A": "1"},
    ]
    monkeypatch.delenv("PYTHONPATH")
    assert ServerModule("m", pythonpath=("/a", "/b")).server_pythonpath(None) == "/a:/b"
    real = ModuleStack(SPEC, tmp_path, SETTINGS)
    real._launch(Supervised("lmcache", ["true"], tmp_path / "l.log"))
    assert launched[-1].env == {}


def test_production_failmatrix_names_no_mutation() -> None:
    package = Path(failmatrix.__file__).parent
    named = [p.name for p in package.glob("*.py") if "mutat" in p.read_text().lower()]
    assert named == []
