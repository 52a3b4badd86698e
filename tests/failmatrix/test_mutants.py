"""The TEST-ONLY mutant server module: known mutations only; loaded only when asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from bsrctl.experiments.failmatrix import MUTANT_MODULE, FailmatrixStack
from bsrctl.lmcache_ext.failmatrix_mutants import MUTATIONS, check_mutations
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
    real = FailmatrixStack(SPEC, tmp_path, None, SETTINGS)._server_module_arg()
    assert real["module_path"] == "bsrctl.lmcache_ext.server_module"
    assert "mutations" not in real["config"]
    mutant = FailmatrixStack(SPEC, tmp_path, ["ghost_hits"], SETTINGS)._server_module_arg()
    assert mutant["module_path"] == MUTANT_MODULE
    assert mutant["config"] == {**real["config"], "mutations": ["ghost_hits"]}
