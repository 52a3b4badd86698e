"""RestoreStorage over LMCache 0.5.6's in-process ``StorageManager`` (real L1 + real L2).

- probe: every L2 adapter's ``submit_lookup_and_lock_task`` is submitted first, then L1 is
  looked up with a NO_LOCK, ``skip_l2`` prefetch (nothing loaded, locks dropped at once)
  while the adapters work; then each L2 result is collected and ``submit_unlock``-ed. Hit =
  resident in L1 or in any L2. Nothing is staged or locked afterwards.
- stage (``staging="direct"``, BSR's windows on a single L1): the restoring thread stages
  the window itself (``bsrkv.lmcache_ext.bsr.windows``: L1 read locks, L2 lookups, staging
  objects, loads), without the prefetch controller's per-window cost.
- stage (``staging="prefetch"``, the constructor's default: TempoKV's staging ops, the whole
  plan, or several L1 managers): ``submit_prefetch_task`` of the
  window's columns of every row, LOCK mode, "prefix" fetching. Loaded objects are temporary
  under the default prefetch policy, so ``finish_read_prefetched`` deletes them and L1
  returns to its prior usage.
- wait: ``wait_prefetch_status`` then ``query_prefetch_status`` (consumed once, kept on
  the ticket).
- read: ``unsafe_read`` of the locked objects (no extra lock), per row.
- release: drain a prefetch still in flight, then ``finish_read_prefetched`` of every
  hit it locked.

The server module uses it over the MP server's own ``StorageManager`` (``mp_storage``); the
in-process storage stack over its own. Lives here, not in the core: it imports lmcache and
torch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import torch
from lmcache.v1.distributed.api import (
    GroupedObjectKeys,
    MemoryLayoutDesc,
    ObjectKey,
    PrefetchHandle,
    PrefetchLockMode,
    PrefetchResult,
    PrefetchTaskSpec,
)
from lmcache.v1.distributed.storage_manager import StorageManager

from bsrkv.lmcache_ext.bsr.windows import DirectTicket, DirectWindows
from bsrkv.registration import Registration
from bsrkv.restore.types import RestoreRequest, RowId, StageResult, Window

STAGINGS = ("direct", "prefetch")  # restore.window_staging


def layout_descs(reg: Registration) -> dict[int, MemoryLayoutDesc]:
    """One LMCache memory layout per object group: the group's tensors, in order."""
    return {
        g.index: MemoryLayoutDesc(
            shapes=[torch.Size(t.shape) for t in reg.group_tensors(g.index)],
            dtypes=[getattr(torch, t.dtype) for t in reg.group_tensors(g.index)],
        )
        for g in reg.groups
    }


@dataclass
class LMCacheTicket:
    """One staged window: the prefetch handle, its keys and, once waited, its result."""

    handle: PrefetchHandle  # LMCache's handle of the window's prefetch
    rows: tuple[RowId, ...]  # row ids, request order
    keys: tuple[tuple[ObjectKey, ...], ...]  # per row, the window's keys
    chunk_bytes: tuple[int, ...]  # per row, bytes per object
    result: PrefetchResult | None = None  # consumed prefetch result
    released: bool = False  # release() done
    hit_keys: list[ObjectKey] = field(default_factory=list)  # keys read-locked by the prefetch


class LMCacheRestoreStorage:
    """RestoreStorage over a StorageManager; keys are LMCache ``ObjectKey``s."""

    def __init__(
        self,
        sm: StorageManager,
        layouts: Mapping[int, MemoryLayoutDesc],
        probe_timeout_s: float = 30.0,
        drain_timeout_s: float = 120.0,
        staging: str = "prefetch",
    ) -> None:
        if staging not in STAGINGS:
            raise ValueError(f"window_staging {staging!r}: one of {list(STAGINGS)}")
        self.sm = sm
        self.layouts = dict(layouts)
        self.probe_timeout_s = probe_timeout_s
        self.drain_timeout_s = drain_timeout_s
        # windows staged by the restoring thread (one L1 manager), else by LMCache's controller
        self.direct = (
            DirectWindows(sm, self.layouts) if staging == "direct" and not sm.is_multi_l1 else None
        )

    # ---- probe ------------------------------------------------------------------------

    def _spec(
        self, request: RestoreRequest[ObjectKey], start: int, stop: int, mode: PrefetchLockMode
    ) -> PrefetchTaskSpec:
        return PrefetchTaskSpec(
            key_groups=[
                GroupedObjectKeys(
                    keys=list(r.keys[start:stop]),
                    object_group_id=r.row.group,
                    layout_desc=self.layouts[r.row.group],
                )
                for r in request.rows
            ],
            lock_mode=mode,
            fetching_policy="prefix",
        )

    def probe(self, request: RestoreRequest[ObjectKey]) -> list[list[bool]]:
        n = request.num_chunks
        if n == 0 or not request.rows:
            return [[] for _ in request.rows]
        # L2 lookups first: they run on the adapters' own threads while L1 is looked up here.
        flat = list(chain.from_iterable(r.keys for r in request.rows))
        tasks = [
            (adapter, adapter.submit_lookup_and_lock_task(flat, self.layouts))
            for _desc, adapter in self.sm.l2_adapters()
        ]
        handle = self.sm.submit_prefetch_task(
            self._spec(request, 0, n, PrefetchLockMode.NO_LOCK), request.request_id, skip_l2=True
        )
        result = self.sm.query_prefetch_status(handle)
        hits = [[False] * n for _ in request.rows]
        if result is not None:
            for i, row in enumerate(result.hit_cells):
                for j in row.get_indices_list():
                    hits[i][j] = True
        error: Exception | None = None
        for adapter, task in tasks:
            try:
                found = self._l2_collect(adapter, task, flat)
            except Exception as e:  # collect (and unlock) the others first
                error = error or e
                continue
            for idx in found:
                hits[idx // n][idx % n] = True
        if error is not None:
            raise error
        return hits

    def _l2_collect(self, adapter: Any, task: Any, flat: list[ObjectKey]) -> list[int]:
        """Wait for one adapter's lookup-and-lock, then unlock what it found. Indices into
        flat. Every submitted lookup is collected (and unlocked) even if an earlier one
        timed out, so a probe never leaves a lock behind."""
        deadline = time.monotonic() + self.probe_timeout_s
        result = adapter.query_lookup_and_lock_result(task)
        while result is None:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"L2 lookup of {len(flat)} keys exceeded {self.probe_timeout_s}s"
                )
            time.sleep(0.0002)
            result = adapter.query_lookup_and_lock_result(task)
        found = result.get_indices_list()
        if found:
            adapter.submit_unlock([flat[i] for i in found])
        return found

    # ---- windows ----------------------------------------------------------------------

    def stage(
        self, request: RestoreRequest[ObjectKey], window: Window
    ) -> LMCacheTicket | DirectTicket:
        if self.direct is not None:
            return self.direct.stage(request, window)
        s, e = window.chunk_start, window.chunk_stop
        handle = self.sm.submit_prefetch_task(
            self._spec(request, s, e, PrefetchLockMode.LOCK),
            f"{request.request_id}/w{window.index}",
        )
        return LMCacheTicket(
            handle=handle,
            rows=request.row_ids,
            keys=tuple(tuple(r.keys[s:e]) for r in request.rows),
            chunk_bytes=tuple(r.chunk_bytes for r in request.rows),
        )

    def wait(self, ticket: LMCacheTicket | DirectTicket, timeout_s: float) -> StageResult | None:
        if isinstance(ticket, DirectTicket):
            assert self.direct is not None
            return self.direct.wait(ticket, timeout_s)
        if ticket.result is None:
            if not self.sm.wait_prefetch_status(ticket.handle, timeout_s):
                return None
            self._take_result(ticket)
        assert ticket.result is not None
        hits = tuple(
            tuple(row.test(j) for j in range(len(keys)))
            for row, keys in zip(ticket.result.hit_cells, ticket.keys, strict=True)
        )
        by_rank: dict[int, int] = {}
        for row, bits, size in zip(ticket.rows, hits, ticket.chunk_bytes, strict=True):
            by_rank[row.rank] = by_rank.get(row.rank, 0) + size * sum(bits)
        return StageResult(hits=hits, staged_bytes_by_rank=by_rank)

    def _take_result(self, ticket: LMCacheTicket) -> None:
        result = self.sm.query_prefetch_status(ticket.handle)
        if result is None:
            raise RuntimeError(
                f"prefetch {ticket.handle.prefetch_request_id} finished but has no result"
            )
        ticket.result = result
        ticket.hit_keys = [
            k
            for row, keys in zip(result.hit_cells, ticket.keys, strict=True)
            for k in row.gather(list(keys))
        ]

    @contextmanager
    def read(
        self, ticket: LMCacheTicket | DirectTicket, num_chunks: int
    ) -> Iterator[dict[RowId, Sequence[Any]]]:
        if isinstance(ticket, DirectTicket):
            assert self.direct is not None
            yield dict(self.direct.read(ticket, num_chunks))
            return
        owners = self._owners(ticket)
        out: dict[RowId, Sequence[Any]] = {}
        for row, keys in zip(ticket.rows, ticket.keys, strict=True):
            want = list(keys[:num_chunks])
            got_keys, objs = self.sm.unsafe_read(want, owners)
            if got_keys != want:
                missing = [k for k in want if k not in set(got_keys)]
                raise KeyError(f"row {row}: {len(missing)} staged object(s) not readable")
            out[row] = objs
        yield out

    def release(self, ticket: LMCacheTicket | DirectTicket, drain_s: float | None = None) -> None:
        """Return the window's locks and staging; a load still in flight is drained first,
        for ``drain_s`` (default ``drain_timeout_s``): TimeoutError after it, nothing freed
        (call again to drain longer)."""
        drain_s = self.drain_timeout_s if drain_s is None else drain_s
        if isinstance(ticket, DirectTicket):
            assert self.direct is not None
            self.direct.release(ticket, drain_s)
            return
        if ticket.released:
            return
        if ticket.result is None:
            if not self.sm.wait_prefetch_status(ticket.handle, drain_s):
                raise TimeoutError(
                    f"prefetch {ticket.handle.prefetch_request_id} still in flight after "
                    f"{drain_s}s: its locks expire with LMCache's read TTL"
                )
            self._take_result(ticket)
        if ticket.hit_keys:
            self.sm.finish_read_prefetched(ticket.hit_keys, l1_owners=self._owners(ticket))
        ticket.released = True

    def _owners(self, ticket: LMCacheTicket) -> dict[ObjectKey, int] | None:
        if not self.sm.is_multi_l1 or ticket.result is None:
            return None
        return ticket.result.l1_owners
