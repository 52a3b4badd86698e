"""The base of every ``bsr.*`` reply (``protocol``): a frozen ``bsrkv.strictjson`` record
whose ``from_json`` raises ``ProtocolError`` on a missing, unexpected or mistyped key.
Pure: no lmcache or torch import."""

from __future__ import annotations

from typing import ClassVar

from bsrkv.strictjson import Rank, Strict


class ProtocolError(ValueError):
    """A reply that does not have the shape its type defines."""


# A rank-keyed map: int keys here, string keys on the wire.
ByRank = dict[Rank, int]


class Reply(Strict, frozen=True):
    """A reply has exactly its fields as keys; ``OPTIONAL`` names those that may be absent
    (then their default; records with any set ``omit_defaults`` to leave them out)."""

    WHAT: ClassVar[str] = "reply"
    ERROR: ClassVar[type[ValueError]] = ProtocolError


__all__ = ["ByRank", "ProtocolError", "Reply"]
