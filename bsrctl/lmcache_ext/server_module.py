"""BSR inside the real LMCache MP server: probe-only lookup, windowed fail-closed retrieve.

Loaded by the stock server (lmcache 0.5.6) with::

    lmcache server ... --supported-transfer-mode auto \\
      --server-module '{"module_path": "bsrctl.lmcache_ext.server_module",
                        "config": {"window_chunks": 2, "admission_budget_chunks": 2,
                                   "window_timeout_s": 30}}'

The server builds plugin modules after its built-in ones and its message queue keeps the
last handler registered for an operation, so this module's ``lookup``,
``query_prefetch_status``, ``wait_prefetch_status``, ``free_lookup_locks``, ``retrieve``,
``store`` and ``end_session`` replace the built-ins. With ``window_chunks`` = 0 they pass
through to the built-in handlers (the stock whole-plan path) and only measure.

With W > 0:

- lookup is probe-only (the core's ``LMCacheRestoreStorage.probe``): the complete hit count, nothing
  staged, nothing locked; free_lookup_locks has nothing to free.
- retrieve runs ``bsrctl.restore.BoundedRestorer.restore`` for the worker's rows: windows
  of at most W chunks, each prefetched with read locks into L1, required complete within
  ``window_timeout_s``, copied by LMCache's own per-object-group transfer into the
  window's slice of the block ids, synchronised and released before the next window is
  admitted under the process-wide budget B. The whole retrieve must end within
  ``retrieve_deadline_s`` (45 s, below vLLM's 60 s mq_timeout); every wait is capped by
  what is left of it. Any missing key, timeout, passed deadline or install error
  answers ok=False: the connector then reports every block of the request as a load
  error and vLLM (``kv_load_failure_policy: recompute``) recomputes.
- force-local: a failed restore marks the request; its next lookup reports 0 chunks until
  a successful store or retrieve of that request (admitted) or its end_session (teardown).

No handler lets an exception escape (a raising handler hangs vLLM for the message-queue
timeout): every error fails closed.

Extra methods, reachable through ``server_module_call`` (UTF-8 JSON object in, JSON object
out; an empty payload means ``{}``):

- ``bsr.peak`` ``{}`` -> ``{"restore_pool_peak_bytes_by_rank": {"0": int, ...},
  "restore_pool_peak_bytes": int, "restore_pool_level_bytes_by_rank": {...},
  "l1_used_peak_bytes": int, "l1_used_bytes": int, "l1_capacity_bytes": int}``.
  ``restore_pool_*`` is the core's gauge (window bytes from the registration, per TP rank,
  from staging submission to release; for W = 0 the whole plan pinned by the stock lookup,
  from its completion to the rank's retrieve); ``l1_used_peak_bytes`` is L1's measured
  occupancy sampled whenever a window (or a stock lookup) is fully staged.
- ``bsr.reset_peak`` ``{}`` -> ``{"before": <peak>, "after": <peak>}`` (new high-water
  period from the current level).
- ``bsr.status`` ``{}`` -> ``{"schema", "config", "effective_window_chunks",
  "effective_budget_chunks", "budget_in_use_chunks", "budget_peak_in_use_chunks",
  "degraded", "counters": {"lookups", "lookups_probe_only", "lookups_stock",
  "lookups_forced_local", "probe_hit_chunks", "retrieves", "retrieves_ok",
  "retrieves_failed", "windows", "bytes_restored", "failures_<kind>",
  "free_lookup_locks_noop", "forgets", ...}, "force_local_markers": int,
  "force_local_events": {"set": n, "forced_lookup": n, "cleared_admitted": n,
  "cleared_teardown": n}, "l1_used_after_last_probe_bytes": int, "last_probe": {...},
  "tracked_requests": int, "peak": <peak>, "recent_outcomes": [{"request_id", "rank",
  "mode", "ok", "failure", "detail", "start_token", "end_token", "cached_chunks",
  "windows_done", "bytes_restored", "peak_staged_bytes_by_rank", "restore_s"}, ...]}``.
  Also merged into the server's own status (HTTP ``/status``) under ``"bsr"``.
- ``bsr.markers`` ``{}`` -> ``{"active": int, "counts": {...}, "events": [{"request_id",
  "event": "set|forced_lookup|cleared_admitted|cleared_teardown", "reason", "t"}]}``.
- ``bsr.forget`` ``{"force": false, "wait_s": 0}`` -> ``{"l1_used_bytes_before",
  "l1_used_bytes_after", "force", "waited_s"}``: clears L1 (the built-in clear), retried
  until empty or ``wait_s`` passed, so the next load comes from L2.
- ``bsr.configure`` ``{<any config key>: value}`` -> ``{"ok": bool, "config": {...},
  "error"?: str}``: change W / B / timeouts between requests (refused mid-window).
- ``bsr.fault`` ``{"op": "set|clear|stats|list", "name": "...", "rules": [...]}`` ->
  ``bsrctl.lmcache_ext.fault_adapter.handle_control``'s answer (arms the fault adapter
  living in this server process).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import asdict, dataclass, fields
from enum import IntEnum
from typing import Any

from lmcache import torch_dev
from lmcache.logging import init_logger
from lmcache.v1.distributed.api import (
    MemoryLayoutDesc,
    ObjectKey,
    ipc_key_to_grouped_object_keys,
)
from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.ext_server_module import (
    ExtServerModuleBuildContext,
    server_module_handler,
)
from lmcache.v1.multiprocess.modules.lmcache_driven_transfer import (
    LMCacheDrivenTransferModule,
)
from lmcache.v1.multiprocess.modules.lookup import LookupModule
from lmcache.v1.multiprocess.native_completion import submit_callback_to_stream
from lmcache.v1.multiprocess.request_handler import HandlerType, request_handler

from bsrctl.errors import BadInput
from bsrctl.lmcache_ext.mp_storage import (
    MPBlockDestination,
    ServerRestoreStorage,
    layout_bytes,
    tp_rank_of,
)
from bsrctl.restore.gauge import RestorePoolGauge
from bsrctl.restore.markers import ForceLocalMarkers
from bsrctl.restore.plan import confirm_plan
from bsrctl.restore.restorer import BoundedRestorer, RestoreConfig
from bsrctl.restore.types import RestoreOutcome, RestoreRequest, RowId, RowKeys

log = init_logger(__name__)

SCHEMA = "bsrctl.lmcache_ext/1"
RECENT_OUTCOMES = 64  # retrieve outcomes kept for bsr.status
MARKER_HISTORY = 256  # force-local marker events kept for bsr.markers
# bsr.forget runs on the pool that also answers PING: never hold it near the 10 s timeout.
FORGET_MAX_WAIT_S = 3.0
STALL_LOOKBACK_S = 15.0  # stalls this long before a retrieve began still trip its guard


@dataclass(frozen=True)
class BsrServerConfig:
    """The ``config`` object of ``--server-module``."""

    window_chunks: int = 0  # W; 0 = stock whole-plan path (built-in handlers)
    admission_budget_chunks: int = 0  # B, process-wide; 0 means B = W
    window_timeout_s: float = 30.0  # max wait for one window to be complete in L1
    probe_timeout_s: float = 10.0  # max wait for one probe (L1 or one L2 adapter)
    admission_timeout_s: float = 120.0  # max wait for the budget to admit a window
    # Whole retrieve, admission to last install (0 = none): below vLLM's mq_timeout, after
    # which the connector recomputes into the same blocks (bsrctl sets 0.75 × 60 s).
    retrieve_deadline_s: float = 45.0
    # After a window timed out, how long its release waits for the late prefetch to land
    # (so the budget and gauge stay exact) before leaving it to a background drain.
    drain_timeout_s: float = 5.0
    # Refuse to install a window after a process stall this long (0 = off). vLLM's
    # connector declares the server unhealthy when one PING (10 s) goes unanswered and then
    # recomputes the request in the same blocks: a window installed after that would
    # overwrite the recomputation. Keep it below the connector's heartbeat interval.
    stall_guard_s: float = 5.0
    # TEST ONLY: raise inside the install of this window index (-1 = never). Issue 5's
    # matrices inject faults by real means (L2 adapters); this knob exists for the
    # "raised error in install" case alone.
    test_only_fail_install_window: int = -1

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> BsrServerConfig:
        raw = dict(raw or {})
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise BadInput(
                f"bsr server module: unknown config key(s) {unknown}; valid: {sorted(known)}"
            )
        out: dict[str, Any] = {}
        for name, value in raw.items():
            want = int if known[name].type in ("int", int) else float
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise BadInput(f"bsr server module: {name} must be a number, got {value!r}")
            if want is int and value != int(value):
                raise BadInput(f"bsr server module: {name} must be an integer, got {value!r}")
            out[name] = want(value)
        cfg = cls(**out)
        if cfg.window_chunks < 0:
            raise BadInput(f"window_chunks must be >= 0, got {cfg.window_chunks}")
        if cfg.window_chunks and 0 < cfg.admission_budget_chunks < cfg.window_chunks:
            raise BadInput(
                f"admission_budget_chunks={cfg.admission_budget_chunks} < "
                f"window_chunks={cfg.window_chunks}: set B >= W (or 0 for B = W)"
            )
        for name in ("window_timeout_s", "probe_timeout_s", "admission_timeout_s"):
            if getattr(cfg, name) <= 0:
                raise BadInput(f"{name} must be > 0, got {getattr(cfg, name)}")
        for name in ("drain_timeout_s", "stall_guard_s", "retrieve_deadline_s"):
            if getattr(cfg, name) < 0:
                raise BadInput(f"{name} must be >= 0, got {getattr(cfg, name)}")
        return cfg


class Mode(IntEnum):
    """Which path serves a request, decided at its lookup."""

    BSR = 0  # probe-only lookup, windowed retrieve
    STOCK = 1  # built-in whole-plan handlers


@dataclass
class _LookupResult:
    chunks: int  # complete advertised prefix in chunks (0 when forced local)
    forced_local: bool  # answered 0 because of a force-local marker


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, default=str).encode()


def _payload(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    data = json.loads(raw.decode())
    if not isinstance(data, dict):
        raise BadInput("bsr.* payloads are JSON objects")
    return data


def _supported(attn_desc: Any) -> str:
    """'' if BSR can serve this registration, else why not (sliding-window/aux groups)."""
    windows = list(attn_desc.num_chunks_in_sw)
    kinds = list(attn_desc.group_kinds or ())
    if any(w != -1 for w in windows):
        return f"sliding-window object groups {windows}"
    if any(k != "attention" for k in kinds):
        return f"non-attention object groups {kinds}"
    return ""


class _StallWatch:
    """A ticker thread that remembers how long this process went without running it.

    A gap far above the tick is a process stall (CPU starvation, memory pressure, a
    GIL-holding call): while it lasts the server answers no PING either.
    """

    TICK_S = 0.1
    KEEP_ABOVE_S = 0.5  # gaps shorter than this are not remembered

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._gaps: deque[tuple[float, float]] = deque(maxlen=256)  # (end, length)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bsr-stall-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.TICK_S):
            now = time.monotonic()
            with self._lock:
                gap = now - self._last
                self._last = now
                if gap > self.KEEP_ABOVE_S:
                    self._gaps.append((now, gap))

    def max_gap_since(self, t0: float) -> float:
        """Longest stall that ended after ``t0``, or is still going on."""
        now = time.monotonic()
        with self._lock:
            ongoing = now - self._last
            ended = max((g for end, g in self._gaps if end > t0), default=0.0)
        return max(ended, ongoing)

    def stop(self) -> None:
        self._stop.set()


class _RecordingMarkers(ForceLocalMarkers):
    """ForceLocalMarkers that also keep a bounded history of what happened to them."""

    def __init__(self) -> None:
        super().__init__()
        self._events: deque[dict[str, Any]] = deque(maxlen=MARKER_HISTORY)
        self._ev_lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def event(self, request_id: str, event: str, reason: str = "") -> None:
        with self._ev_lock:
            self.counts[event] += 1
            self._events.append(
                {"request_id": request_id, "event": event, "reason": reason, "t": time.time()}
            )

    def events(self) -> list[dict[str, Any]]:
        with self._ev_lock:
            return list(self._events)

    def set(self, request_id: str, reason: str) -> None:
        super().set(request_id, reason)
        self.event(request_id, "set", reason)

    def on_admitted(self, request_id: str) -> None:
        if self.record(request_id) is not None:
            super().on_admitted(request_id)
            self.event(request_id, "cleared_admitted")

    def on_teardown(self, request_id: str) -> None:
        if self.record(request_id) is not None:
            super().on_teardown(request_id)
            self.event(request_id, "cleared_teardown")


class BsrServerModule:
    """The engine module: replaces the lookup/retrieve handlers, adds bsr.* methods."""

    def __init__(self, build_ctx: ExtServerModuleBuildContext) -> None:
        self._ctx = build_ctx.server_context
        self.config = BsrServerConfig.from_dict(build_ctx.config)
        self._lookup_mod = next((m for m in build_ctx.modules if isinstance(m, LookupModule)), None)
        self._transfer_mod = next(
            (m for m in build_ctx.modules if isinstance(m, LMCacheDrivenTransferModule)), None
        )
        if self._lookup_mod is None:
            raise RuntimeError("bsr server module: no built-in LookupModule in ctx.modules")
        self.degraded = ""
        w = self.config.window_chunks
        if w and self._transfer_mod is None:
            self.degraded = (
                "no lmcache_driven transfer module (start the server with "
                "--supported-transfer-mode auto or lmcache_driven): running W=0"
            )
            log.error("bsr server module: %s", self.degraded)
            w = 0
        self.window_chunks = w
        self._sm = self._ctx.storage_manager
        self.gauge = RestorePoolGauge()
        self.markers = _RecordingMarkers()
        self._lock = threading.Lock()
        self._restoring = 0  # retrieves inside restorer.restore (guarded by self._lock)
        self._apply_config(self.config)
        self._modes: dict[str, Mode] = {}
        self._results: dict[str, _LookupResult] = {}
        self._pending: dict[str, Future[int]] = {}  # probes still running
        # Probes run off the request threads: the built-in normal pool (one thread by
        # default) also answers PING, which must never wait behind a slow L2 lookup.
        self._probe_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bsr-probe")
        self._stall = _StallWatch()
        self._stock_keys: dict[str, IPCCacheServerKey] = {}  # W=0: lookup key per request
        self._stock_staged: dict[str, dict[int, int]] = {}  # W=0: whole-plan bytes per rank
        self._counters: Counter[str] = Counter()
        self._l1_used_peak = 0
        self._l1_after_lookup = -1
        self._last_lookup: dict[str, Any] = {}
        self._outcomes: deque[dict[str, Any]] = deque(maxlen=RECENT_OUTCOMES)
        log.info(
            "bsr server module loaded: W=%d B=%d window_timeout_s=%s%s",
            w,
            self.restorer.config.budget_chunks if w else 0,
            self.config.window_timeout_s,
            f" ({self.degraded})" if self.degraded else "",
        )

    def _apply_config(self, cfg: BsrServerConfig, only_when_idle: bool = False) -> None:
        """(Re)build the storage side and the restorer; gauge and markers carry over. With
        ``only_when_idle``, refuse (BadInput) while any retrieve is inside a restore: the
        check and the swap share one lock hold, so no retrieve can start on the old
        restorer after the check and run beside the new one (B exceeded across the two)."""
        w = 0 if self.degraded else cfg.window_chunks
        storage = ServerRestoreStorage(
            self._sm,
            self._layouts_of,
            probe_timeout_s=cfg.probe_timeout_s,
            drain_timeout_s=cfg.drain_timeout_s,
            on_window_ready=self._sample_l1,
        )
        restorer = BoundedRestorer(
            storage,
            RestoreConfig(
                window_chunks=w,
                admission_budget_chunks=cfg.admission_budget_chunks if w else 0,
                window_timeout_s=cfg.window_timeout_s,
                admission_timeout_s=cfg.admission_timeout_s,
                retrieve_deadline_s=cfg.retrieve_deadline_s,
            ),
            gauge=self.gauge,
            markers=self.markers,
        )
        with self._lock:
            if only_when_idle and self._restoring:
                raise BadInput(f"{self._restoring} retrieve(s) in flight: retry when idle")
            self.config, self.window_chunks = cfg, w
            self.storage, self.restorer = storage, restorer

    # ---- EngineModule -------------------------------------------------------------------

    @property
    def context(self) -> Any:
        return self._ctx

    def report_status(self) -> dict[str, Any]:
        try:
            return {"bsr": self.status()}
        except Exception as e:  # status must never break the server's status page
            return {"bsr": {"error": repr(e)}}

    def close(self) -> None:
        self._stall.stop()
        self._probe_pool.shutdown(wait=False, cancel_futures=True)

    # ---- bookkeeping --------------------------------------------------------------------

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counters[name] += n

    def _l1_used(self) -> int:
        return int(self._sm.get_l1_usage()[0])

    def _sample_l1(self) -> None:
        used = self._l1_used()
        with self._lock:
            self._l1_used_peak = max(self._l1_used_peak, used)

    def _layouts_of(self, model_name: str, world_size: int) -> dict[int, MemoryLayoutDesc]:
        descs = self._ctx.layout_desc_registry.find_group_layout_descs(model_name, world_size)
        if not descs:
            raise LookupError(f"no layout registered for {model_name!r} world {world_size}")
        return dict(descs)

    def _mark(self, request_id: str, reason: str) -> None:
        self.markers.set(request_id, reason)

    def _clear_marker(self, request_id: str, why: str) -> None:
        if why == "admitted":
            self.restorer.on_admitted(request_id)
        else:
            self.restorer.on_teardown(request_id)

    def _forced(self, request_id: str) -> bool:
        if self.markers.record(request_id) is None:
            return False
        self._count("lookups_forced_local")
        self.markers.event(request_id, "forced_lookup")
        with self._lock:
            self._results[request_id] = _LookupResult(chunks=0, forced_local=True)
        return True

    def _mode(self, request_id: str) -> Mode:
        with self._lock:
            return self._modes.get(request_id, Mode.BSR if self.window_chunks else Mode.STOCK)

    def _take_result(self, request_id: str) -> _LookupResult | None:
        with self._lock:
            return self._results.pop(request_id, None)

    # ---- lookup side --------------------------------------------------------------------

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
        self._last_lookup = {
            "request_id": key.request_id,
            "model_name": key.model_name,
            "world_size": key.world_size,
            "end_token": key.end,
            "chunks": chunks,
        }
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

    def _stock_release(self, request_id: str, rank: int | None) -> None:
        with self._lock:
            staged = self._stock_staged.get(request_id)
            if not staged:
                return
            part = dict(staged) if rank is None else {rank: staged.pop(rank, 0)}
            if rank is None or not staged:
                self._stock_staged.pop(request_id, None)
        part = {r: b for r, b in part.items() if b}
        if part:
            self.gauge.remove(part)

    @request_handler(HandlerType.BLOCKING)
    def lookup(self, key: IPCCacheServerKey, tp_size: int) -> None:
        rid = key.request_id
        try:
            self._count("lookups")
            if self._forced(rid):
                return
            if self.window_chunks:
                try:
                    attn_desc = self._ctx.layout_desc_registry.find_attn_desc(
                        key.model_name, key.world_size
                    )
                    why_not = _supported(attn_desc)
                except ValueError:  # no engine registered this model yet: nothing to hit
                    with self._lock:
                        self._modes[rid] = Mode.BSR
                        self._results[rid] = _LookupResult(chunks=0, forced_local=False)
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
            self._lookup_mod.lookup(key, tp_size)
        except Exception:
            log.exception("bsr lookup of %s failed: answering 0 chunks", rid)
            self._count("lookup_errors")
            with self._lock:
                self._modes[rid] = Mode.BSR
                self._results[rid] = _LookupResult(chunks=0, forced_local=False)

    @request_handler(HandlerType.BLOCKING)
    def query_prefetch_status(self, request_id: str) -> int | None:
        try:
            res = self._take_result(request_id)
            if res is not None:
                return res.chunks
            known, chunks = self._probe_result(request_id, 0.0)
            if known:
                return chunks
            if self._mode(request_id) == Mode.STOCK:
                got = self._lookup_mod.query_prefetch_status(request_id)
                if got is not None:
                    self._stock_lookup_done(request_id, int(got))
                return got
            return 0
        except Exception:
            log.exception("bsr query_prefetch_status(%s) failed: answering 0", request_id)
            return 0

    @request_handler(HandlerType.BLOCKING)
    def wait_prefetch_status(self, request_id: str, timeout: float) -> int | None:
        try:
            res = self._take_result(request_id)
            if res is not None:
                return res.chunks
            known, chunks = self._probe_result(request_id, max(0.0, timeout))
            if known:
                return chunks
            if self._mode(request_id) == Mode.STOCK:
                got = self._lookup_mod.wait_prefetch_status(request_id, timeout)
                if got is not None:
                    self._stock_lookup_done(request_id, int(got))
                return got
            return 0
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
        try:
            self._clear_marker(request_id, "teardown")
            self._stock_release(request_id, None)
            with self._lock:
                self._modes.pop(request_id, None)
                self._results.pop(request_id, None)
                self._pending.pop(request_id, None)
                self._stock_keys.pop(request_id, None)
            self._lookup_mod.end_session(request_id)
        except Exception:
            log.exception("bsr end_session(%s) failed", request_id)

    # ---- transfer side ------------------------------------------------------------------

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
                self._clear_marker(key.request_id, "admitted")
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
                return self._stock_retrieve(
                    key, instance_id, gpu_block_ids, event_ipc_handle, skip_first_n_tokens
                )
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
            handle, ok = self._transfer_mod.retrieve(
                key, instance_id, block_ids, event_ipc_handle, skip
            )
        finally:
            self._stock_release(key.request_id, key.worker_id)
        self._count("retrieves_ok" if ok else "retrieves_failed")
        if ok:
            self._clear_marker(key.request_id, "admitted")
        else:
            self._mark(key.request_id, "stock retrieve failed")
        self._record_outcome(
            {
                "request_id": key.request_id,
                "rank": key.worker_id,
                "mode": "stock",
                "ok": ok,
                "start_token": key.start,
                "end_token": key.end,
                "restore_s": round(time.monotonic() - t0, 6),
            }
        )
        return handle, ok

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
        why_not = _supported(groups_mgr.get_attn_desc())
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
                guard=self._stall_guard(t0),
            )
            with self._lock:
                self._restoring += 1
                restorer = self.restorer
            try:
                outcome = restorer.restore(plan, dest)
            finally:
                with self._lock:
                    self._restoring -= 1
            eb.record_event(event, cc.stream)
        self._after_restore(key, outcome, time.monotonic() - t0)
        return eb.export_event(event, cc.device), outcome.ok

    def _stall_guard(self, t0: float) -> Callable[[], str]:
        limit = self.config.stall_guard_s

        def guard() -> str:
            if limit <= 0:
                return ""
            # A stall just before this retrieve counts too: the request may have waited
            # in the queue through it while the engine's PING was timing out.
            gap = self._stall.max_gap_since(t0 - STALL_LOOKBACK_S)
            if gap < limit:
                return ""
            self._count("stall_guard_trips")
            return (
                f"the server stalled {gap:.1f}s during this retrieve (>= stall_guard_s="
                f"{limit}): the engine may have declared it unhealthy and be recomputing"
            )

        return guard

    def _after_restore(self, key: IPCCacheServerKey, outcome: RestoreOutcome, dt: float) -> None:
        rid = key.request_id
        self._count("windows", outcome.windows_done)
        self._count("bytes_restored", outcome.bytes_restored)
        if outcome.ok:
            self._count("retrieves_ok")
            self._clear_marker(rid, "admitted")
        else:
            self._count("retrieves_failed")
            self._count(f"failures_{outcome.failure.name.lower()}")
            log.warning("bsr restore of %s failed closed: %s", rid, outcome.detail)
        self._record_outcome(
            {
                "request_id": rid,
                "rank": key.worker_id,
                "mode": "bsr",
                "ok": outcome.ok,
                "failure": outcome.failure.name,
                "detail": outcome.detail,
                "start_token": key.start,
                "end_token": key.end,
                "cached_chunks": outcome.cached_chunks,
                "windows_done": outcome.windows_done,
                "bytes_restored": outcome.bytes_restored,
                "peak_staged_bytes_by_rank": outcome.peak_staged_bytes_by_rank,
                "restore_s": round(dt, 6),
            }
        )

    def _record_outcome(self, summary: dict[str, Any]) -> None:
        with self._lock:
            self._outcomes.append(summary)

    # ---- bsr.* methods (JSON bytes in, JSON bytes out) ------------------------------------

    def peak(self) -> dict[str, Any]:
        used, total = self._sm.get_l1_usage()
        with self._lock:
            l1_peak = self._l1_used_peak
        return {
            "restore_pool_peak_bytes_by_rank": {
                str(r): b for r, b in sorted(self.gauge.peak_bytes().items())
            },
            "restore_pool_peak_bytes": self.gauge.peak_max_bytes(),
            "restore_pool_level_bytes_by_rank": {
                str(r): b for r, b in sorted(self.gauge.level_bytes().items())
            },
            "l1_used_peak_bytes": l1_peak,
            "l1_used_bytes": int(used),
            "l1_capacity_bytes": int(total),
        }

    def status(self) -> dict[str, Any]:
        cfg = asdict(self.config)
        budget = self.restorer.budget
        with self._lock:
            counters = dict(self._counters)
            outcomes = list(self._outcomes)
            modes = len(self._modes)
        return {
            "schema": SCHEMA,
            "config": cfg,
            "effective_window_chunks": self.window_chunks,
            "effective_budget_chunks": budget.budget_chunks if budget else 0,
            "budget_in_use_chunks": budget.in_use_chunks if budget else 0,
            "budget_peak_in_use_chunks": budget.peak_in_use_chunks if budget else 0,
            "degraded": self.degraded,
            "counters": counters,
            "force_local_markers": len(self.markers),
            "force_local_events": dict(self.markers.counts),
            "l1_used_after_last_probe_bytes": self._l1_after_lookup,
            "last_probe": dict(self._last_lookup),
            "tracked_requests": modes,
            "peak": self.peak(),
            "recent_outcomes": outcomes,
        }

    @server_module_handler("bsr.status")
    def bsr_status(self, payload: bytes) -> bytes:
        return _json(self.status())

    @server_module_handler("bsr.peak")
    def bsr_peak(self, payload: bytes) -> bytes:
        return _json(self.peak())

    @server_module_handler("bsr.reset_peak")
    def bsr_reset_peak(self, payload: bytes) -> bytes:
        before = self.peak()
        self.gauge.reset()
        used = self._l1_used()
        with self._lock:
            self._l1_used_peak = used
        if self.restorer.budget is not None:
            self.restorer.budget.reset_peak()
        return _json({"before": before, "after": self.peak()})

    @server_module_handler("bsr.forget")
    def bsr_forget(self, payload: bytes) -> bytes:
        """Drop every unlocked L1 object so the next load comes from L2.

        Payload ``{"force": false, "wait_s": 0}``: objects still locked (an L2 write-through
        in flight, a pinned read) are skipped; with ``wait_s`` > 0 (at most
        ``FORGET_MAX_WAIT_S``: call again for longer) the clear is retried until L1 is empty
        or the time is up. ``force`` also drops locked objects (unsafe while stores or
        restores are in flight).
        """
        req = _payload(payload)
        force = bool(req.get("force", False))
        wait_s = min(float(req.get("wait_s", 0.0)), FORGET_MAX_WAIT_S)
        before = self._l1_used()
        deadline = time.monotonic() + wait_s
        while True:
            self._sm.clear(force=force)
            after = self._l1_used()
            if after == 0 or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        self._count("forgets")
        return _json(
            {
                "l1_used_bytes_before": before,
                "l1_used_bytes_after": after,
                "force": force,
                "waited_s": round(max(0.0, wait_s - (deadline - time.monotonic())), 3),
            }
        )

    @server_module_handler("bsr.configure")
    def bsr_configure(self, payload: bytes) -> bytes:
        """Change W / B / timeouts at run time (refused while a window is in flight).

        Payload: any subset of the ``--server-module`` config keys. A request keeps the
        path its lookup chose; change the config between requests, not during one.
        """
        try:
            merged = {**asdict(self.config), **_payload(payload)}
            self._apply_config(BsrServerConfig.from_dict(merged), only_when_idle=True)
            self._count("reconfigurations")
            return _json({"ok": True, "config": asdict(self.config)})
        except Exception as e:
            return _json({"ok": False, "error": str(e), "config": asdict(self.config)})

    @server_module_handler("bsr.fault")
    def bsr_fault(self, payload: bytes) -> bytes:
        """Arm/clear/read rules of bsrctl's fault-injecting L2 adapter in this process."""
        try:
            from bsrctl.lmcache_ext.fault_adapter import handle_control
        except Exception as e:
            return _json({"ok": False, "error": f"fault adapter unavailable: {e!r}"})
        return handle_control(payload)

    @server_module_handler("bsr.markers")
    def bsr_markers(self, payload: bytes) -> bytes:
        return _json(
            {
                "active": len(self.markers),
                "counts": dict(self.markers.counts),
                "events": self.markers.events(),
            }
        )


def build_server_modules(ctx: ExtServerModuleBuildContext) -> BsrServerModule:
    """Factory named by ``--server-module`` (``factory_name`` defaults to this).

    With ``BSRCTL_DUMP_STACKS=1`` in the server's environment, SIGUSR1 dumps every
    thread's stack to stderr (diagnosing a stalled server without a debugger).
    """
    if os.environ.get("BSRCTL_DUMP_STACKS") == "1":
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    return BsrServerModule(ctx)
