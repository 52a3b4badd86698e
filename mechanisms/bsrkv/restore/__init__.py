"""BSR, bounded-state restoration: the pure core. It imports nothing of LMCache, torch or
the rest of bsrkv but ``bsrkv.clock`` (import-linter contracts in pyproject.toml).

Public API (see each module):

- ``types``: RowId, RowKeys, RestoreRequest, RestorePlan, Window, StageResult,
  RestoreOutcome, RestoreEvent, WindowTiming (per-window phase times, always recorded);
  IntEnums RestoreState, FailureKind, EventKind.
- ``protocols``: RestoreStorage (probe / stage / wait / read / release) and
  RestoreDestination (install / sync / mark_invalid).
- ``plan``: confirm_plan (HMA/TP composition), split_windows, complete_prefix.
- ``restorer``: RestoreConfig(W, B, timeouts), BoundedRestorer(storage, config, clock=)
  .probe / .restore / .on_admitted / .on_teardown. Every timeout reads the injected
  ``bsrkv.clock.Clock`` (default: wall), so tests run them in virtual time.
- ``admission``: AdmissionBudget (B chunks, FIFO, no hold-and-wait).
- ``gauge``: RestorePoolGauge (per-rank exact high-water mark of restore staging bytes).
- ``markers``: ForceLocalMarkers.
- ``readback``: ReadbackDestination (read_back), ReadbackResult, ReadbackTally: the
  install read-back (``RestoreConfig.readback``), totals in ``RestoreOutcome.readback``.
- ``stall``: StallWatch (process-stall ticker on a clock) and its install guard.
- ``errors``: RestoreConfigError (a ValueError), the core's only error type.

The storage over LMCache's StorageManager lives in ``bsrkv.lmcache_ext.bsr.storage``.
"""

from bsrkv.restore.admission import AdmissionBudget
from bsrkv.restore.errors import RestoreConfigError
from bsrkv.restore.gauge import RestorePoolGauge
from bsrkv.restore.markers import ForceLocalMarkers, MarkerState
from bsrkv.restore.plan import complete_prefix, confirm_plan, split_windows
from bsrkv.restore.protocols import RestoreDestination, RestoreStorage
from bsrkv.restore.readback import ReadbackDestination, ReadbackResult
from bsrkv.restore.restorer import BoundedRestorer, RestoreConfig
from bsrkv.restore.stall import StallWatch
from bsrkv.restore.types import (
    EventKind,
    FailureKind,
    ReadbackSummary,
    RestoreEvent,
    RestoreOutcome,
    RestorePlan,
    RestoreRequest,
    RestoreState,
    RowId,
    RowKeys,
    StageResult,
    Window,
    WindowTiming,
)

__all__ = [
    "AdmissionBudget",
    "BoundedRestorer",
    "EventKind",
    "FailureKind",
    "ForceLocalMarkers",
    "MarkerState",
    "ReadbackDestination",
    "ReadbackResult",
    "ReadbackSummary",
    "RestoreConfig",
    "RestoreConfigError",
    "RestoreDestination",
    "RestoreEvent",
    "RestoreOutcome",
    "RestorePlan",
    "RestorePoolGauge",
    "RestoreRequest",
    "RestoreState",
    "RestoreStorage",
    "RowId",
    "RowKeys",
    "StallWatch",
    "StageResult",
    "Window",
    "WindowTiming",
    "complete_prefix",
    "confirm_plan",
    "split_windows",
]
