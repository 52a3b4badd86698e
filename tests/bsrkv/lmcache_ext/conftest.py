"""``lmcext_kv`` (the L2 adapters' shared steps) importable as a top-level module: the
adapter driver runs the same steps as a script, with only its own folder on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
if str(HERE) not in sys.path:  # --import-mode=importlib: make lmcext_kv importable
    sys.path.insert(0, str(HERE))
