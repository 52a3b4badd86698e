"""What one restore call keeps while it runs (one thread): its windows in flight, events,
per-rank pool levels and peaks, and where each window's time went (``WindowTiming``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bsrkv.restore.readback import ReadbackTally
from bsrkv.restore.types import EventKind, RestoreEvent, RestorePlan, Window, WindowTiming


@dataclass
class InFlight:
    window: Window
    ticket: Any
    bytes_by_rank: dict[int, int]
    budget_chunks: int  # chunks held in the budget (0 on the whole-plan path)


class RunState:
    """State of one restore call (one thread)."""

    def __init__(self, plan: RestorePlan[Any], deadline: float | None, t0: float) -> None:
        self.plan = plan
        self.deadline = deadline  # clock value the whole retrieve must finish by, or None
        self.t0 = t0  # clock value at restore start (timings are relative to it)
        self.events: list[RestoreEvent] = []
        self.installed_bytes = 0
        self.windows_done = 0
        self.level: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self.admit_wait: dict[int, float] = {}  # window -> seconds blocked on the budget
        self.timing: dict[int, dict[str, float]] = {}  # window -> phase marks
        # An install was issued and no sync has confirmed it landed: on a device with
        # asynchronous copies they may still read the staged objects, so nothing is released
        # before a sync (the stock retrieve releases from a stream callback, after its copies).
        self.unsynced = False
        # Why the staged windows were not released (the device could not be synced), or "".
        self.withheld = ""
        self.readback = ReadbackTally()  # install read-back books (RestoreConfig.readback)

    def mark(self, window: Window, name: str, value: float) -> None:
        self.timing.setdefault(window.index, {})[name] = value

    def timings(self) -> tuple[WindowTiming, ...]:
        """Windows that were installed, in window order."""
        out = []
        for j in sorted(self.timing):
            t = self.timing[j]
            if "installed_at_s" not in t:
                continue
            out.append(
                WindowTiming(
                    index=j,
                    admit_wait_s=self.admit_wait.get(j, 0.0),
                    staged_at_s=t["staged_at_s"],
                    ready_at_s=t["ready_at_s"],
                    installed_at_s=t["installed_at_s"],
                    released_at_s=t.get("released_at_s", -1.0),
                    wait_s=t["wait_s"],
                    install_s=t["install_s"],
                    sync_s=t["sync_s"],
                    readback_s=t.get("readback_s"),
                )
            )
        return tuple(out)

    def event(self, kind: EventKind, window: Window | None) -> None:
        if window is None:
            self.events.append(RestoreEvent(kind, -1, 0, self.plan.prefix_chunks))
        else:
            self.events.append(
                RestoreEvent(kind, window.index, window.chunk_start, window.chunk_stop)
            )

    def add(self, by_rank: dict[int, int], sign: int) -> None:
        for rank, n in by_rank.items():
            self.level[rank] = self.level.get(rank, 0) + sign * n
            self.peak[rank] = max(self.peak.get(rank, 0), self.level[rank])
