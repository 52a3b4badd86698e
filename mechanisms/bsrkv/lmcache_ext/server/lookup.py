"""The lookup side: probe-only lookup (W > 0), stock pass-through (W = 0), force-local.

With W > 0 a lookup only probes (``BoundedRestorer.probe``): the complete hit count,
nothing staged, nothing locked, so ``free_lookup_locks`` has nothing to free. The probe
runs on its own thread and ``query_prefetch_status`` / ``wait_prefetch_status`` report its
result. With W = 0 (or a registration BSR cannot serve) the built-in handlers run and the
whole plan they pin in L1 is gauged. A request whose restore failed answers 0 chunks until
it is admitted or torn down (force-local).
"""

from __future__ import annotations

from concurrent.futures import wait as wait_futures
from typing import Any

from lmcache.v1.distributed.api import ObjectKey, ipc_key_to_grouped_object_keys
from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.request_handler import HandlerType, request_handler

from bsrkv.lmcache_ext.bsr.mp_storage import layout_bytes, tp_rank_of
from bsrkv.lmcache_ext.bsr.protocol import LastProbe
from bsrkv.lmcache_ext.server.state import Mode, ModuleState, log, unsupported_reason
from bsrkv.lmcache_ext.tempokv.device import LiveObject
from bsrkv.restore.types import RestoreRequest, RowId, RowKeys
from bsrkv.trace.spans import server_span


class LookupHandlers(ModuleState):
    """``lookup``, ``query_prefetch_status``, ``wait_prefetch_status``,
    ``free_lookup_locks`` and ``end_session``, replacing the built-in LookupModule's."""

    def _forced(self, request_id: str) -> bool:
        """Force-local: answer 0 chunks while the request carries a marker."""
        if self.markers.record(request_id) is None:
            return False
        self._count("lookups_forced_local")
        self.markers.event(request_id, "forced_lookup")
        with self._lock:
            self._results[request_id] = 0
        return True

    def _answered(self, request_id: str, chunks: int = 0) -> None:
        """A BSR lookup answered without a probe (unregistered model, failure)."""
        with self._lock:
            self._modes[request_id] = Mode.BSR
            self._results[request_id] = chunks

    def _take_result(self, request_id: str) -> int | None:
        with self._lock:
            return self._results.pop(request_id, None)

    def _lookup_request(
        self, key: IPCCacheServerKey, chunk_hashes: list[bytes], attn_desc: Any
    ) -> RestoreRequest[ObjectKey]:
        descs = self._ctx.layout_desc_registry.find_group_layout_descs(
            key.model_name, key.world_size
        )
        if not descs:
            raise LookupError(f"no group layouts for {key.model_name!r}")
        groups = ipc_key_to_grouped_object_keys(
            key, chunk_hashes, list(range(attn_desc.num_object_groups)), descs, attn_desc
        )
        rows = tuple(
            RowKeys(
                row=RowId(rank=tp_rank_of(g.keys[0].kv_rank), group=g.object_group_id),
                keys=tuple(g.keys),
                chunk_bytes=layout_bytes(g.layout_desc),
            )
            for g in groups
        )
        return RestoreRequest(
            request_id=key.request_id, rows=rows, chunk_tokens=self._ctx.chunk_size
        )

    def key_objects(self, key: IPCCacheServerKey) -> list[LiveObject]:
        """The complete hit prefix of a lookup key (probe: metadata only), one chunk column
        each; a claim's and a lookup's objects of one document share their ids (TempoKV)."""
        model = key.model_name
        attn_desc = self._ctx.layout_desc_registry.find_attn_desc(model, key.world_size)
        hashes = self._ctx.token_hasher.compute_chunk_hashes(list(key.token_ids), end=key.end)
        if not hashes:
            return []
        request = self._lookup_request(key, hashes, attn_desc)
        plan = self.restorer.probe(request)
        return [
            LiveObject(
                f"{model}/{hashes[j].hex()}",
                tuple((r.row, r.keys[j], r.chunk_bytes) for r in request.rows),
            )
            for j in range(plan.prefix_chunks)
        ]

    def _probe_lookup(self, key: IPCCacheServerKey) -> int:
        """Probe-only lookup: the complete advertised prefix in chunks."""
        registry = self._ctx.layout_desc_registry
        attn_desc = registry.find_attn_desc(key.model_name, key.world_size)
        chunk_hashes = self._ctx.token_hasher.compute_chunk_hashes(list(key.token_ids), end=key.end)
        if not chunk_hashes:
            return 0
        session = self._ctx.session_manager.get_or_create(key.request_id)
        session.set_tokens(list(key.token_ids))
        session.begin_lookup(key, tuple(attn_desc.num_chunks_in_sw))
        request = self._lookup_request(key, chunk_hashes, attn_desc)
        with server_span("bsr.probe", {"request_id": key.request_id}):
            plan = self.restorer.probe(request)
        self._count("probe_hit_chunks", plan.prefix_chunks)
        return plan.prefix_chunks

    def _probe_job(self, key: IPCCacheServerKey) -> int:
        """Probe-only lookup on the probe thread; never raises (a failure answers 0)."""
        try:
            chunks = self._probe_lookup(key)
        except Exception:
            log.exception("bsr probe of %s failed: answering 0 chunks", key.request_id)
            self._count("lookup_errors")
            return 0
        self._count("lookups_probe_only")
        self._l1_after_lookup = self._l1_used()
        self._last_lookup = LastProbe(
            request_id=key.request_id,
            model_name=key.model_name,
            world_size=key.world_size,
            end_token=key.end,
            chunks=chunks,
        )
        return chunks

    def _probe_result(self, request_id: str, timeout_s: float) -> tuple[bool, int | None]:
        """(known, chunks): chunks is None while the request's probe is still running."""
        with self._lock:
            fut = self._pending.get(request_id)
        if fut is None:
            return False, None
        if timeout_s > 0:
            wait_futures([fut], timeout=timeout_s)
        if not fut.done():
            return True, None
        with self._lock:
            self._pending.pop(request_id, None)
        return True, int(fut.result())

    def _stock_lookup_done(self, request_id: str, chunks: int) -> None:
        """W=0: the built-in lookup pinned `chunks` chunks of every row in L1."""
        self.tempokv.stock_done(request_id, chunks)
        self._sample_l1()
        with self._lock:
            key = self._stock_keys.pop(request_id, None)
        if key is None or chunks <= 0:
            return
        try:
            attn_desc = self._ctx.layout_desc_registry.find_attn_desc(
                key.model_name, key.world_size
            )
            hashes = self._ctx.token_hasher.compute_chunk_hashes(
                list(key.token_ids), end=chunks * self._ctx.chunk_size
            )
            request = self._lookup_request(key, hashes, attn_desc)
        except Exception:
            log.exception("stock lookup accounting failed for %s", request_id)
            return
        by_rank = {r: b * chunks for r, b in request.column_bytes_by_rank().items()}
        self.gauge.add(by_rank)
        with self._lock:
            self._stock_staged[request_id] = by_rank

    @request_handler(HandlerType.BLOCKING)
    def lookup(self, key: IPCCacheServerKey, tp_size: int) -> None:
        """BSR's probe (W > 0) or LMCache's own lookup; force-local and TempoKV's hold
        before it, each under the guard (failing: as if absent)."""
        rid = key.request_id
        g = self._guard
        try:
            self._count("lookups")
            self._lookup_seen(rid)
            if g.run("forced", False, self._forced, rid):
                return
            if g.run("tempokv_gate", False, self.tempokv.gate, key, tp_size):
                return
            if self.window_chunks:
                try:
                    attn_desc = self._ctx.layout_desc_registry.find_attn_desc(
                        key.model_name, key.world_size
                    )
                    why_not = unsupported_reason(attn_desc)
                except ValueError:  # no engine registered this model yet: nothing to hit
                    self._answered(rid)
                    self._count("lookups_unregistered")
                    return
                if not why_not:
                    with self._lock:
                        self._modes[rid] = Mode.BSR
                        self._pending[rid] = self._probe_pool.submit(self._probe_job, key)
                    return
                log.warning("bsr: request %s served by the stock path: %s", rid, why_not)
            with self._lock:
                self._modes[rid] = Mode.STOCK
                self._stock_keys[rid] = key
            self._count("lookups_stock")
            g.call("tempokv_observe", self.tempokv.observe, key)  # the provider sees the read
            self._lookup_mod.lookup(key, tp_size)
        except Exception:
            log.exception("bsr lookup of %s failed: answering 0 chunks", rid)
            self._count("lookup_errors")
            self._answered(rid)

    def _prefetch_status(self, request_id: str, timeout: float | None) -> int | None:
        """query (timeout None) or wait: an answered result, the probe's, or the stock one."""
        res = self._take_result(request_id)
        if res is not None:
            return res
        if self._guard.run("tempokv_holding", False, self.tempokv.holding, request_id):
            return None  # held for committed staging: vLLM asks again
        known, chunks = self._probe_result(request_id, max(0.0, timeout or 0.0))
        if known:
            return chunks
        if self._mode(request_id) == Mode.STOCK:
            if timeout is None:
                got = self._lookup_mod.query_prefetch_status(request_id)
            else:
                got = self._lookup_mod.wait_prefetch_status(request_id, timeout)
            if got is not None:  # LMCache's answer, whatever the accounting does
                self._guard.call("stock_accounting", self._stock_lookup_done, request_id, int(got))
            return got
        return 0

    @request_handler(HandlerType.BLOCKING)
    def query_prefetch_status(self, request_id: str) -> int | None:
        try:
            return self._prefetch_status(request_id, None)
        except Exception:
            log.exception("bsr query_prefetch_status(%s) failed: answering 0", request_id)
            return 0

    @request_handler(HandlerType.BLOCKING)
    def wait_prefetch_status(self, request_id: str, timeout: float) -> int | None:
        try:
            return self._prefetch_status(request_id, timeout)
        except Exception:
            log.exception("bsr wait_prefetch_status(%s) failed: answering 0", request_id)
            return 0

    @request_handler(HandlerType.BLOCKING)
    def free_lookup_locks(self, key: IPCCacheServerKey, tp_size: int) -> None:
        try:
            if self._mode(key.request_id) == Mode.STOCK:
                self._lookup_mod.free_lookup_locks(key, tp_size)
                return
            self._count("free_lookup_locks_noop")  # probe-only lookups hold no lock
        except Exception:
            log.exception("bsr free_lookup_locks(%s) failed", key.request_id)

    @request_handler(HandlerType.BLOCKING)
    def end_session(self, request_id: str) -> None:
        """bsrkv's books of the request (each under the guard), then LMCache's own."""
        g = self._guard
        g.call("clear_marker", self._clear_marker, request_id, "teardown")
        g.call("tempokv_ended", self.tempokv.ended, request_id)
        g.call("stock_release", self._stock_release, request_id, None)
        with self._lock:
            self._modes.pop(request_id, None)
            self._results.pop(request_id, None)
            self._pending.pop(request_id, None)
            self._stock_keys.pop(request_id, None)
        try:
            self._lookup_mod.end_session(request_id)
        except Exception:
            log.exception("bsr end_session(%s) failed", request_id)
