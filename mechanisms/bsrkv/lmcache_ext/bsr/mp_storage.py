"""The two sides of a bounded restore inside the LMCache MP server.

- ``ServerRestoreStorage``: the storage side (``bsrkv.restore.protocols.RestoreStorage``)
  is ``bsrkv.lmcache_ext.bsr.storage.LMCacheRestoreStorage`` over the server's
  own ``StorageManager`` (L1 = staging pool, L2 adapters = the tier restored from),
  one instance per registration (model, world size), with the layouts taken from the
  server's layout registry, an L1 sampling hook when a window is fully staged, and a
  background drain for a timed-out window's late prefetch.
- ``MPBlockDestination``: the destination side (``RestoreDestination``) over one worker's
  registered KV cache (``lmcache_driven`` transfer mode): a window is copied with LMCache's
  own per-object-group transfer into the slice of the request's block ids covering the
  window's chunks, then the device stream is synchronised.

Keys are LMCache ``ObjectKey`` objects; a ``RowId`` is (TP rank, object group).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from lmcache.logging import init_logger
from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey

from bsrkv.lmcache_ext.bsr.readback import SliceReader
from bsrkv.lmcache_ext.bsr.storage import LMCacheRestoreStorage
from bsrkv.restore.readback import ReadbackResult
from bsrkv.restore.types import RestoreRequest, RowId, StageResult, Window

log = init_logger(__name__)

LayoutsLookup = Callable[[str, int], dict[int, MemoryLayoutDesc]]
L1Sampler = Callable[[], None]

DRAIN_BACKGROUND_S = 600.0  # how long a background drain waits for a stuck prefetch


def tp_rank_of(kv_rank: int) -> int:
    """The global worker rank packed into LMCache's kv_rank (see ObjectKey.ComputeKVRank)."""
    return (kv_rank >> 16) & 0xFF


def layout_bytes(desc: MemoryLayoutDesc) -> int:
    """Bytes of one object with this layout (sum over its tensors)."""
    total = 0
    for shape, dtype in zip(desc.shapes, desc.dtypes, strict=True):
        n = 1
        for d in shape:
            n *= int(d)
        total += n * dtype.itemsize
    return total


@dataclass(frozen=True)
class _RoutedTicket:
    inner: LMCacheRestoreStorage  # the storage that staged the window
    ticket: Any  # its own ticket


class ServerRestoreStorage:
    """RestoreStorage for the MP server: the core's ``LMCacheRestoreStorage``, one per
    registration (model, world size), over the server's own StorageManager.

    Adds what a long-running server needs around it: the layouts come from the server's
    layout registry at first use; ``on_window_ready`` is called whenever a window is fully
    staged (the server samples L1 there); a window whose prefetch is still in flight after
    ``drain_timeout_s`` is drained by a background thread instead of leaving its read locks
    to LMCache's TTL.
    """

    def __init__(
        self,
        storage_manager: Any,
        layouts_of: LayoutsLookup,
        probe_timeout_s: float = 10.0,
        drain_timeout_s: float = 5.0,
        on_window_ready: L1Sampler | None = None,
        staging: str = "prefetch",
    ) -> None:
        self.sm = storage_manager
        self.staging = staging
        self.layouts_of = layouts_of
        self.probe_timeout_s = probe_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.on_window_ready = on_window_ready
        self._lock = threading.Lock()
        self._by_registration: dict[tuple[str, int], LMCacheRestoreStorage] = {}

    def _inner(self, request: RestoreRequest[ObjectKey]) -> LMCacheRestoreStorage:
        key = request.rows[0].keys[0]
        reg = (key.model_name, ObjectKey.WorldSizeFromKVRank(key.kv_rank))
        layouts = self.layouts_of(*reg)  # re-read: an engine may re-register its cache
        with self._lock:
            inner = self._by_registration.get(reg)
            if inner is None or inner.layouts != layouts:
                inner = LMCacheRestoreStorage(
                    self.sm,
                    layouts,
                    probe_timeout_s=self.probe_timeout_s,
                    drain_timeout_s=self.drain_timeout_s,
                    staging=self.staging,
                )
                self._by_registration[reg] = inner
            return inner

    def probe(self, request: RestoreRequest[ObjectKey]) -> Any:
        if request.num_chunks == 0 or not request.rows:
            return [() for _ in request.rows]
        return self._inner(request).probe(request)

    def stage(self, request: RestoreRequest[ObjectKey], window: Window) -> _RoutedTicket:
        inner = self._inner(request)
        return _RoutedTicket(inner, inner.stage(request, window))

    def wait(self, ticket: _RoutedTicket, timeout_s: float) -> StageResult | None:
        result = ticket.inner.wait(ticket.ticket, timeout_s)
        if result is not None and self.on_window_ready is not None:
            self.on_window_ready()
        return result

    def read(
        self, ticket: _RoutedTicket, num_chunks: int
    ) -> AbstractContextManager[Mapping[RowId, Sequence[Any]]]:
        return ticket.inner.read(ticket.ticket, num_chunks)

    def release(self, ticket: _RoutedTicket) -> None:
        try:
            ticket.inner.release(ticket.ticket)
        except TimeoutError:
            self._drain_in_background(ticket)  # the budget may move on; the locks won't leak

    def _drain_in_background(self, ticket: _RoutedTicket) -> None:
        def drain() -> None:
            try:
                ticket.inner.release(ticket.ticket, DRAIN_BACKGROUND_S)
            except TimeoutError:
                log.error("a timed-out window never finished: its locks expire by TTL")
            except Exception:
                log.exception("background drain of a timed-out window failed")

        threading.Thread(target=drain, name="bsr-drain", daemon=True).start()


class InstallFault(RuntimeError):
    """Raised by the destination's test-only install fault."""


class InstallRefused(RuntimeError):
    """Raised when the destination's guard refuses a window (e.g. after a stall)."""


@dataclass
class MPBlockDestination:
    """RestoreDestination over one worker's registered KV cache and the retrieve's blocks.

    ``block_ids`` are the raw per-kernel-group engine block ids of the retrieve range
    (chunk 0 of the request's rows = the first chunk of that range).
    """

    cache_context: Any  # LMCache BaseCacheContext (CPU or GPU)
    event_backend: Any  # EventIPCBackend of the context's device
    block_ids: list[list[int]]  # per kernel group, raw, covering every chunk of the range
    chunk_tokens: int
    skip_first_n_tokens: int  # tokens of the range not to write (APC-shared blocks)
    transfer_key: str
    fail_install_window: int = -1  # TEST ONLY: raise in install of this window index
    guard: Callable[[], str] | None = None  # non-empty answer: refuse to install (why)
    invalid: bool = False  # set by mark_invalid: every block of the request is invalid
    bytes_installed: int = 0
    # window -> (staged device ids, host ids, skip tokens) of its install, for read_back
    _installed: dict[int, tuple[Any, list[list[int]], int]] = field(default_factory=dict)
    _reader: SliceReader | None = None

    def _blocks_per_chunk(self, kernel_group: int) -> int:
        return int(self.cache_context.calculate_num_blocks(self.chunk_tokens, kernel_group))

    def install(
        self,
        request_id: str,
        window: Window,
        objects: Mapping[RowId, Sequence[Any]],
        num_chunks: int,
    ) -> int:
        # Deferred: these pull in LMCache's device kernels, unneeded for probe-only use.
        import lmcache.lmcache_native as lmcache_native
        from lmcache.v1.multiprocess.object_group_transfer import (
            downsample_and_stage_block_ids,
            transfer_kv_per_object_group,
        )

        why_not = self.guard() if self.guard is not None else ""
        if why_not:
            raise InstallRefused(f"window {window.index}: {why_not}")
        if window.index == self.fail_install_window:
            raise InstallFault(f"test-only install fault in window {window.index}")
        ctx = self.cache_context
        lo, hi = window.chunk_start, window.chunk_start + num_chunks
        num_kernel_groups = ctx.kv_layer_groups_manager.num_kernel_groups
        sliced = [
            list(
                self.block_ids[kg][
                    lo * self._blocks_per_chunk(kg) : hi * self._blocks_per_chunk(kg)
                ]
            )
            for kg in range(num_kernel_groups)
        ]
        staged_ids = downsample_and_stage_block_ids(ctx, sliced)  # cuts `sliced` in place
        skip = max(0, self.skip_first_n_tokens - lo * self.chunk_tokens)
        total = 0
        for row in sorted(objects):
            objs = list(objects[row])[:num_chunks]
            if len(objs) != num_chunks:
                raise ValueError(f"row {row}: {len(objs)} objects for {num_chunks} chunks")
            transfer_kv_per_object_group(
                ctx,
                staged_ids,
                objs,
                object_group_id=row.group,
                batch_size=ctx.max_batch_size,
                skip_first_n_tokens=skip,
                direction=lmcache_native.TransferDirection.H2D,
                transfer_key=self.transfer_key,
                block_ids_host=sliced,
            )
            total += sum(o.get_size() for o in objs)
        self._installed[window.index] = (staged_ids, sliced, skip)
        self.bytes_installed += total
        return total

    def read_back(
        self,
        request_id: str,
        window: Window,
        objects: Mapping[RowId, Sequence[Any]],
        num_chunks: int,
    ) -> ReadbackResult:
        """The slice the window's install wrote, copied back with LMCache's store copy and
        compared with the staged objects (``bsrkv.lmcache_ext.bsr.readback``)."""
        if self._reader is None:
            self._reader = SliceReader(
                self.cache_context, lambda: self.sync(request_id), self.transfer_key + "-rb"
            )
        staged_ids, host_ids, skip = self._installed.pop(window.index)
        return self._reader.read_back(
            staged_ids, host_ids, objects, num_chunks, self.chunk_tokens, skip, window.chunk_start
        )

    def sync(self, request_id: str) -> None:
        ctx = self.cache_context
        ev = self.event_backend.create_event(ctx.device)
        self.event_backend.record_event(ev, ctx.stream)
        self.event_backend.synchronize_event(ev, ctx.device)

    def mark_invalid(self, request_id: str) -> None:
        # The retrieve answers ok=False: the connector then reports every block of the
        # request as a load error, which is the invalidation on the engine side.
        self.invalid = True
