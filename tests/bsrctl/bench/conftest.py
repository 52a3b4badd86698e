"""The benches' entry scripts run with their own folder first on sys.path
(``python bench/X.py``, ``python bench/tempokv/X.py``); their tests import the scripts and
their packages (``bandwidth``, ``fig6``, ``fig6_regime``) the same way."""

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"
for folder in (BENCH, BENCH / "tempokv"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
