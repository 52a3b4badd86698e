"""The benches' entry scripts run with bench/ first on sys.path (``python bench/X.py``);
their tests import the scripts' packages (``fig6``, ``bandwidth``) the same way."""

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
