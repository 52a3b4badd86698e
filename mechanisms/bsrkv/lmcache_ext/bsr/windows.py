"""Windows staged straight into L1 (``restore.window_staging: direct``, the default).

A BSR window is a handful of chunks; through LMCache's prefetch controller each one pays a
submission queue, the controller thread's state machine (bitmap plans, event-bus events,
an L1 read-lock pass on the loaded objects, a result published under a condition) and
the hops between the controller, the adapters and the waiter: about 2.5 ms of CPU per
window on the CPU stack, whatever its bytes (bench/ttft_restore.py prints it as
``window-fixed-ms``). The whole plan pays it once; W = 4 over 64 chunks pays it 16 times.

Here the restoring thread stages its own windows with the same LMCache parts the
controller uses, in the same order, and nothing else:

1. ``stage``: the window's keys read-locked where L1 holds them (``reserve_read``), and a
   lookup-and-lock submitted to every L2 adapter for all of the window's keys (as the
   controller does: fault rules count the same tasks and keys).
2. ``advance`` once every lookup answered: each key not in L1 goes to the first adapter
   (in the manager's order) that holds it, the other adapters' locks are returned; a
   staging object is reserved in L1 for it (``reserve_write`` under this window's own
   writer tag, temporary: never visible to readers) and one load task per adapter is
   submitted into those objects.
3. once every load answered: the L2 locks are returned; a key is a hit iff it was
   resident in L1 or its whole object was loaded.
4. ``release``: the staging objects are discarded (``finish_write_and_delete``: they never
   become resident) and the L1 read locks returned. A load still in flight is drained
   first: nothing is freed while an adapter may still write into it.

A restore's windows advance together: waiting on one advances every window this thread
has staged, so with B >= 2W window k+1 loads while window k is installed. The staged bytes
are the window's, as through the controller; L1 gives them back at release. A manager with
several L1 managers (``is_multi_l1``) stages through the controller (``LMCacheRestoreStorage``).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
from lmcache.v1.distributed.error import L1Error

from bsrkv.restore.types import RestoreRequest, RowId, StageResult, Window

# Polling a task's result: from 50 us, doubling to 1 ms (a window of the tiny model loads
# in 0.3-2 ms; a paper-geometry one in tens of ms).
POLL_FIRST_S = 50e-6
POLL_MAX_S = 1e-3

_tags = itertools.count()
# Each thread's staged windows not yet released, across managers (TP ranks): waiting on one
# advances them all, so every rank's loads are in flight at once.
_OPEN = threading.local()


def _open() -> list[DirectTicket]:
    got = getattr(_OPEN, "tickets", None)
    if got is None:
        got = _OPEN.tickets = []
    return got


class Phase(IntEnum):
    LOOKUP = 0  # lookups submitted
    LOAD = 1  # staging objects reserved, loads submitted
    DONE = 2  # every load answered; hits known


@dataclass
class DirectTicket:
    """One window staged directly: its keys, locks, staging objects and tasks."""

    rows: tuple[RowId, ...]  # request row order
    keys: tuple[tuple[ObjectKey, ...], ...]  # per row, the window's keys
    layouts: tuple[MemoryLayoutDesc, ...]  # per row, its object group's layout
    chunk_bytes: tuple[int, ...]  # per row, bytes per object
    stager: DirectWindows  # the manager's stager that staged it
    tag: str  # this window's L1 writer tag
    flat: list[ObjectKey]  # every key, row-major (what the lookups were asked)
    resident: dict[ObjectKey, Any]  # read-locked L1 objects
    adapters: dict[int, Any]  # the manager's L2 adapters when the window was staged
    lookups: dict[int, int]  # adapter index -> its lookup task, until it answers
    phase: Phase = Phase.LOOKUP
    found: dict[int, Any] = field(default_factory=dict)  # adapter index -> lookup bitmap
    staged: dict[ObjectKey, Any] = field(default_factory=dict)  # reserved staging objects
    locked: dict[int, list[ObjectKey]] = field(default_factory=dict)  # L2 locks held
    loads: dict[int, tuple[list[ObjectKey], int]] = field(default_factory=dict)  # until done
    loaded: set[ObjectKey] = field(default_factory=set)
    released: bool = False
    # the staging thread's open windows while it drives this one (None: given up by it)
    owner: list[DirectTicket] | None = None

    def object_of(self, key: ObjectKey) -> Any:
        return self.resident[key] if key in self.resident else self.staged[key]

    def hits(self) -> tuple[tuple[bool, ...], ...]:
        return tuple(
            tuple(k in self.resident or k in self.loaded for k in keys) for keys in self.keys
        )


class DirectWindows:
    """Windows staged by the restoring thread over one StorageManager (module doc)."""

    def __init__(self, sm: Any, layouts: dict[int, MemoryLayoutDesc]) -> None:
        self.sm = sm
        self.layouts = layouts

    @property
    def _l1(self) -> Any:
        return self.sm._l1_manager  # noqa: SLF001 - the single L1 (multi-L1 stages by prefetch)

    # ---- stage ------------------------------------------------------------------------

    def stage(self, request: RestoreRequest[ObjectKey], window: Window) -> DirectTicket:
        s, e = window.chunk_start, window.chunk_stop
        keys = tuple(tuple(r.keys[s:e]) for r in request.rows)
        flat = [k for row in keys for k in row]
        resident: dict[ObjectKey, Any] = {}
        for k, (err, obj) in self._l1.reserve_read(flat, 1).items():
            if err == L1Error.SUCCESS and obj is not None:
                resident[k] = obj
        t = DirectTicket(
            rows=request.row_ids,
            keys=keys,
            layouts=tuple(self.layouts[r.row.group] for r in request.rows),
            chunk_bytes=tuple(r.chunk_bytes for r in request.rows),
            stager=self,
            tag=f"bsr-window-{next(_tags)}",
            flat=flat,
            resident=resident,
            adapters=dict(enumerate(a for _d, a in self.sm.l2_adapters())),
            lookups={},
        )
        try:
            for i, adapter in t.adapters.items():
                t.lookups[i] = adapter.submit_lookup_and_lock_task(flat, self.layouts)
        except BaseException:
            self._let_go(t)
            raise
        t.owner = _open()
        t.owner.append(t)
        return t

    # ---- advance ----------------------------------------------------------------------

    def advance(self, t: DirectTicket) -> None:
        """One non-blocking step: collect what answered, move to the next phase."""
        if t.phase == Phase.LOOKUP:
            for i, task in list(t.lookups.items()):
                got = t.adapters[i].query_lookup_and_lock_result(task)
                if got is not None:
                    t.found[i] = got
                    del t.lookups[i]
            if not t.lookups:
                self._plan_and_load(t)
        if t.phase == Phase.LOAD:
            for i, (keys, task) in list(t.loads.items()):
                got = t.adapters[i].query_load_result(task)
                if got is not None:
                    t.loaded.update(keys[j] for j in got.get_indices_list())
                    del t.loads[i]
            if not t.loads:
                self._unlock_l2(t)
                t.phase = Phase.DONE

    def _plan_and_load(self, t: DirectTicket) -> None:
        """Each key outside L1 from the first adapter that holds it; staging objects for
        them; one load task per adapter."""
        source: dict[ObjectKey, int] = {}
        for i in sorted(t.found):
            held = [t.flat[j] for j in t.found[i].get_indices_list()]
            t.locked[i] = held
            for k in held:
                if k not in t.resident and k not in source:
                    source[k] = i
        for i, held in t.locked.items():  # locks the plan does not use go back at once
            spare = [k for k in held if source.get(k) != i]
            if spare:
                t.adapters[i].submit_unlock(spare)
            t.locked[i] = [k for k in held if source.get(k) == i]
        for keys, layout in zip(t.keys, t.layouts, strict=True):
            want = [k for k in keys if k in source]
            if not want:
                continue
            got = self._l1.reserve_write(want, [True] * len(want), layout, t.tag)
            for k in want:
                err, obj = got[k]
                if err == L1Error.SUCCESS and obj is not None:
                    t.staged[k] = obj
                elif err == L1Error.KEY_NOT_WRITABLE:  # resident since the read-lock pass
                    ((rerr, robj),) = self._l1.reserve_read([k], 1).values()
                    if rerr == L1Error.SUCCESS and robj is not None:
                        t.resident[k] = robj
        by_adapter: dict[int, list[ObjectKey]] = {}
        for k in t.flat:
            if k in t.staged:
                by_adapter.setdefault(source[k], []).append(k)
        t.phase = Phase.LOAD
        for i, keys in by_adapter.items():
            t.loads[i] = (keys, t.adapters[i].submit_load_task(keys, [t.staged[k] for k in keys]))

    @staticmethod
    def _unlock_l2(t: DirectTicket) -> None:
        for i, keys in t.locked.items():
            if keys:
                t.adapters[i].submit_unlock(keys)
        t.locked = {}

    # ---- wait, read, release ----------------------------------------------------------

    def wait(self, t: DirectTicket, timeout_s: float) -> StageResult | None:
        """Advance this thread's windows until ``t`` is done; None after ``timeout_s``."""
        return self.result(t) if self._until_done(t, timeout_s, _open()) else None

    def _until_done(self, t: DirectTicket, timeout_s: float, beside: list[DirectTicket]) -> bool:
        """Advance ``t`` (and the windows ``beside`` it) until it is done; False after
        ``timeout_s``. Polls with a growing pause: the adapters' event fds belong to the
        prefetch controller, which consumes them."""
        deadline = time.monotonic() + timeout_s
        pause = POLL_FIRST_S
        while True:
            for w in (t, *beside):
                if w.phase != Phase.DONE and not w.released:
                    w.stager.advance(w)
            if t.phase == Phase.DONE:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(2 * pause, POLL_MAX_S)

    def result(self, t: DirectTicket) -> StageResult:
        hits = t.hits()
        by_rank: dict[int, int] = {}
        for row, bits, size in zip(t.rows, hits, t.chunk_bytes, strict=True):
            by_rank[row.rank] = by_rank.get(row.rank, 0) + size * sum(bits)
        return StageResult(hits=hits, staged_bytes_by_rank=by_rank)

    def read(self, t: DirectTicket, num_chunks: int) -> dict[RowId, list[Any]]:
        out = {}
        for row, keys in zip(t.rows, t.keys, strict=True):
            missing = [k for k in keys[:num_chunks] if k not in t.resident and k not in t.loaded]
            if missing:
                raise KeyError(f"row {row}: {len(missing)} staged object(s) not readable")
            out[row] = [t.object_of(k) for k in keys[:num_chunks]]
        return out

    def release(self, t: DirectTicket, drain_s: float) -> None:
        """Give everything back; a load still in flight is drained first (TimeoutError
        after ``drain_s``: nothing freed, call again). Idempotent."""
        if t.released:
            return
        if t.phase != Phase.DONE and not self._until_done(t, drain_s, []):
            self._disown(t)  # only whoever releases it again drives it from now on
            raise TimeoutError(
                f"window staging {t.tag} still loading after {drain_s}s: "
                "its staging objects are kept until it lands"
            )
        self._let_go(t)

    def _let_go(self, t: DirectTicket) -> None:
        if t.staged:
            self._l1.finish_write_and_delete(list(t.staged), t.tag)
        if t.resident:
            self._l1.finish_read(list(t.resident), 1)
        self._unlock_l2(t)
        t.released = True
        self._disown(t)

    @staticmethod
    def _disown(t: DirectTicket) -> None:
        if t.owner is not None and t in t.owner:
            t.owner.remove(t)
        t.owner = None
