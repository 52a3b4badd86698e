"""Specs for the experiment tests: small geometry on the storage stack (seconds)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")

C = 262_144  # tiny-llama: bytes per 256-token chunk per rank
MIB = 1 << 20

SMALL = """\
stack:
  lmcache:
    l1_size_bytes: 8388608
    chunk_size: 256
registration: tiny-llama
storage:
  tp_ranks: {tp}
  root_dir: {root}
restore:
  window_timeout_s: 20
salt: t-small
memory_reserve_bytes: 1 MiB
ladder:
  sizes_tokens: [1024, 2048]
  rungs_bytes: [1 MiB, 2 MiB, 4 MiB]
sweep:
  sizes_tokens: [1024, 2048, 4096]
  window_chunks: 2
  whole_plan_contrast: true
law:
  tokens: 4096
  windows_chunks: [1, 2, 4, 8]
"""


@pytest.fixture
def small_spec(tmp_path: Path):
    """write(tp=1, **replace) -> path of a small storage spec under tmp_path."""

    def write(tp: int = 1, extra: str = "") -> Path:
        p = tmp_path / "spec.yaml"
        p.write_text(SMALL.format(tp=tp, root=tmp_path / "storage") + extra)
        return p

    return write
