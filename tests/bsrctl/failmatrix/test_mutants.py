"""The TEST-ONLY mutant server module: known mutations only; loaded only when the caller
passes it, with the PYTHONPATH the LMCache server needs to import it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from failmatrix_mutants import MODULE_DIR, MUTATIONS, check_mutations

import bsrctl.experiments.failmatrix as failmatrix
from bsrctl.specs import StackSpec
from bsrctl.stack.launch.extensions import BSR_SERVER_MODULE, ServerModule, bsr_extensions
from bsrctl.stack.launch.process import Supervised
from bsrctl.stack.launch.serving import ServingStack, base_env
from bsrkv.settings import RestoreSettings

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

    assert importlib.util.find_spec("bsrkv.lmcache_ext.failmatrix_mutants") is None


def _module_arg(module: ServerModule | None) -> dict:
    ext = (
        bsr_extensions(SETTINGS)
        if module is None
        else bsr_extensions(SETTINGS, module.module_path, module.config, module.pythonpath)
    )
    return ServingStack(SPEC, Path("/nonexistent"), ext)._server_module_arg()


def test_real_module_unless_the_caller_passes_one() -> None:
    real = _module_arg(None)
    assert real["module_path"] == BSR_SERVER_MODULE == "bsrkv.lmcache_ext.server"
    assert "mutations" not in real["config"]
    mutant = _module_arg(MUTANT_SERVER)
    assert mutant["module_path"] == MUTANT_SERVER.module_path == "failmatrix_mutants"
    assert mutant["config"] == {**real["config"], "mutations": []}
    ghost = ServerModule(MUTANT_SERVER.module_path, {"mutations": ["ghost_hits"]})
    assert _module_arg(ghost)["config"] == {**real["config"], "mutations": ["ghost_hits"]}


class _Launched(Exception):
    pass


def _lmcache_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: ServerModule | None):
    def capture(self: ServingStack, part: Supervised) -> None:
        raise _Launched(part.env)

    monkeypatch.setattr(ServingStack, "_launch", capture)
    ext = (
        bsr_extensions(SETTINGS)
        if module is None
        else bsr_extensions(SETTINGS, module.module_path, module.config, module.pythonpath)
    )
    stack = ServingStack(SPEC, tmp_path, ext)
    with pytest.raises(_Launched) as got:
        stack.start_lmcache()
    return got.value.args[0]


def test_the_lmcache_server_gets_the_modules_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", "/inherited")
    env = _lmcache_env(tmp_path, monkeypatch, MUTANT_SERVER)
    assert env["PYTHONPATH"] == f"{MODULE_DIR}{os.pathsep}{REPO}{os.pathsep}/inherited"
    assert _lmcache_env(tmp_path, monkeypatch, None).get("PYTHONPATH") == base_env().get(
        "PYTHONPATH"
    )  # the real module: the environment bsrctl gives every part, untouched
    monkeypatch.delenv("PYTHONPATH")
    assert ServerModule("m", pythonpath=("/a", "/b")).server_pythonpath(None) == "/a:/b"


def test_production_failmatrix_names_no_mutation() -> None:
    package = Path(failmatrix.__file__).parent
    named = [p.name for p in package.glob("*.py") if "mutat" in p.read_text().lower()]
    assert named == []
