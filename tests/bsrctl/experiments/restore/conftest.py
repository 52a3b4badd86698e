"""Specs for the experiment tests: small geometry on the storage stack (seconds)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")

C = 262_144  # tiny-llama: bytes per 256-token chunk per rank
MIB = 1 << 20

DATA = Path(__file__).resolve().parents[3] / "data"
SMALL = (DATA / "small-storage-stack.yaml").read_text() + (DATA / "small-sections.yaml").read_text()


@pytest.fixture
def small_spec(tmp_path: Path):
    """write(tp=1, **replace) -> path of a small storage spec under tmp_path."""

    def write(tp: int = 1, extra: str = "") -> Path:
        p = tmp_path / "spec.yaml"
        p.write_text(SMALL.format(tp=tp, root=tmp_path / "storage", salt="t-small") + extra)
        return p

    return write
