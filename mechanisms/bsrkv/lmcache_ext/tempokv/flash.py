"""TempoKV's device on the flash tier (``serving.fast_tier``): LMCache's L1 is a Device-DAX
arena whose page cache is the fast tier and whose device is the flash (``stack/fast_tier``).

Every document's objects are in L1 already (the arena holds them all); what is not resident
is read from flash when touched. So a staging op here is:

1. a LOCK prefetch of its objects' keys, as on the DRAM tier: they are L1 hits, read-locked
   at once, so LMCache neither evicts nor reuses their arena ranges while protected;
2. the object's arena range read in bulk (``tempokv.readahead``: ``readahead(2)`` in 1 MiB
   pieces, each one request to the flash, so bound by its bandwidth, where a 4 KiB fault is
   bound by its request rate), then ``mlock``-ed (``page_lock.PageLocker``): the pages are
   resident by then and stay until ``munlock``. Ops run one at a time, in issue order (one
   FIFO device, as the provider's schedule models it); an op's objects are staged by
   torch's intra-op thread count of this process (the parallelism LMCache's CPU copies run
   with). The op is stage-ready when every mlock returned.

Both steps run on the device's staging thread, which waits for the prefetch (bounded) and
then locks; its end wakes the poller (``wake``): a held lookup is released the moment its
staging is ready, not at the loop's next pass.

Release (protection ended): ``munlock`` and the read locks dropped. The locker's budget is
the protected budget, so nothing is ever locked past it. Protected bytes (C's samples) are
the bytes ``mlock`` returned for. An object that cannot be locked (``mlock`` refused) is
counted missed: its retrieval faults it in on demand, as an uncommitted claim's does."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from bsrkv.lmcache_ext.bsr.storage import LMCacheTicket
from bsrkv.lmcache_ext.tempokv.device import LiveObject, LmcStagingDevice, StageRecord, _Op
from bsrkv.lmcache_ext.tempokv.device import _trace_stage as trace_stage
from bsrkv.lmcache_ext.tempokv.page_lock import PageLocker
from bsrkv.lmcache_ext.tempokv.readahead import Stager

log = logging.getLogger(__name__)
DRAIN_S = 30.0  # at close: how long an mlock in flight may still take
# how long the staging thread waits for an op's LOCK prefetch: its objects are L1 hits
# (every document is in the arena), so it ends in milliseconds unless LMCache is stuck
PREFETCH_WAIT_S = 30.0


def _copy_threads() -> int:
    """torch's intra-op threads in this process (LMCache's CPU copies run on them)."""
    import torch

    return max(1, torch.get_num_threads())


Held = list[tuple[LiveObject, list[Any]]]  # each object and its read-locked keys


@dataclass(slots=True)
class _Locking:
    op: _Op
    future: Future[tuple[Held, int]]  # the held keys, and objects that could not be locked


class DaxStagingDevice(LmcStagingDevice):
    """``StagingDevice`` over a Device-DAX L1: an op is a LOCK prefetch, then ``mlock``."""

    def __init__(
        self,
        storage: Any,
        now: Any,
        est_bytes_s: float,
        latency_s: float = 0.0,
        budget_bytes: int = 0,
        locker: PageLocker | None = None,
        readers: int | None = None,
        stager: Stager | None = None,
    ) -> None:
        super().__init__(storage, now, est_bytes_s, latency_s)
        self.locker = locker if locker is not None else PageLocker(budget_bytes)
        self.stager = stager if stager is not None else Stager()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tempokv-stage")
        self.readers = readers if readers is not None else _copy_threads()
        self._readers = ThreadPoolExecutor(self.readers, thread_name_prefix="tempokv-mlock")
        self._locking: dict[int, _Locking] = {}

    def _ranges(self, obj: LiveObject, keys: list[Any]) -> list[tuple[int, int]]:
        """The object's arena ranges: each of its locked keys' memory object."""
        got, objs = self.storage.sm.unsafe_read(keys)
        return [(m.data_ptr, m.data_ptr + m.get_physical_size()) for m in objs]

    def _lock_one(self, obj: LiveObject, keys: list[Any]) -> int:
        """1 when the object is missed: not whole in L1 (its retrieval recomputes what is
        not), or not locked (its retrieval faults it in)."""
        if not keys:
            return 1
        try:
            ranges = self._ranges(obj, keys)
            if not self.locker.holds(obj.object_id):
                for lo, hi in ranges:  # in bulk first: mlock then finds the pages resident
                    self.stager.stage(lo, hi)
            self.locker.lock(obj.object_id, ranges)
        except Exception:
            log.exception("tempokv dax: %s not locked: its retrieval faults", obj.object_id)
            return 1
        return int(len(keys) < len(obj.keys))

    def _lock_objects(self, objects: Held) -> int:
        """Every object of one op, on the reader threads; how many were missed."""
        return sum(self._readers.map(lambda ok: self._lock_one(*ok), objects))

    def _stage(
        self, op_id: int, size_bytes: int, on_done: Callable[[int], None], start_s: float
    ) -> None:
        super()._stage(op_id, size_bytes, on_done, start_s)
        try:
            self._start_load(op_id)
        except Exception:  # its commit stands: the next poll starts it
            log.exception("tempokv dax: op %s's staging not started: the loop retries", op_id)

    def _start_load(self, op_id: int) -> None:
        op = self._ops[op_id]
        fut = self._pool.submit(self._load, op)
        self._locking[op_id] = _Locking(op, fut)
        fut.add_done_callback(lambda _f: self.wake())

    def _load(self, op: _Op) -> tuple[Held, int]:
        """On the staging thread: the op's LOCK prefetch to its end, then its mlocks."""
        if self.storage.wait(op.ticket, PREFETCH_WAIT_S) is None:
            raise TimeoutError(f"LOCK prefetch not done in {PREFETCH_WAIT_S} s")
        ticket: LMCacheTicket = getattr(op.ticket, "ticket", op.ticket)
        held = set(ticket.hit_keys)
        objects = [(o, [k for _, k, _ in o.keys if k in held]) for o in op.objects]
        return objects, self._lock_objects(objects)

    def poll(self) -> None:
        """Complete every op whose staging thread is done: its read locks are then held per
        object (``sync_pins`` drops them), and it is stage-ready. An op whose staging did
        not start (the thread pool refused it) is started here."""
        for op_id in [o for o in self._ops if o not in self._locking]:
            try:
                self._start_load(op_id)
            except Exception:  # still refused: the pass goes on (timers, pins, the sample)
                log.debug("tempokv dax: op %s's staging still not started", op_id)
        for op_id, lk in list(self._locking.items()):
            if not lk.future.done():
                continue
            del self._locking[op_id]
            del self._ops[op_id]
            self.schedule.drop(op_id, self.now())
            try:
                objects, missed = lk.future.result()
            except Exception:
                log.exception("tempokv dax: op %s", op_id)
                missed = len(lk.op.objects)  # its retrieval faults them all in
                try:
                    self.storage.release(lk.op.ticket)  # no read lock of it is kept
                except Exception:
                    log.exception("tempokv dax: op %s's prefetch not released", op_id)
            else:
                for obj, keys in objects:
                    self.locked.setdefault(obj.object_id, []).extend(keys)
                ticket: LMCacheTicket = getattr(lk.op.ticket, "ticket", lk.op.ticket)
                ticket.released = True  # its read locks are now held per object
            rec = StageRecord(op_id, lk.op.size_bytes, lk.op.start_s, self.now(), missed)
            self.stages.append(rec)
            trace_stage(rec, self.now())
            lk.op.on_done(op_id)

    def sync_pins(self, keep: Any) -> None:
        """Unprotected objects: munlocked, then their read locks dropped. An object whose
        mlock is still running stays until its op completes."""
        busy = {o.object_id for lk in self._locking.values() for o in lk.op.objects}
        for oid in [o for o in self.locked if o not in keep and o not in busy]:
            self.locker.unlock(oid)
        super().sync_pins(set(keep) | busy)

    def locked_bytes(self) -> int:
        return self.locker.locked_bytes

    def release_all(self) -> None:
        for lk in self._locking.values():
            lk.future.cancel()  # an op not started yet never starts; its ticket is released
        for lk in self._locking.values():
            if lk.future.cancelled():
                continue
            try:
                lk.future.result(timeout=DRAIN_S)
            except Exception:
                log.exception("tempokv dax: an mlock at close")
        self._locking.clear()
        self._pool.shutdown(wait=False)
        self._readers.shutdown(wait=False)
        self.locker.unlock_all()
        self.stager.close()
        super().release_all()
