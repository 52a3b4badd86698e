"""The device under TempoKV's provider in the live stack: LMCache's real StorageManager.

- a KV object is one chunk column of a request's prefix (its keys on every TP rank and
  object group), identified by the chunk hash;
- a staging op is a LOCK prefetch of its objects' keys (``LMCacheRestoreStorage.stage``),
  loaded from L2 into L1 and read-locked there: the locks are the pins. LMCache's read
  locks expire after ``read_ttl_seconds``; the server runs with a TTL above the longest
  protection (the caller sets it), so no pin lapses under a committed claim;
- an object whose protection ended has its locks dropped with ``finish_read_prefetched``:
  under the ``retain`` prefetch policy it stays in L1 for the stock lookup to find;
- an ordinary op is the stock lookup's own L2 read: the device does not perform it (unless
  adopted for a commitment that joined it), it only keeps its place until told it is done.

Nothing here blocks on L2: a prefetch is polled with a zero timeout (``poll``). A device
that learns of an op's end on a thread of its own calls ``wake`` then, so the loop that polls
it looks at once instead of at its next pass (``tempokv.flash``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from lmcache.v1.distributed.api import ObjectKey

from bsrkv.lmcache_ext.bsr.storage import LMCacheTicket
from bsrkv.restore.types import RestoreRequest, RowId, RowKeys, Window
from bsrkv.tempokv.kv import KvObject
from bsrkv.tempokv.provider import OpKind
from bsrkv.tempokv.schedule import DeviceShape, ShapingSchedule


@dataclass(frozen=True, slots=True)
class LiveObject:
    """One chunk column: its key on every row (TP rank, object group)."""

    object_id: str
    keys: tuple[tuple[RowId, ObjectKey, int], ...]  # (row, key, bytes) per row

    @property
    def size_bytes(self) -> int:
        return sum(b for _, _, b in self.keys)

    def kv(self) -> KvObject:
        return KvObject(self.object_id, self.size_bytes)


@dataclass(slots=True)
class _Op:
    ticket: Any  # LMCacheTicket, or the server storage's routed ticket around one
    objects: list[LiveObject]
    size_bytes: int
    start_s: float
    on_done: Callable[[int], None]


@dataclass(frozen=True, slots=True)
class StageRecord:
    op_id: int
    size_bytes: int
    start_s: float
    done_s: float
    missed_objects: int  # not loaded (an L2 miss): the retrieval falls back for them


def _trace_stage(rec: StageRecord, now_s: float) -> None:
    """A committed staging op (submit to stage-ready) as a ``tempokv.stage`` span: the
    device's clock is monotonic, the span's times Unix (``now_s`` is that clock now)."""
    from bsrkv.trace.spans import server_tracer

    tracer = server_tracer()
    unix_now = time.time_ns()

    def ns(t_s: float) -> int:
        return unix_now - round((now_s - t_s) * 1e9)

    attrs = {"op": rec.op_id, "bytes": rec.size_bytes, "missed_objects": rec.missed_objects}
    tracer.start_span("tempokv.stage", start_time=ns(rec.start_s), attributes=attrs).end(
        end_time=ns(rec.done_s)
    )


@dataclass(slots=True)
class _Observed:
    """An ordinary op the stock lookup performs: the device only keeps its place."""

    size_bytes: int
    start_s: float
    on_done: Callable[[int], None]


class LmcStagingDevice:
    """``StagingDevice`` over a StorageManager: an op is a LOCK prefetch of its objects."""

    def __init__(
        self, storage: Any, now: Callable[[], float], est_bytes_s: float, latency_s: float = 0.0
    ) -> None:
        """`storage`: an ``LMCacheRestoreStorage`` or the server's ``ServerRestoreStorage``;
        `est_bytes_s`, `latency_s`: the shaped L2's device, for the progress estimate."""
        self.storage = storage
        self.now = now
        self.est_bytes_s = est_bytes_s
        # The progress estimate: the shaped L2's own schedule (one FIFO device) over the ops
        # open here, each leaving it when it really ends
        self.schedule = ShapingSchedule(DeviceShape(est_bytes_s, latency_s), slots=1)
        self.objects: dict[str, LiveObject] = {}
        self.objects_of: Callable[[int], list[KvObject]] = lambda op_id: []
        self.kind_of: Callable[[int], OpKind] = lambda op_id: OpKind.STAGE
        self._ops: dict[int, _Op] = {}
        # Ordinary ops: in the live stack every ordinary read is the stock lookup's own
        # (``LiveTempo.observe_stock``); the device never performs one unless adopted.
        self._observed: dict[int, _Observed] = {}
        self.locked: dict[str, list[ObjectKey]] = {}  # object -> its read-locked keys
        self.stages: list[StageRecord] = []
        self.chunk_tokens = 256
        self.wake: Callable[[], None] = lambda: None  # the poller's: poll now (LiveTempo)

    def start(self, op_id: int, size_bytes: int, on_done: Callable[[int], None]) -> None:
        self.schedule.start(op_id, self.now(), size_bytes)
        if self.kind_of(op_id) is OpKind.ORDINARY:
            self._observed[op_id] = _Observed(size_bytes, self.now(), on_done)
            return
        self._stage(op_id, size_bytes, on_done, self.now())

    def _stage(
        self, op_id: int, size_bytes: int, on_done: Callable[[int], None], start_s: float
    ) -> None:
        objs = [self.objects[o.object_id] for o in self.objects_of(op_id)]
        rows: dict[RowId, list[tuple[ObjectKey, int]]] = {}
        for obj in objs:
            for row, key, nbytes in obj.keys:
                rows.setdefault(row, []).append((key, nbytes))
        request = RestoreRequest(
            f"tempokv-op{op_id}",
            tuple(
                RowKeys(row, tuple(k for k, _ in ks), ks[0][1]) for row, ks in sorted(rows.items())
            ),
            self.chunk_tokens,
        )
        ticket = self.storage.stage(request, Window(0, 0, len(objs)))
        self._ops[op_id] = _Op(ticket, objs, size_bytes, start_s, on_done)

    def finish_observed(self, op_id: int) -> bool:
        """The stock lookup's read of this op is done: complete it (the provider's
        ``_op_done``: its objects become resident). False if it is no longer observed."""
        obs = self._observed.pop(op_id, None)
        if obs is None:
            return False
        self.schedule.drop(op_id, self.now())
        obs.on_done(op_id)
        return True

    def drop_observed(self, op_id: int) -> None:
        if self._observed.pop(op_id, None) is not None:
            self.schedule.drop(op_id, self.now())

    def adopt(self, op_id: int) -> None:
        """A commitment waits on an observed op the stock lookup will not finish: read it
        here (a LOCK prefetch, as staging; its start stays the observed one's)."""
        obs = self._observed.pop(op_id)
        self._stage(op_id, obs.size_bytes, obs.on_done, obs.start_s)

    def observed_ops(self) -> set[int]:
        return set(self._observed)

    def remaining_bytes(self, op_id: int) -> int:
        """The device reports no progress, so it is estimated on the shaped L2's schedule
        (``tempokv.schedule``): one device serving the open ops in the order they started,
        each paying the per-op latency before its bytes move at the calibrated rate, an op
        served from when the one before it ended (really, or on the schedule). An open op
        the schedule has done has 1 byte left: it is never "done" before it is."""
        if op_id not in self._ops and op_id not in self._observed:
            return 0
        now = self.now()
        self.schedule.advance(now)
        return max(1, self.schedule.remaining_bytes(op_id, now))

    def poll(self) -> None:
        """Complete every op whose prefetch finished (zero-timeout wait)."""
        for op_id, op in list(self._ops.items()):
            result = self.storage.wait(op.ticket, 0.0)
            if result is None:
                continue
            del self._ops[op_id]
            self.schedule.drop(op_id, self.now())
            ticket: LMCacheTicket = getattr(op.ticket, "ticket", op.ticket)
            locked = set(ticket.hit_keys)
            missed = 0
            for obj in op.objects:
                keys = [k for _, k, _ in obj.keys if k in locked]
                if len(keys) < len(obj.keys):
                    missed += 1
                self.locked.setdefault(obj.object_id, []).extend(keys)
            ticket.released = True  # its locks are now held per object, released below
            rec = StageRecord(op_id, op.size_bytes, op.start_s, self.now(), missed)
            self.stages.append(rec)
            _trace_stage(rec, self.now())
            op.on_done(op_id)

    def sync_pins(self, keep: Collection[str]) -> None:
        """Drop the locks of every object not in `keep` (no longer protected)."""
        drop = [oid for oid in self.locked if oid not in keep]
        keys = [k for oid in drop for k in self.locked.pop(oid)]
        if keys:
            self.storage.sm.finish_read_prefetched(keys)

    def locked_bytes(self) -> int:
        return sum(self.objects[oid].size_bytes for oid, ks in self.locked.items() if ks)

    def release_all(self) -> None:
        for op_id, op in self._ops.items():
            self.storage.release(op.ticket)
            self.schedule.drop(op_id, self.now())
        for op_id in self._observed:
            self.schedule.drop(op_id, self.now())
        self._ops.clear()
        self._observed.clear()
        self.sync_pins(())
