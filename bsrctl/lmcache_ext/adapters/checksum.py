"""Checksums shared by the FS adapter's sidecars and the fault adapter's verify.

A checksum line is ``"<sha256 hex> <size in bytes>\\n"``; files are replaced atomically.
"""

from __future__ import annotations

import hashlib
from typing import Any


def sha256_hex(buf: Any) -> str:
    """sha256 of a buffer (hashlib releases the GIL, so threads hash in parallel)."""
    return hashlib.sha256(buf).hexdigest()


def format_checksum(digest_hex: str, size_bytes: int) -> str:
    return f"{digest_hex} {size_bytes}\n"


def parse_checksum(text: str) -> tuple[str, int] | None:
    parts = text.split()
    if len(parts) != 2 or len(parts[0]) != 64:
        return None
    try:
        return parts[0], int(parts[1])
    except ValueError:
        return None
