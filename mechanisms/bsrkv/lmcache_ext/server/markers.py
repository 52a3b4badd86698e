"""Force-local markers that also keep a bounded history of what happened to them."""

from __future__ import annotations

import threading
import time
from collections import Counter, deque

from bsrkv.lmcache_ext.bsr.protocol import MarkerEvent, MarkersReply
from bsrkv.restore.markers import ForceLocalMarkers

MARKER_HISTORY = 256  # force-local marker events kept for bsr.markers


class RecordingMarkers(ForceLocalMarkers):
    """The core's ForceLocalMarkers; every set, forced lookup and clear is also recorded."""

    def __init__(self) -> None:
        super().__init__()
        self._events: deque[MarkerEvent] = deque(maxlen=MARKER_HISTORY)
        self._ev_lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def event(self, request_id: str, event: str, reason: str = "") -> None:
        with self._ev_lock:
            self.counts[event] += 1
            self._events.append(MarkerEvent(request_id, event, reason, time.time()))

    def reply(self) -> MarkersReply:
        active = len(self)
        with self._ev_lock:
            return MarkersReply(active, dict(self.counts), tuple(self._events))

    def set(self, request_id: str, reason: str) -> None:
        super().set(request_id, reason)
        self.event(request_id, "set", reason)

    def on_admitted(self, request_id: str) -> None:
        if self.record(request_id) is not None:
            super().on_admitted(request_id)
            self.event(request_id, "cleared_admitted")

    def on_teardown(self, request_id: str) -> None:
        if self.record(request_id) is not None:
            super().on_teardown(request_id)
            self.event(request_id, "cleared_teardown")
