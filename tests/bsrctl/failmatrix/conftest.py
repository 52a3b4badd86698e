"""The failure-matrix tests import the TEST-ONLY mutant server module as a top-level module."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # --import-mode=importlib: make failmatrix_mutants importable
    sys.path.insert(0, str(HERE))
