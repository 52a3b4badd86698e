"""The pump thread of the fault adapter: decides queued tasks, collects, withholds, releases.

Lookups and loads are submitted to the inner adapter at once; the pump polls the inner
adapter's event fds, applies each task's decided faults to its hit bitmap (drops, and the
``verify`` checksum check of loads), and hands the result to the caller only once its
delay has passed, through the adapter's own event fds.
"""

from __future__ import annotations

import heapq
import itertools
import select
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from lmcache.lmcache_native import Bitmap
from lmcache.logging import init_logger
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface, L2TaskId
from lmcache.v1.platform.event_notifier import EventNotifier, consume_fd

from bsrkv.hostguard import Guard
from bsrkv.lmcache_ext.faults.rules import PHASES
from bsrkv.lmcache_ext.faults.verify import Digests

logger = init_logger("bsrkv.lmcache_ext.faults.adapter")
PUMP_GUARD = Guard("bsrkv.lmcache_ext.faults", logger)

MAX_RECORDED_EVENTS = 4096


@dataclass(frozen=True, slots=True)
class Submitted:
    """A task whose faults are not decided yet (the pump decides, in submission order)."""

    phase: str
    task_id: L2TaskId
    keys: list[ObjectKey]
    objects: list[Any] | None
    at: float  # monotonic submission time; a delay counts from here


@dataclass
class Pending:
    keys: list[ObjectKey]
    objects: list[Any] | None  # load buffers (verify), None for lookups
    drop_positions: set[int]
    release_at: float  # monotonic time before which the result is withheld
    bitmap: Any = None  # inner result once collected


@dataclass
class PhaseState:
    pending: dict[L2TaskId, Pending] = field(default_factory=dict)
    done: dict[L2TaskId, Any] = field(default_factory=dict)
    task_ordinal: int = 0
    key_ordinal: int = 0


class FaultPump:
    """The pump half of ``BsrFaultL2Adapter`` (which sets this state up and decides)."""

    _name: str
    _inner: L2AdapterInterface
    _lock: threading.Lock
    _phases: dict[str, PhaseState]
    _submitted: list[Submitted]  # FIFO, drained by the pump under _lock
    _heap: list[tuple[float, int, str, L2TaskId]]  # (release_at, seq, phase, id)
    _seq: itertools.count
    _stats: dict[str, int]
    _events: list[dict]
    _verify: bool
    _digests: Digests
    _lookup_efd: EventNotifier
    _load_efd: EventNotifier
    _wake_efd: EventNotifier
    _stop: threading.Event

    def _decide_submitted(self) -> None:  # holds self._lock
        raise NotImplementedError

    def _record(self, event: dict) -> None:  # holds self._lock
        if len(self._events) < MAX_RECORDED_EVENTS:
            self._events.append(event)

    def _pump(self) -> None:
        poller = select.poll()
        inner_fds = {
            self._inner.get_lookup_and_lock_event_fd(): "lookup",
            self._inner.get_load_event_fd(): "load",
        }
        for fd in (*inner_fds, self._wake_efd.fileno()):
            poller.register(fd, select.POLLIN)
        while not self._stop.is_set():
            timeout_ms = self._next_timeout_ms()
            try:
                ready = poller.poll(timeout_ms)
            except InterruptedError:
                continue
            for fd, _ in ready:
                try:
                    consume_fd(fd)
                except OSError:
                    pass
            # a pass that fails is counted and logged once per kind, not at every pass
            PUMP_GUARD.call(f"pump {self._name!r}", self._pass)

    def _pass(self) -> None:
        with self._lock:
            self._decide_submitted()
        self._collect()
        self._release_due()

    def _next_timeout_ms(self) -> int:
        with self._lock:
            if self._submitted:
                return 0
            waiting = any(
                p.bitmap is None for s in self._phases.values() for p in s.pending.values()
            )
            if not self._heap:
                return 200
            head = self._heap[0][0]
        if waiting:
            return 20  # inner results are also polled, in case a notify was coalesced
        return max(0, min(200, int((head - time.monotonic()) * 1000) + 1))

    def _collect(self) -> None:
        for phase in PHASES:
            with self._lock:
                todo = [(t, p) for t, p in self._phases[phase].pending.items() if p.bitmap is None]
            for task_id, pending in todo:
                try:
                    if phase == "load":
                        bitmap = self._inner.query_load_result(task_id)
                    else:
                        bitmap = self._inner.query_lookup_and_lock_result(task_id)
                except Exception as exc:
                    bitmap = self._inner_failed(phase, pending, exc)
                else:
                    if bitmap is None:
                        continue
                    try:
                        self._apply_faults(phase, pending, bitmap)
                    except Exception as exc:
                        # reported all misses: what the inner lookup still holds locked
                        # for this task would otherwise stay locked until its TTL
                        self._unlock_hits(phase, pending, bitmap)
                        bitmap = self._inner_failed(phase, pending, exc)
                self._count(phase, pending, bitmap)
                with self._lock:
                    pending.bitmap = bitmap

    def _inner_failed(self, phase: str, pending: Pending, exc: Exception) -> Bitmap:
        """The contract has no error result: an all-zero bitmap is a task whose every key
        failed. Completing it here records the error once; re-querying every pump pass
        would leave the task (and the caller's window) pending forever."""
        logger.error(
            "BsrFaultL2Adapter %r: inner %s failed, reported as all misses",
            self._name,
            phase,
            exc_info=exc,
        )
        with self._lock:
            self._stats["inner_errors"] += 1
            self._record(
                {"fault": "inner_error", "phase": phase, "error": f"{type(exc).__name__}: {exc}"}
            )
        return Bitmap(len(pending.keys))

    def _count(self, phase: str, pending: Pending, bitmap: Any) -> None:
        # The tier's own read counters: what it was asked for and what it served (after
        # faults), so an experiment can tell which tier a restore really came from.
        served = len(bitmap.get_indices_list())
        with self._lock:
            self._stats[f"{phase}_keys"] += len(pending.keys)
            self._stats[f"{phase}_hit_keys"] += served

    def _unlock_hits(self, phase: str, pending: Pending, bitmap: Any) -> None:
        if phase != "lookup":
            return  # loads lock nothing
        try:
            hits = [pending.keys[i] for i in bitmap.get_indices_list()]
            if hits:
                self._inner.submit_unlock(hits)
        except Exception:
            logger.exception("BsrFaultL2Adapter %r: unlock after a failed lookup", self._name)

    def _apply_faults(self, phase: str, pending: Pending, bitmap: Any) -> None:
        if phase == "lookup":
            # Unlock only what the inner lookup locked (its hits): unlocking a key it did
            # not lock would release another reader's lock.
            hits = set(bitmap.get_indices_list())
            locked = [pending.keys[i] for i in sorted(pending.drop_positions) if i in hits]
            for i in pending.drop_positions:
                bitmap.clear(i)
            if locked:
                self._inner.submit_unlock(locked)
            return
        for i in pending.drop_positions:
            bitmap.clear(i)
        if not self._verify or pending.objects is None:
            return
        for i in bitmap.get_indices_list():
            key = pending.keys[i]
            expected = self._digests.get(key)
            buf = pending.objects[i].byte_array
            if expected is None:
                bitmap.clear(i)
                with self._lock:
                    self._stats["verify_missing"] += 1
                    self._record({"fault": "verify_missing", "chunk_hash": key.chunk_hash.hex()})
                logger.warning("no stored digest for %s: reported as a miss", key)
            elif not self._digests.checksum.matches(buf, expected):
                bitmap.clear(i)
                with self._lock:
                    self._stats["verify_mismatch"] += 1
                    self._record({"fault": "verify_mismatch", "chunk_hash": key.chunk_hash.hex()})
                logger.warning("checksum mismatch for %s (corrupted object): a miss", key)

    def _release_due(self) -> None:
        now = time.monotonic()
        notify = set()
        with self._lock:
            deferred = []
            while self._heap and self._heap[0][0] <= now:
                entry = heapq.heappop(self._heap)
                _, _, phase, task_id = entry
                pending = self._phases[phase].pending.get(task_id)
                if pending is None:
                    continue
                if pending.bitmap is None:  # inner not finished yet: retry later
                    deferred.append(entry)
                    continue
                del self._phases[phase].pending[task_id]
                self._phases[phase].done[task_id] = pending.bitmap
                notify.add(phase)
            for entry in deferred:
                heapq.heappush(self._heap, entry)
        if "lookup" in notify:
            self._lookup_efd.notify()
        if "load" in notify:
            self._load_efd.notify()
