"""The TempoKV wire's records on ``bsrkv.strictjson`` (the library the ``bsr.*`` replies
use too): a ``Record`` is a frozen msgspec struct whose ``from_json`` raises ``WireError``
naming the key or path; ``decode`` / ``encode`` read and write any record or dataclass
(the adapter's ``AdapterSettings``) the same way.

Pure: no LMCache, torch or vLLM import (``tempokv.wire`` builds its records on it).
"""

from __future__ import annotations

from typing import Any, ClassVar

from bsrkv import strictjson
from bsrkv.strictjson import Strict, encode


class WireError(ValueError):
    """A payload that does not have the shape its record defines."""


def decode(cls: type, raw: Any, where: str) -> Any:
    """A record or dataclass from its JSON object: exactly its fields as keys, each by type."""
    return strictjson.decode(cls, raw, where, WireError)


class Record(Strict, frozen=True):
    """Every key required (``None`` travels as ``null``), none unknown."""

    WHAT: ClassVar[str] = "tempokv record"
    ERROR: ClassVar[type[ValueError]] = WireError


__all__ = ["Record", "WireError", "decode", "encode"]
