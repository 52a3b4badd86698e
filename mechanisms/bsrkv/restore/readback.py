"""Install read-back: after a window is installed and synced, the destination slice is read
back through the destination's own transfer path (on the server: LMCache's store copy,
paged KV -> a scratch object) and its bytes compared with the staged object's. A mismatch
fails the restore closed (``FailureKind.READBACK_MISMATCH``): the bytes themselves are the
primary oracle, whatever the numerics of the model that reads them.

``ReadbackDestination`` is what a destination implements to be read back; the restorer
runs the check only when ``RestoreConfig.readback`` is on and the destination implements
it (the storage stack's pools verify their bytes themselves). ``ReadbackTally`` keeps one
restore's totals on the restorer's clock, so the cost is measured in the same time as
every other phase (and in virtual time in the tests).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from bsrkv.clock import Clock
from bsrkv.restore.types import ReadbackSummary, RowId, Window


@dataclass(frozen=True)
class ReadbackResult:
    """What one window's read-back compared."""

    chunks_checked: int  # (row, chunk) objects whose bytes were compared
    mismatched: tuple[tuple[RowId, int], ...]  # (row, chunk index in the request) that differ
    scratch_bytes: int  # scratch the destination holds for read-back (outside the pool)
    chunks_unchecked: int = 0  # objects not installed at all (APC-shared blocks skipped)


@runtime_checkable
class ReadbackDestination(Protocol):
    def read_back(
        self,
        request_id: str,
        window: Window,
        objects: Mapping[RowId, Sequence[Any]],
        num_chunks: int,
    ) -> ReadbackResult:
        """Read back the slice the last ``install`` of ``window`` wrote, through the same
        transfer path in the other direction, and compare each object's bytes with the
        staged ``objects``' bytes. Waits for its own copies. Raises on error."""
        ...


class ReadbackTally:
    """One restore's read-back books (one thread)."""

    def __init__(self) -> None:
        self.windows = self.checked = self.unchecked = self.mismatches = self.scratch = 0
        self.seconds = 0.0
        self.attempts = 0  # windows whose read-back was started (raised or not)

    def check(
        self,
        destination: ReadbackDestination,
        clock: Clock,
        request_id: str,
        window: Window,
        objects: Mapping[RowId, Sequence[Any]],
        num_chunks: int,
    ) -> tuple[float, str]:
        """Read one window back; (seconds taken, why it failed or "")."""
        self.attempts += 1
        t0 = clock.now()
        try:
            res = destination.read_back(request_id, window, objects, num_chunks)
        except Exception as e:
            dt = clock.now() - t0
            self.seconds += dt
            return dt, f"window {window.index}: read-back raised {e!r}"
        dt = clock.now() - t0
        self.seconds += dt
        self.windows += 1
        self.checked += res.chunks_checked
        self.unchecked += res.chunks_unchecked
        self.mismatches += len(res.mismatched)
        self.scratch = max(self.scratch, res.scratch_bytes)
        if not res.mismatched:
            return dt, ""
        first = [f"rank {r.rank} group {r.group} chunk {c}" for r, c in res.mismatched[:3]]
        return dt, (
            f"window {window.index} (chunks {window.chunk_start}..{window.chunk_stop}): "
            f"{len(res.mismatched)} of {res.chunks_checked} object(s) read back differ from "
            f"the staged bytes, first {first}"
        )

    def summary(self) -> ReadbackSummary:
        return ReadbackSummary(
            self.windows, self.checked, self.unchecked, self.mismatches, self.seconds,
            self.scratch,
        )  # fmt: skip
