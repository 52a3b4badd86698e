"""The command line of the benches over one prefix's chunks (checksum_speed, readback_compare)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def chunk_args(description: str) -> argparse.Namespace | None:
    """--rounds, --chunks, --chunk-bytes, --evidence; None (after one line) when one is < 1."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--chunk-bytes", type=int, default=262144)
    ap.add_argument("--evidence", type=Path, default=Path("reports"))
    args = ap.parse_args()
    for name in ("rounds", "chunks", "chunk_bytes"):
        if getattr(args, name) < 1:
            print(f"--{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return None
    return args
