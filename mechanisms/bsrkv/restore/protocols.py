"""The two sides a bounded restore drives, as Protocols.

- ``RestoreStorage``: where the external state lives and where it is staged (LMCache's
  StorageManager: L1 = staging pool, L2 = the tier restored from). It can probe without
  staging, stage one window with read locks, report when the window is complete, hand out
  the staged objects, and release them.
- ``RestoreDestination``: where the restored state goes (vLLM's paged KV blocks in the
  server module; a file-backed or verifying pool on the storage stack). It installs one
  window into the slice of the request's blocks that covers the window's chunks, syncs,
  and can mark every block of a request invalid.

The core (``restorer.py``) never sees anything else of either side. A ticket is whatever
``stage`` returns; only the same storage object interprets it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from bsrkv.restore.types import RestoreRequest, RowId, StageResult, Window


class RestoreStorage(Protocol):
    """Storage side of a restore. All methods are called from the restoring thread."""

    def probe(self, request: RestoreRequest[Any]) -> Sequence[Sequence[bool]]:
        """Hit bitmap per row (request order), per chunk, from every tier.

        Must leave nothing staged and no lock held when it returns.
        """
        ...

    def stage(self, request: RestoreRequest[Any], window: Window) -> Any:
        """Submit a locked prefetch of the window's columns of every row; return a ticket.

        Must not block on I/O. The bytes it may stage are at most
        ``window.num_chunks * sum(row.chunk_bytes)``.
        """
        ...

    def wait(self, ticket: Any, timeout_s: float) -> StageResult | None:
        """Block until the window's prefetch finished; None if ``timeout_s`` passed first.

        ``timeout_s`` is what the restorer's clock allows (window timeout, capped by the
        retrieve deadline); a storage that cannot wait on that clock waits in wall time.
        """
        ...

    def read(
        self, ticket: Any, num_chunks: int
    ) -> AbstractContextManager[Mapping[RowId, Sequence[Any]]]:
        """Context manager giving, per row, the staged objects of the window's first
        ``num_chunks`` chunks, in chunk order. Raises KeyError if any is absent."""
        ...

    def release(self, ticket: Any) -> None:
        """Return every lock and staging buffer the ticket holds, including those of a
        prefetch still in flight (drain it). Idempotent. After it returns, the staging
        pool holds none of the ticket's bytes."""
        ...


class RestoreDestination(Protocol):
    """Destination side of a restore (the request's allocated blocks)."""

    def install(
        self,
        request_id: str,
        window: Window,
        objects: Mapping[RowId, Sequence[Any]],
        num_chunks: int,
    ) -> int:
        """Copy the first ``num_chunks`` chunks of the window, per row, into the block
        slice covering chunks [window.chunk_start, window.chunk_start + num_chunks).
        Returns bytes installed. May be asynchronous until ``sync``. Raises on error."""
        ...

    def sync(self, request_id: str) -> None:
        """Wait until every install issued for the request has landed. Raises on error."""
        ...

    def mark_invalid(self, request_id: str) -> None:
        """Mark every destination block of the request invalid (fail-closed). Must not raise."""
        ...
