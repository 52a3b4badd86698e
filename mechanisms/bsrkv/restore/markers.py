"""Force-local markers: after a failed restore, the next admission pass of that request
reports 0 external tokens (local prefill) instead of re-triggering the same external
lookup. The marker is set on a failed restore and cleared only on successful RUNNING
admission or on request teardown.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import IntEnum


class MarkerState(IntEnum):
    """A request's marker, in lifecycle order."""

    CLEAR = 0  # no marker: external lookups are honoured
    FORCED = 1  # failed restore seen: external tokens reported as 0


@dataclass(frozen=True)
class MarkerRecord:
    """Why a request is forced local."""

    request_id: str  # the request
    reason: str  # failure detail that set the marker


class ForceLocalMarkers:
    """Thread-safe registry of force-local markers keyed by request id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._marks: dict[str, MarkerRecord] = {}

    def set(self, request_id: str, reason: str) -> None:
        with self._lock:
            self._marks[request_id] = MarkerRecord(request_id, reason)

    def state(self, request_id: str) -> MarkerState:
        with self._lock:
            return MarkerState.FORCED if request_id in self._marks else MarkerState.CLEAR

    def record(self, request_id: str) -> MarkerRecord | None:
        with self._lock:
            return self._marks.get(request_id)

    def on_admitted(self, request_id: str) -> None:
        """Successful RUNNING admission: clear."""
        with self._lock:
            self._marks.pop(request_id, None)

    def on_teardown(self, request_id: str) -> None:
        """Request finished or aborted: clear."""
        with self._lock:
            self._marks.pop(request_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._marks)
