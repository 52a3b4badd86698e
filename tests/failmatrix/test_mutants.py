"""The TEST-ONLY mutant server module: known mutations only; loaded only when asked."""

from __future__ import annotations

from pathlib import Path

import pytest
from failmatrix_mutants import MODULE_PATH, MUTATIONS, check_mutations

from bsrctl.errors import BadInput
from bsrctl.experiments.failmatrix import FailmatrixStack
from bsrctl.settings import RestoreSettings
from bsrctl.specs import StackSpec

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


def test_real_module_unless_mutations_are_asked(tmp_path: Path) -> None:
    real = FailmatrixStack(SPEC, tmp_path, None, None, SETTINGS)._server_module_arg()
    assert real["module_path"] == "bsrctl.lmcache_ext.server"
    assert "mutations" not in real["config"]
    mutant = FailmatrixStack(
        SPEC, tmp_path, ["ghost_hits"], MODULE_PATH, SETTINGS
    )._server_module_arg()
    assert mutant["module_path"] == MODULE_PATH == "failmatrix_mutants"
    assert mutant["config"] == {**real["config"], "mutations": ["ghost_hits"]}


def test_mutations_need_the_mutant_module_from_the_caller(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="mutant server module"):
        FailmatrixStack(SPEC, tmp_path, ["ghost_hits"])


def test_the_package_ships_no_mutant() -> None:
    import importlib.util

    assert importlib.util.find_spec("bsrctl.lmcache_ext.failmatrix_mutants") is None
