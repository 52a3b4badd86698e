"""What the server module asks of TempoKV: ``TempoKVHooks``, and ``NO_TEMPOKV`` for none.

The module calls these hooks explicitly, each under its guard site (``tempokv_gate``,
``tempokv_holding``, ...); the factory composes ``bsrkv.lmcache_ext.tempokv.component``'s
component in. A module built without one holds ``NO_TEMPOKV``: no hook has an effect and
the ``tempokv.*`` methods answer as TempoKV turned off.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from bsrkv.tempokv import wire


class TempoKVHooks(Protocol):
    """TempoKV as one component of the server module: retrieval hooks and its methods."""

    def gate(self, key: Any, tp_size: int) -> bool:
        """True when the lookup is held for committed staging (answered later)."""
        ...

    def holding(self, request_id: str) -> bool: ...

    def observe(self, key: Any) -> None:
        """A stock lookup of ``key`` reads L2 itself."""
        ...

    def stock_done(self, request_id: str, chunks: int) -> None: ...

    def retrieved(self, request_id: str, rank: int | None) -> None: ...

    def ended(self, request_id: str) -> None: ...

    def configure(self, body: bytes) -> bytes:
        """``tempokv.configure``'s reply to a body the control token admitted."""
        ...

    def status(self) -> bytes: ...

    def update(self, body: bytes) -> bytes: ...

    def close(self) -> None: ...


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, default=str).encode()


class NoTempoKV:
    """No TempoKV in this module: every hook a no-op, every method answers "off"."""

    def gate(self, key: Any, tp_size: int) -> bool:
        return False

    def holding(self, request_id: str) -> bool:
        return False

    def observe(self, key: Any) -> None:
        return None

    def stock_done(self, request_id: str, chunks: int) -> None:
        return None

    def retrieved(self, request_id: str, rank: int | None) -> None:
        return None

    def ended(self, request_id: str) -> None:
        return None

    def configure(self, body: bytes) -> bytes:
        error = "TempoKV is not composed into this server module"
        return _json(wire.ConfigureReply(False, None, error).to_json())

    def status(self) -> bytes:
        return _json(wire.OFF_STATUS)

    def update(self, body: bytes) -> bytes:
        return _json(wire.UpdateReply.turned_off().to_json())

    def close(self) -> None:
        return None


NO_TEMPOKV: TempoKVHooks = NoTempoKV()
