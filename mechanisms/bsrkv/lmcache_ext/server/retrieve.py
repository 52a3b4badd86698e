"""The transfer side: windowed fail-closed retrieve (W > 0), stock retrieve, stall guard.

A BSR retrieve runs ``BoundedRestorer.restore`` for the worker's rows: windows of at most
W chunks, each prefetched with read locks into L1, required complete within
``window_timeout_s``, copied by LMCache's own per-object-group transfer into the window's
slice of the block ids, synchronised and released before the next window is admitted
under the process-wide budget B, the whole within ``retrieve_deadline_s``. Any missing
key, timeout, passed deadline, stall or install error answers ok=False: the connector then
reports every block of the request as a load error and vLLM recomputes.
"""

from __future__ import annotations

import time

from lmcache import torch_dev
from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.native_completion import submit_callback_to_stream
from lmcache.v1.multiprocess.request_handler import HandlerType, request_handler

from bsrkv.lmcache_ext.bsr.mp_storage import MPBlockDestination, layout_bytes
from bsrkv.lmcache_ext.bsr.protocol import ReadbackTotals, RestoreOutcomeSummary
from bsrkv.lmcache_ext.server.state import Mode, ModuleState, log, unsupported_reason
from bsrkv.restore.plan import confirm_plan
from bsrkv.restore.types import RestoreOutcome, RestoreRequest, RowId, RowKeys
from bsrkv.trace.spans import Stopwatch, server_span, trace_restore


class RetrieveHandlers(ModuleState):
    """``store`` and ``retrieve``, replacing the built-in LMCacheDrivenTransferModule's."""

    @request_handler(HandlerType.BLOCKING, requires_client_affinity=True)
    def store(
        self,
        key: IPCCacheServerKey,
        instance_id: int,
        gpu_block_ids: list[list[int]],
        event_ipc_handle: bytes,
    ) -> tuple[bytes, bool]:
        try:
            if self._transfer_mod is None:
                return b"", False
            handle, ok = self._transfer_mod.store(key, instance_id, gpu_block_ids, event_ipc_handle)
            if ok:
                self._guard.call("clear_marker", self._clear_marker, key.request_id, "admitted")
            return handle, ok
        except Exception:
            log.exception("bsr store of %s failed", key.request_id)
            return b"", False

    @request_handler(HandlerType.BLOCKING, requires_client_affinity=True)
    def retrieve(
        self,
        key: IPCCacheServerKey,
        instance_id: int,
        gpu_block_ids: list[list[int]],
        event_ipc_handle: bytes,
        skip_first_n_tokens: int = 0,
    ) -> tuple[bytes, bool]:
        rid = key.request_id
        self._count("retrieves")
        try:
            if self._transfer_mod is None:
                self._mark(rid, "no lmcache_driven transfer module")
                return b"", False
            if self._mode(rid) == Mode.STOCK:
                try:
                    return self._stock_retrieve(
                        key, instance_id, gpu_block_ids, event_ipc_handle, skip_first_n_tokens
                    )
                finally:
                    tempo = self.tempokv
                    self._guard.call("tempokv_retrieved", tempo.retrieved, rid, key.worker_id)
            return self._windowed_retrieve(
                key, instance_id, gpu_block_ids, event_ipc_handle, skip_first_n_tokens
            )
        except Exception as e:
            log.exception("bsr retrieve of %s failed closed", rid)
            self._count("retrieves_failed")
            self._mark(rid, f"retrieve raised {e!r}")
            return b"", False

    def _stock_retrieve(
        self,
        key: IPCCacheServerKey,
        instance_id: int,
        block_ids: list[list[int]],
        event_ipc_handle: bytes,
        skip: int,
    ) -> tuple[bytes, bool]:
        assert self._transfer_mod is not None
        t0 = time.monotonic()
        try:
            with server_span("bsr.stock_retrieve", {"request_id": key.request_id}):
                handle, ok = self._transfer_mod.retrieve(
                    key, instance_id, block_ids, event_ipc_handle, skip
                )
        finally:
            self._guard.call("stock_release", self._stock_release, key.request_id, key.worker_id)
        # LMCache's answer stands, whatever bsrkv's books of it do
        self._guard.call("stock_books", self._stock_books, key, ok, t0)
        return handle, ok

    def _stock_books(self, key: IPCCacheServerKey, ok: bool, t0: float) -> None:
        self._count("retrieves_ok" if ok else "retrieves_failed")
        if ok:
            self._clear_marker(key.request_id, "admitted")
        else:
            self._mark(key.request_id, "stock retrieve failed")
        self._record_outcome(
            RestoreOutcomeSummary(
                request_id=key.request_id,
                rank=key.worker_id,
                mode="stock",
                ok=ok,
                start_token=key.start,
                end_token=key.end,
                restore_s=round(self._since_lookup(key.request_id, t0), 6),
                retrieve_s=round(time.monotonic() - t0, 6),
            )
        )

    def _windowed_retrieve(
        self,
        key: IPCCacheServerKey,
        instance_id: int,
        block_ids: list[list[int]],
        event_ipc_handle: bytes,
        skip: int,
    ) -> tuple[bytes, bool]:
        assert self._transfer_mod is not None
        rid = key.request_id
        entry = self._transfer_mod.get_and_touch_context_entry(instance_id)
        if entry is None or entry.event_backend is None:
            self._count("retrieves_failed")
            self._mark(rid, f"instance {instance_id} not registered")
            return b"", False
        cc, eb = entry.cache_context, entry.event_backend
        groups_mgr = cc.kv_layer_groups_manager
        why_not = unsupported_reason(groups_mgr.get_attn_desc())
        num_groups = groups_mgr.num_object_groups
        obj_keys = self._ctx.resolve_obj_keys(key, list(range(num_groups)))
        n = len(obj_keys[0])
        chunk = self._ctx.chunk_size
        bpc = [cc.calculate_num_blocks(chunk, kg) for kg in range(groups_mgr.num_kernel_groups)]
        short = any(len(ids) < n * b for ids, b in zip(block_ids, bpc, strict=True))
        t0 = time.monotonic()
        with torch_dev.device(cc.device), torch_dev.stream(cc.stream):
            event = eb.create_event(cc.device)
            if why_not or short or n == 0:
                eb.record_event(event, cc.stream)
                reason = why_not or ("block ids short" if short else "empty range")
                self._count("retrieves_failed")
                self._mark(rid, f"retrieve refused: {reason}")
                return eb.export_event(event, cc.device), False
            producer = eb.import_event(event_ipc_handle, cc.device)
            eb.wait_event(producer, cc.stream)
            token = cc.hold_imported_event(producer)
            submit_callback_to_stream(
                cc.cupy_stream, "release_imported_event", (instance_id, token)
            )
            rank = key.worker_id if key.worker_id is not None else 0
            descs = self._ctx.layout_desc_registry.find_group_layout_descs(
                key.model_name, key.world_size
            )
            request = RestoreRequest(
                request_id=rid,
                rows=tuple(
                    RowKeys(
                        row=RowId(rank=rank, group=g),
                        keys=tuple(obj_keys[g]),
                        chunk_bytes=layout_bytes(descs[g]) if descs else 0,
                    )
                    for g in range(num_groups)
                ),
                chunk_tokens=chunk,
            )
            # The lookup's probe decided the prefix; the windows re-check presence.
            plan = confirm_plan(request, [(True,) * n] * num_groups)
            dest = MPBlockDestination(
                cache_context=cc,
                event_backend=eb,
                block_ids=[list(ids) for ids in block_ids],
                chunk_tokens=chunk,
                skip_first_n_tokens=skip,
                transfer_key=f"bsr-{rid}-{rank}",
                fail_install_window=self.config.test_only_fail_install_window,
                # vLLM's connector declares the server unhealthy when one PING (10 s) goes
                # unanswered and recomputes into the same blocks: no install after a stall.
                guard=self._stall.guard(
                    self.config.stall_guard_s, on_trip=lambda: self._count("stall_guard_trips")
                ),
            )
            with self._lock:
                self._restoring += 1
                restorer = self.restorer
            anchor = Stopwatch()
            try:
                outcome = restorer.restore(plan, dest)
            finally:
                with self._lock:
                    self._restoring -= 1
            eb.record_event(event, cc.stream)
        # spans never decide a restore: they fail on the trace thread, counted; a pool
        # already closed only loses them
        self._guard.call("trace_submit", self._trace_pool.submit, self._guard.call,
                         "trace_restore", trace_restore, rid, rank, anchor, outcome,
                         time.time_ns())  # fmt: skip
        self._guard.call("restore_books", self._after_restore, key, outcome, t0)
        return eb.export_event(event, cc.device), outcome.ok

    def _after_restore(self, key: IPCCacheServerKey, outcome: RestoreOutcome, t0: float) -> None:
        rid = key.request_id
        retrieve_s, restore_s = time.monotonic() - t0, self._since_lookup(rid, t0)
        self._count("windows", outcome.windows_done)
        self._count("bytes_restored", outcome.bytes_restored)
        rb = outcome.readback
        if rb is not None:
            self._count("readback_windows", rb.windows_checked)
            self._count("readback_mismatches", rb.mismatches)
        if outcome.ok:
            self._count("retrieves_ok")
            self._clear_marker(rid, "admitted")
        else:
            self._count("retrieves_failed")
            self._count(f"failures_{outcome.failure.name.lower()}")
            log.warning("bsr restore of %s failed closed: %s", rid, outcome.detail)
        self._record_outcome(
            RestoreOutcomeSummary(
                request_id=rid,
                rank=key.worker_id,
                mode="bsr",
                ok=outcome.ok,
                failure=outcome.failure.name,
                detail=outcome.detail,
                start_token=key.start,
                end_token=key.end,
                cached_chunks=outcome.cached_chunks,
                windows_done=outcome.windows_done,
                bytes_restored=outcome.bytes_restored,
                peak_staged_bytes_by_rank=dict(outcome.peak_staged_bytes_by_rank),
                restore_s=round(restore_s, 6),
                retrieve_s=round(retrieve_s, 6),
                window_phases=tuple(t.to_json() for t in outcome.timings),
                readback=None if rb is None else ReadbackTotals.from_json(rb.to_json()),
            )
        )
