"""Checksums shared by the FS adapter's sidecars and the fault adapter's verify.

Two algorithms, chosen by ``bench/checksum_speed.py`` on the objects BSR restores:

- ``xxh3_128`` (the default): XXH3's 128-bit digest (PyPI ``xxhash``), made for integrity
  checks at memory speed: about 6-11 GiB/s per core on the CPU stack's machines against
  sha256's 0.8. 128 bits, so an accidental collision is out of reach; it is not a defence
  against someone who forges objects (nor is any check here: the objects are the tier's).
- ``sha256``: the earlier default, kept as an option (cryptographic, about 1 ms per MiB).

CRC32C (``crc32c``, SSE4.2) measured 3.6 GiB/s there, slower than XXH3-128 and only 32
bits; ``google-crc32c`` accepts read-only buffers only, a copy per object.

A checksum line is ``"<hex digest> <size in bytes>\\n"``, in a file named for its algorithm
(``<object file>.<algorithm>``), replaced atomically; a file of another algorithm is not read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import xxhash

DEFAULT_ALGORITHM = "xxh3_128"
# algorithm -> (hex digest of a buffer, digest length in hex characters). Both release the
# GIL while they hash, so load threads hash in parallel.
_DIGESTS: dict[str, tuple[Callable[[Any], str], int]] = {
    "xxh3_128": (xxhash.xxh3_128_hexdigest, 32),
    "sha256": (lambda buf: hashlib.sha256(buf).hexdigest(), 64),
}
ALGORITHMS = tuple(_DIGESTS)


@dataclass(frozen=True)
class Checksum:
    """One checksum algorithm: digests, checksum lines and their file suffix."""

    algorithm: str = DEFAULT_ALGORITHM

    def __post_init__(self) -> None:
        if self.algorithm not in _DIGESTS:
            raise ValueError(f"checksum_algorithm {self.algorithm!r}: one of {list(ALGORITHMS)}")

    @property
    def suffix(self) -> str:
        """What a checksum file adds to its object's file name."""
        return "." + self.algorithm

    def hexdigest(self, buf: Any) -> str:
        return _DIGESTS[self.algorithm][0](buf)

    def line(self, buf: Any) -> str:
        """The checksum line of a buffer."""
        return format_checksum(self.hexdigest(buf), len(buf))

    def parse(self, text: str) -> tuple[str, int] | None:
        """(hex digest, size) of a checksum line of this algorithm; None if malformed."""
        parts = text.split()
        if len(parts) != 2 or len(parts[0]) != _DIGESTS[self.algorithm][1]:
            return None
        try:
            return parts[0], int(parts[1])
        except ValueError:
            return None

    def matches(self, buf: Any, expected: tuple[str, int]) -> bool:
        """The buffer's size and digest are the expected ones (size first: it is free)."""
        return len(buf) == expected[1] and self.hexdigest(buf) == expected[0]


def format_checksum(digest_hex: str, size_bytes: int) -> str:
    return f"{digest_hex} {size_bytes}\n"
