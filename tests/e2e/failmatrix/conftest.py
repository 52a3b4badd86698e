"""The failure-matrix e2e modules import the TEST-ONLY mutant server module as a top-level
module, from beside its unit tests (tests/bsrctl/failmatrix)."""

from __future__ import annotations

import sys
from pathlib import Path

MUTANTS = Path(__file__).resolve().parents[2] / "bsrctl" / "failmatrix"
if str(MUTANTS) not in sys.path:  # --import-mode=importlib: make failmatrix_mutants importable
    sys.path.insert(0, str(MUTANTS))
