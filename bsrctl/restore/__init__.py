"""BSR, bounded-state restoration: the core, independent of LMCache's RPC layer.

Public API (see each module):

- ``types``: RowId, RowKeys, RestoreRequest, RestorePlan, Window, StageResult,
  RestoreOutcome, RestoreEvent; IntEnums RestoreState, FailureKind, EventKind.
- ``protocols``: RestoreStorage (probe / stage / wait / read / release) and
  RestoreDestination (install / sync / mark_invalid).
- ``plan``: confirm_plan (HMA/TP composition), split_windows, complete_prefix.
- ``restorer``: RestoreConfig(W, B, timeouts), BoundedRestorer(storage, config).probe /
  .restore / .on_admitted / .on_teardown.
- ``admission``: AdmissionBudget (B chunks, FIFO, no hold-and-wait).
- ``gauge``: RestorePoolGauge (per-rank exact high-water mark of restore staging bytes).
- ``markers``: ForceLocalMarkers.
"""

from bsrctl.restore.admission import AdmissionBudget
from bsrctl.restore.gauge import RestorePoolGauge
from bsrctl.restore.markers import ForceLocalMarkers, MarkerState
from bsrctl.restore.plan import complete_prefix, confirm_plan, split_windows
from bsrctl.restore.protocols import RestoreDestination, RestoreStorage
from bsrctl.restore.restorer import BoundedRestorer, RestoreConfig
from bsrctl.restore.types import (
    EventKind,
    FailureKind,
    RestoreEvent,
    RestoreOutcome,
    RestorePlan,
    RestoreRequest,
    RestoreState,
    RowId,
    RowKeys,
    StageResult,
    Window,
)

__all__ = [
    "AdmissionBudget",
    "BoundedRestorer",
    "EventKind",
    "FailureKind",
    "ForceLocalMarkers",
    "MarkerState",
    "RestoreConfig",
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
    "StageResult",
    "Window",
    "complete_prefix",
    "confirm_plan",
    "split_windows",
]
