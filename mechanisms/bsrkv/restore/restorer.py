"""The BSR core: probe → confirmed plan → windows of at most W chunks → commit.

Per window: admit (budget B) → stage (locked prefetch) → wait for complete presence
(timeout) → read → install into the destination slice → sync → read back (``readback``:
the slice equals the staged bytes) → release. Any missing key, timeout, read, install,
read-back or release error fails the whole retrieve closed: every staged
window is released, every destination block of the request is marked invalid, the
force-local marker is set, and the outcome reports 0 cached chunks.

With B >= 2W (and ``pipeline``), a request keeps up to two windows in flight: window j+1
is staged while window j is installed. A request blocks for admission only while it
holds no window, so requests sharing one budget cannot deadlock.

W = 0 is the stock whole-plan path: one locked prefetch of the whole plan, no budget;
it exposes the hit prefix it got (0 when the plan does not fit the staging pool).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from bsrkv.clock import Clock, WallClock
from bsrkv.restore.admission import AdmissionBudget
from bsrkv.restore.errors import RestoreConfigError
from bsrkv.restore.gauge import RestorePoolGauge
from bsrkv.restore.markers import ForceLocalMarkers
from bsrkv.restore.plan import confirm_plan, split_windows
from bsrkv.restore.protocols import RestoreDestination, RestoreStorage
from bsrkv.restore.readback import ReadbackDestination
from bsrkv.restore.run_state import InFlight, RunState
from bsrkv.restore.types import (
    EventKind,
    FailureKind,
    RestoreOutcome,
    RestorePlan,
    RestoreRequest,
    RestoreState,
    RowId,
    Window,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestoreConfig:
    """Knobs of the bounded restore."""

    window_chunks: int  # W: chunks per window; 0 = stock whole-plan path
    admission_budget_chunks: int = 0  # B: chunks in flight process-wide; 0 means B = W
    window_timeout_s: float = 30.0  # max wait for one window to be complete
    admission_timeout_s: float = 600.0  # max wait for the budget to grant a window
    # Whole retrieve, admission to last install; 0 = none. Keep it below the engine's own
    # timeout on the retrieve: a window installed after that overwrites its recomputation.
    retrieve_deadline_s: float = 0.0
    pipeline: bool = True  # stage window j+1 while installing j when B >= 2W
    # Read each installed window back through the destination's transfer path and compare
    # digests (``readback``); a destination without ``read_back`` is not read back.
    readback: bool = False

    def __post_init__(self) -> None:
        if self.window_chunks < 0:
            raise RestoreConfigError(f"window_chunks must be >= 0, got {self.window_chunks}")
        if self.window_chunks and self.budget_chunks < self.window_chunks:
            raise RestoreConfigError(
                f"admission_budget_chunks={self.admission_budget_chunks} is below "
                f"window_chunks={self.window_chunks}: set it >= W (or 0 for B = W)"
            )
        if self.window_timeout_s <= 0:
            raise RestoreConfigError(f"window_timeout_s must be > 0, got {self.window_timeout_s}")
        if self.retrieve_deadline_s < 0:
            raise RestoreConfigError(
                f"retrieve_deadline_s must be >= 0 (0 = none), got {self.retrieve_deadline_s}"
            )

    @property
    def budget_chunks(self) -> int:
        return self.admission_budget_chunks or self.window_chunks

    @property
    def pipeline_depth(self) -> int:
        """Windows one request may hold at once."""
        w = self.window_chunks
        return 2 if self.pipeline and w and self.budget_chunks >= 2 * w else 1


class RestoreFailed(Exception):
    """Internal: a window failed; carries the kind and a detail with numbers."""

    def __init__(self, kind: FailureKind, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


class BoundedRestorer:
    """One per process: owns the admission budget, the gauge and the markers."""

    def __init__(
        self,
        storage: RestoreStorage,
        config: RestoreConfig,
        gauge: RestorePoolGauge | None = None,
        markers: ForceLocalMarkers | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.storage = storage
        self.config = config
        # Every timeout and the retrieve deadline read this clock (default: wall).
        self.clock: Clock = clock if clock is not None else WallClock()
        self.gauge = gauge if gauge is not None else RestorePoolGauge()
        self.markers = markers if markers is not None else ForceLocalMarkers()
        self.budget = (
            AdmissionBudget(config.budget_chunks, self.clock) if config.window_chunks else None
        )

    # ---- probe --------------------------------------------------------------------------

    def probe(
        self, request: RestoreRequest[Any], invalid_rows: Collection[RowId] = ()
    ) -> RestorePlan[Any]:
        """Probe-only lookup: hit bitmaps from the storage, nothing staged; compose the plan.

        A probe error collapses the prefix to 0 (every row invalid); it never raises.
        """
        forced = self.markers.record(request.request_id) is not None
        try:
            bitmaps = self.storage.probe(request)
        except Exception:
            log.exception("probe failed for %s: prefix collapsed to 0", request.request_id)
            return confirm_plan(request, [], invalid_rows=request.row_ids, forced_local=forced)
        return confirm_plan(request, bitmaps, invalid_rows=invalid_rows, forced_local=forced)

    # ---- restore ------------------------------------------------------------------------

    def restore(self, plan: RestorePlan[Any], destination: RestoreDestination) -> RestoreOutcome:
        """Restore the plan's prefix into the destination; never raises (fail-closed)."""
        if self.config.window_chunks == 0:
            return self._restore_whole_plan(plan, destination)
        run = self._new_run(plan)
        inflight: deque[InFlight] = deque()
        try:
            for window in split_windows(plan.prefix_chunks, self.config.window_chunks):
                self._admit(run, window, inflight, destination)
                inflight.append(self._stage(run, window, window.num_chunks))
            while inflight:
                self._finish_window(run, inflight[0], destination, window_whole=True)
                self._release(run, inflight.popleft())
        except RestoreFailed as e:
            return self._fail(run, inflight, destination, e.kind, e.detail)
        except Exception as e:  # a protocol implementation raised something unexpected
            log.exception("restore of %s failed", plan.request.request_id)
            return self._fail(run, inflight, destination, FailureKind.STAGE_ERROR, repr(e))
        finally:
            self._release_all(run, inflight)
        run.event(EventKind.COMMIT, None)
        return self._outcome(run, RestoreState.COMMITTED, FailureKind.NONE, "", plan.prefix_chunks)

    def _new_run(self, plan: RestorePlan[Any]) -> RunState:
        limit = self.config.retrieve_deadline_s
        now = self.clock.now()
        return RunState(plan, now + limit if limit else None, now)

    def _since(self, run: RunState) -> float:
        return self.clock.now() - run.t0

    def _within_deadline(self, run: RunState, cap_s: float, what: str) -> float:
        """``cap_s`` shortened to the time left before the retrieve's deadline; raises
        DEADLINE once it has passed."""
        if run.deadline is None:
            return cap_s
        left = run.deadline - self.clock.now()
        if left <= 0:
            raise RestoreFailed(
                FailureKind.DEADLINE,
                f"retrieve deadline {self.config.retrieve_deadline_s}s passed before {what} "
                f"({run.windows_done} window(s) done)",
            )
        return min(cap_s, left)

    def _admit(
        self,
        run: RunState,
        window: Window,
        inflight: deque[InFlight],
        destination: RestoreDestination,
    ) -> None:
        """Get budget for ``window``; drain own windows instead of blocking while holding any."""
        assert self.budget is not None
        n = window.num_chunks
        while True:
            if len(inflight) < self.config.pipeline_depth and self.budget.try_acquire(n):
                break
            if inflight:
                self._finish_window(run, inflight[0], destination, window_whole=True)
                self._release(run, inflight.popleft())
                continue
            wait_s = self._within_deadline(
                run, self.config.admission_timeout_s, f"window {window.index} was admitted"
            )
            blocked_from = self.clock.now()
            granted = self.budget.acquire(n, wait_s)
            run.admit_wait[window.index] = self.clock.now() - blocked_from
            if not granted:
                self._within_deadline(run, wait_s, f"window {window.index} was admitted")
                raise RestoreFailed(
                    FailureKind.ADMISSION_TIMEOUT,
                    f"window {window.index} ({n} chunks) not admitted within "
                    f"{self.config.admission_timeout_s}s under B={self.budget.budget_chunks}",
                )
            break
        run.event(EventKind.ADMIT, window)

    def _stage(self, run: RunState, window: Window, budget_chunks: int) -> InFlight:
        per_col = run.plan.request.column_bytes_by_rank()
        by_rank = {r: b * window.num_chunks for r, b in per_col.items()}
        self.gauge.add(by_rank)
        run.add(by_rank, +1)
        try:
            ticket = self.storage.stage(run.plan.request, window)
        except Exception as e:
            self.gauge.remove(by_rank)
            run.add(by_rank, -1)
            if self.budget is not None and budget_chunks:
                self.budget.release(budget_chunks)
            raise RestoreFailed(
                FailureKind.STAGE_ERROR, f"window {window.index}: stage raised {e!r}"
            ) from e
        run.event(EventKind.STAGE, window)
        run.mark(window, "staged_at_s", self._since(run))
        return InFlight(window, ticket, by_rank, budget_chunks)

    def _finish_window(
        self, run: RunState, item: InFlight, destination: RestoreDestination, window_whole: bool
    ) -> int:
        """Wait, check, read, install, sync. Returns chunks installed."""
        w = item.window
        rid = run.plan.request.request_id
        wait_s = self._within_deadline(
            run, self.config.window_timeout_s, f"window {w.index} was complete"
        )
        waited_from = self._since(run)
        result = self.storage.wait(item.ticket, wait_s)
        ready_at = self._since(run)
        run.mark(w, "wait_s", ready_at - waited_from)
        run.mark(w, "ready_at_s", ready_at)
        if result is None:
            self._within_deadline(run, wait_s, f"window {w.index} was complete")
            raise RestoreFailed(
                FailureKind.TIMEOUT,
                f"window {w.index} (chunks {w.chunk_start}..{w.chunk_stop}) not complete "
                f"within {self.config.window_timeout_s}s",
            )
        if window_whole and not result.complete:
            raise RestoreFailed(FailureKind.MISSING_KEY, _missing_detail(run.plan, w, result.hits))
        n = w.num_chunks if window_whole else result.prefix_chunks()
        run.event(EventKind.READY, w)
        if n == 0:
            return 0
        self._within_deadline(run, 0.0, f"window {w.index} was installed")
        try:
            ctx = self.storage.read(item.ticket, n)
            objects = ctx.__enter__()
        except Exception as e:
            raise RestoreFailed(
                FailureKind.READ_ERROR, f"window {w.index}: read raised {e!r}"
            ) from e
        try:
            t_install = self._since(run)
            run.unsynced = True
            run.installed_bytes += destination.install(rid, w, objects, n)
            t_sync = self._since(run)
            destination.sync(rid)
            run.unsynced = False
            t_done = self._since(run)
        except Exception as e:
            self._drain_device(run, destination)  # copies issued before the error land first
            ctx.__exit__(type(e), e, e.__traceback__)
            raise RestoreFailed(
                FailureKind.INSTALL_ERROR, f"window {w.index}: install raised {e!r}"
            ) from e
        why = ""
        try:  # before the staged objects are released: they are what the slice must equal
            if self.config.readback and isinstance(destination, ReadbackDestination):
                dt, why = run.readback.check(destination, self.clock, rid, w, objects, n)
                run.mark(w, "readback_s", dt)
        finally:
            ctx.__exit__(None, None, None)
        run.mark(w, "install_s", t_sync - t_install)
        run.mark(w, "sync_s", t_done - t_sync)
        run.mark(w, "installed_at_s", t_done)
        run.event(EventKind.INSTALL, w)
        if why:
            raise RestoreFailed(FailureKind.READBACK_MISMATCH, why)
        if "readback_s" in run.timing[w.index]:
            run.event(EventKind.READBACK, w)
        return n

    def _release(self, run: RunState, item: InFlight) -> None:
        try:
            self.storage.release(item.ticket)
        except Exception as e:
            raise RestoreFailed(
                FailureKind.RELEASE_ERROR, f"window {item.window.index}: release raised {e!r}"
            ) from e
        finally:
            self._unaccount(run, item)
        run.windows_done += 1
        run.mark(item.window, "released_at_s", self._since(run))
        run.event(EventKind.RELEASE, item.window)

    def _unaccount(self, run: RunState, item: InFlight) -> None:
        if item.bytes_by_rank:
            self.gauge.remove(item.bytes_by_rank)
            run.add(item.bytes_by_rank, -1)
            item.bytes_by_rank = {}
        if self.budget is not None and item.budget_chunks:
            self.budget.release(item.budget_chunks)
            item.budget_chunks = 0

    def _drain_device(self, run: RunState, destination: RestoreDestination) -> None:
        """After a failure, wait for the installs already issued (``sync``) before anything
        is released. A sync that raises leaves it unknown whether copies still read the
        staged objects: they are then withheld (kept locked and accounted), never freed
        under a copy. Never raises."""
        if not run.unsynced:
            return
        try:
            destination.sync(run.plan.request.request_id)
            run.unsynced = False
        except Exception as e:
            run.withheld = f"device sync after the failure raised {e!r}"
            log.error("restore of %s: %s; staged windows withheld",
                      run.plan.request.request_id, run.withheld)  # fmt: skip

    def _release_all(self, run: RunState, inflight: deque[InFlight]) -> None:
        """Release every window still held (failure or unexpected exit). Never raises.
        Windows whose copies may still run (``run.withheld``) stay held."""
        if run.withheld:
            inflight.clear()  # their locks and accounting stay: the bytes are still pinned
            return
        while inflight:
            item = inflight.popleft()
            try:
                self.storage.release(item.ticket)
            except Exception:
                log.exception("release of window %d failed during cleanup", item.window.index)
            self._unaccount(run, item)

    def _fail(
        self,
        run: RunState,
        inflight: deque[InFlight],
        destination: RestoreDestination,
        kind: FailureKind,
        detail: str,
    ) -> RestoreOutcome:
        rid = run.plan.request.request_id
        self._drain_device(run, destination)
        self._release_all(run, inflight)
        if run.withheld:
            detail = f"{detail}; release withheld: {run.withheld}"
        try:
            destination.mark_invalid(rid)
        except Exception:
            log.exception("mark_invalid(%s) raised; blocks may be reported valid", rid)
        self.markers.set(rid, f"{kind.name}: {detail}")
        run.event(EventKind.FAIL, None)
        return self._outcome(run, RestoreState.FAILED, kind, detail, 0)

    def _outcome(
        self, run: RunState, state: RestoreState, kind: FailureKind, detail: str, chunks: int
    ) -> RestoreOutcome:
        return RestoreOutcome(
            request_id=run.plan.request.request_id,
            state=state,
            failure=kind,
            detail=detail,
            cached_chunks=chunks,
            chunk_tokens=run.plan.request.chunk_tokens,
            bytes_restored=run.installed_bytes,
            windows_done=run.windows_done,
            window_chunks=self.config.window_chunks,
            budget_chunks=self.config.budget_chunks if self.config.window_chunks else 0,
            peak_staged_bytes_by_rank=dict(run.peak),
            events=tuple(run.events),
            timings=run.timings(),
            readback=run.readback.summary() if run.readback.attempts else None,
        )

    # ---- whole plan (W = 0) ---------------------------------------------------------------

    def _restore_whole_plan(
        self, plan: RestorePlan[Any], destination: RestoreDestination
    ) -> RestoreOutcome:
        """Stock path: one locked prefetch of the whole plan; expose the hit prefix it got."""
        run = self._new_run(plan)
        inflight: deque[InFlight] = deque()
        windows = split_windows(plan.prefix_chunks, 0)
        got = 0
        try:
            if windows:
                inflight.append(self._stage(run, windows[0], 0))
                got = self._finish_window(run, inflight[0], destination, window_whole=False)
                self._release(run, inflight.popleft())
        except RestoreFailed as e:
            return self._fail(run, inflight, destination, e.kind, e.detail)
        except Exception as e:
            log.exception("whole-plan restore of %s failed", plan.request.request_id)
            return self._fail(run, inflight, destination, FailureKind.STAGE_ERROR, repr(e))
        finally:
            self._release_all(run, inflight)
        run.event(EventKind.COMMIT, None)
        return self._outcome(run, RestoreState.COMMITTED, FailureKind.NONE, "", got)

    # ---- admission hooks -------------------------------------------------------------------

    def on_admitted(self, request_id: str) -> None:
        """The engine admitted the request to RUNNING: clear its force-local marker."""
        self.markers.on_admitted(request_id)

    def on_teardown(self, request_id: str) -> None:
        """The request finished or was aborted: clear its force-local marker."""
        self.markers.on_teardown(request_id)


def _missing_detail(plan: RestorePlan[Any], w: Window, hits: tuple[tuple[bool, ...], ...]) -> str:
    missing = [
        f"rank {row.row.rank} group {row.row.group} chunk {w.chunk_start + i}"
        for row, bits in zip(plan.request.rows, hits, strict=False)
        for i, hit in enumerate(bits)
        if not hit
    ]
    return (
        f"window {w.index} (chunks {w.chunk_start}..{w.chunk_stop}) incomplete: "
        f"{len(missing)} object(s) missing, first {missing[:3]}"
    )
