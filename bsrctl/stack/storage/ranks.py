"""One StorageManager per TP rank behind one RestoreStorage, and the L1 high-water probe."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
from lmcache.v1.distributed.storage_manager import StorageManager

from bsrkv.restore import RestoreRequest, RestoreStorage, RowId, RowKeys, StageResult, Window


@dataclass
class _RankTickets:
    parts: dict[int, Any]  # rank -> LMCacheTicket
    rows: tuple[RowId, ...]  # request row order
    window: Window
    result: StageResult | None = None


class PerRankStorage:
    """RestoreStorage over one StorageManager per TP rank: rows go to their rank's manager."""

    def __init__(self, per_rank: Mapping[int, RestoreStorage]) -> None:
        self.per_rank = dict(per_rank)

    def _split(self, request: RestoreRequest[ObjectKey]) -> dict[int, RestoreRequest[ObjectKey]]:
        by: dict[int, list[RowKeys[ObjectKey]]] = {}
        for r in request.rows:
            by.setdefault(r.row.rank, []).append(r)
        return {
            k: RestoreRequest(request.request_id, tuple(v), request.chunk_tokens)
            for k, v in by.items()
        }

    def probe(self, request: RestoreRequest[ObjectKey]) -> list[list[bool]]:
        hits: dict[RowId, list[bool]] = {}
        for rank, sub in self._split(request).items():
            for r, bits in zip(sub.rows, self.per_rank[rank].probe(sub), strict=True):
                hits[r.row] = list(bits)
        return [hits[r] for r in request.row_ids]

    def stage(self, request: RestoreRequest[ObjectKey], window: Window) -> _RankTickets:
        parts: dict[int, Any] = {}
        try:
            for rank, sub in self._split(request).items():
                parts[rank] = self.per_rank[rank].stage(sub, window)
        except Exception:
            for rank, t in parts.items():
                self.per_rank[rank].release(t)
            raise
        return _RankTickets(parts, request.row_ids, window)

    def wait(self, ticket: _RankTickets, timeout_s: float) -> StageResult | None:
        deadline = time.monotonic() + timeout_s
        hits: dict[RowId, tuple[bool, ...]] = {}
        by_rank: dict[int, int] = {}
        for rank, t in ticket.parts.items():
            res = self.per_rank[rank].wait(t, max(0.0, deadline - time.monotonic()))
            if res is None:
                return None
            hits.update(zip(t.rows, res.hits, strict=True))
            for k, v in res.staged_bytes_by_rank.items():
                by_rank[k] = by_rank.get(k, 0) + v
        ticket.result = StageResult(tuple(hits[r] for r in ticket.rows), by_rank)
        return ticket.result

    @contextmanager
    def read(self, ticket: _RankTickets, num_chunks: int) -> Iterator[dict[RowId, Sequence[Any]]]:
        out: dict[RowId, Sequence[Any]] = {}
        for rank, t in ticket.parts.items():
            with self.per_rank[rank].read(t, num_chunks) as objs:
                out.update(objs)
        yield {r: out[r] for r in ticket.rows}

    def release(self, ticket: _RankTickets) -> None:
        errors = []
        for rank, t in ticket.parts.items():
            try:
                self.per_rank[rank].release(t)
            except Exception as e:  # release every rank, then report
                errors.append(e)
        if errors:
            raise errors[0]


class L1HighWater:
    """Exact L1 high-water mark of one StorageManager: read after every L1 allocation.

    Wraps the (private) L1 memory manager's ``allocate``; LMCache calls it under the L1
    manager's lock, so the usage read right after it is the level that allocation reached.
    """

    def __init__(self, sm: StorageManager) -> None:
        self._mm = sm._l1_manager._memory_manager  # noqa: SLF001 - measurement hook
        self._orig = self._mm.allocate
        self._lock = threading.Lock()
        self.peak_bytes = self._mm.get_memory_usage()[0]

        def allocate(layout_desc: MemoryLayoutDesc, count: int) -> Any:
            res = self._orig(layout_desc, count)
            used = self._mm.get_memory_usage()[0]
            with self._lock:
                self.peak_bytes = max(self.peak_bytes, used)
            return res

        self._mm.allocate = allocate

    def reset(self) -> int:
        with self._lock:
            self.peak_bytes = self._mm.get_memory_usage()[0]
            return self.peak_bytes
