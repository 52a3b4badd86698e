"""The in-process server fixture; ``bsr_inprocess`` importable as a top-level module."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # --import-mode=importlib: make bsr_inprocess importable
    sys.path.insert(0, str(HERE))


@pytest.fixture
def bsr_sm_server():
    """make(l1_bytes, devdax=False, **config) -> an InProcessServer; all closed at
    teardown."""
    import shutil

    pytest.importorskip("lmcache")
    from bsr_inprocess import InProcessServer, private_dir

    tmp_path = private_dir("bsr-sm-unit-")
    made: list[InProcessServer] = []

    def make(l1_bytes: int, devdax: bool = False, **config: Any) -> InProcessServer:
        name = f"bsr-unit-{len(made)}-{time.monotonic_ns()}"
        server = InProcessServer(tmp_path / name, l1_bytes, config, name, devdax=devdax)
        made.append(server)
        return server

    yield make
    for s in made:
        s.close()
    shutil.rmtree(tmp_path, ignore_errors=True)
