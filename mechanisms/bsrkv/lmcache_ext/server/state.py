"""What the lookup, retrieve and control handlers share: config, restorer, books, locks.

``ModuleState`` is the base of every handler mixin of ``BsrServerModule``; it owns the
restorer (rebuilt on ``bsr.configure``), the process-wide gauge and force-local markers
(carried over a rebuild), the per-request path decided at lookup, and the counters.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from enum import IntEnum
from typing import Any

from lmcache.logging import init_logger
from lmcache.v1.distributed.api import MemoryLayoutDesc
from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.ext_server_module import ExtServerModuleBuildContext
from lmcache.v1.multiprocess.modules.lmcache_driven_transfer import (
    LMCacheDrivenTransferModule,
)
from lmcache.v1.multiprocess.modules.lookup import LookupModule

from bsrkv.control_token import CONTROL_TOKEN_ENV, CONTROL_TOKEN_KEY, server_token
from bsrkv.hostguard import Guard
from bsrkv.lmcache_ext.bsr.mp_storage import ServerRestoreStorage
from bsrkv.lmcache_ext.bsr.protocol import LastProbe, RestoreOutcomeSummary
from bsrkv.lmcache_ext.server.config import ServerConfigError, ServerModuleConfig
from bsrkv.lmcache_ext.server.hooks import NO_TEMPOKV, TempoKVHooks
from bsrkv.lmcache_ext.server.markers import RecordingMarkers
from bsrkv.restore.gauge import RestorePoolGauge
from bsrkv.restore.restorer import BoundedRestorer
from bsrkv.restore.stall import StallWatch

log = init_logger("bsrkv.lmcache_ext.server")

RECENT_OUTCOMES = 64  # retrieve outcomes kept for bsr.status
LOOKUPS_KEPT = 4096  # lookup arrival times kept (one per request in flight)


class Mode(IntEnum):
    """Which path serves a request, decided at its lookup."""

    BSR = 0  # probe-only lookup, windowed retrieve
    STOCK = 1  # built-in whole-plan handlers


def unsupported_reason(attn_desc: Any) -> str:
    """'' if BSR can serve this registration, else why not (sliding-window/aux groups)."""
    windows = list(attn_desc.num_chunks_in_sw)
    kinds = list(attn_desc.group_kinds or ())
    if any(w != -1 for w in windows):
        return f"sliding-window object groups {windows}"
    if any(k != "attention" for k in kinds):
        return f"non-attention object groups {kinds}"
    return ""


class ModuleState:
    """Config, restorer, gauge, markers and per-request books of the server module.

    ``_guard`` (``bsrkv.hostguard``) runs every part of a handler that is bsrkv's alone
    (TempoKV's hooks, accounting, spans, markers around a stock call): its failure is
    counted (``bsr.status`` counters ``guard_<site>``), logged once, and the handler gives
    the answer LMCache's own module gave or would give."""

    def __init__(self, build_ctx: ExtServerModuleBuildContext) -> None:
        self.tempokv: TempoKVHooks = NO_TEMPOKV  # the factory composes TempoKV in
        self._guard = Guard("bsrkv.lmcache_ext.server", log)
        self._ctx = build_ctx.server_context
        raw = dict(build_ctx.config or {})
        try:  # the token is not a setting: never in bsr.status's config, never configurable
            self._control_token = server_token(
                raw.pop(CONTROL_TOKEN_KEY, None), os.environ.get(CONTROL_TOKEN_ENV)
            )
        except ValueError as exc:
            raise ServerConfigError(f"bsr server module: {exc}") from None
        if self._control_token is None:
            log.warning("bsr server module: no control token set ($%s): mutating bsr.* and "
                        "tempokv.* methods are refused", CONTROL_TOKEN_ENV)  # fmt: skip
        self.config = ServerModuleConfig.parse(raw)
        lookup_mod = next((m for m in build_ctx.modules if isinstance(m, LookupModule)), None)
        self._transfer_mod = next(
            (m for m in build_ctx.modules if isinstance(m, LMCacheDrivenTransferModule)), None
        )
        if lookup_mod is None:
            raise RuntimeError("bsr server module: no built-in LookupModule in ctx.modules")
        self._lookup_mod: LookupModule = lookup_mod
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
        self.markers = RecordingMarkers()
        self._lock = threading.Lock()
        self._restoring = 0  # retrieves inside restorer.restore (guarded by self._lock)
        self._apply_config(self.config)
        self._modes: dict[str, Mode] = {}
        # answered lookups (forced local, unregistered model, failed): chunks to report
        self._results: dict[str, int] = {}
        self._pending: dict[str, Future[int]] = {}  # probes still running
        # Probes run off the request threads: the built-in normal pool (one thread by
        # default) also answers PING, which must never wait behind a slow L2 lookup.
        self._probe_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bsr-probe")
        # A restore's spans are made after its retrieve answered: at W = 4 over a 16K-token
        # prefix (16 windows, about 100 spans) they held the answer back 3.7 ms (py-spy).
        self._trace_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bsr-trace")
        self._stall = StallWatch().start()
        self._stock_keys: dict[str, IPCCacheServerKey] = {}  # W=0: lookup key per request
        # when each request's lookup arrived (restore_s starts there); the newest LOOKUPS_KEPT
        self._lookup_at: OrderedDict[str, float] = OrderedDict()
        self._stock_staged: dict[str, dict[int, int]] = {}  # W=0: whole-plan bytes per rank
        self._counters: Counter[str] = Counter()
        self._l1_used_peak = 0
        self._l1_after_lookup = -1
        self._last_lookup: LastProbe | None = None
        self._outcomes: deque[RestoreOutcomeSummary] = deque(maxlen=RECENT_OUTCOMES)
        log.info(
            "bsr server module loaded: W=%d B=%d window_timeout_s=%s%s",
            w,
            self.restorer.config.budget_chunks if w else 0,
            self.config.window_timeout_s,
            f" ({self.degraded})" if self.degraded else "",
        )

    # ---- what the TempoKV component asks of the module (tempokv.component.ServerSide) --
    @property
    def guard(self) -> Guard:
        return self._guard

    @property
    def chunk_size(self) -> int:
        return int(self._ctx.chunk_size)

    def count(self, name: str, n: int = 1) -> None:
        self._count(name, n)

    def counters_with(self, prefix: str) -> dict[str, int]:
        with self._lock:
            return {k: v for k, v in self._counters.items() if k.startswith(prefix)}

    def looked_up(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._modes

    def prefetch_storage(self) -> ServerRestoreStorage:
        return ServerRestoreStorage(self._sm, self._layouts_of, staging="prefetch")

    def hold_as_stock(self, key: IPCCacheServerKey) -> None:
        with self._lock:
            self._modes[key.request_id] = Mode.STOCK
            self._stock_keys[key.request_id] = key

    def stock_lookup(self, key: IPCCacheServerKey, tp_size: int) -> None:
        self._count("lookups_stock")
        self._lookup_mod.lookup(key, tp_size)

    def answer_zero(self, request_id: str) -> None:
        with self._lock:
            self._results[request_id] = 0

    def _apply_config(self, cfg: ServerModuleConfig, only_when_idle: bool = False) -> None:
        """(Re)build the storage side and the restorer; gauge and markers carry over. With
        ``only_when_idle``, refuse while any retrieve is inside a restore: the check and
        the swap share one lock hold, so no retrieve can start on the old restorer after
        the check and run beside the new one (B exceeded across the two)."""
        w = 0 if self.degraded else cfg.window_chunks
        storage = ServerRestoreStorage(
            self._sm,
            self._layouts_of,
            probe_timeout_s=cfg.probe_timeout_s,
            drain_timeout_s=cfg.drain_timeout_s,
            on_window_ready=self._sample_l1,
            staging=cfg.window_staging,
        )
        core = cfg.model_copy(
            update={
                "window_chunks": w,
                "admission_budget_chunks": cfg.admission_budget_chunks if w else 0,
            }
        ).core_config()
        restorer = BoundedRestorer(storage, core, gauge=self.gauge, markers=self.markers)
        with self._lock:
            if only_when_idle and self._restoring:
                raise ServerConfigError(f"{self._restoring} retrieve(s) in flight: retry when idle")
            self.config, self.window_chunks = cfg, w
            self.restorer = restorer

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

    def _mode(self, request_id: str) -> Mode:
        with self._lock:
            return self._modes.get(request_id, Mode.BSR if self.window_chunks else Mode.STOCK)

    def _stock_release(self, request_id: str, rank: int | None) -> None:
        """W=0: un-gauge what the stock lookup pinned, for one rank (or all on teardown)."""
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

    def _lookup_seen(self, request_id: str) -> None:
        """The first lookup of a request (vLLM may ask again while it waits) starts its
        ``restore_s``; a request that never retrieves ages out."""
        now = time.monotonic()
        with self._lock:
            if request_id not in self._lookup_at:
                self._lookup_at[request_id] = now
                while len(self._lookup_at) > LOOKUPS_KEPT:
                    self._lookup_at.popitem(last=False)

    def _since_lookup(self, request_id: str, retrieve_start: float) -> float:
        """Seconds from the request's lookup (else from its retrieve) to now."""
        with self._lock:
            start = self._lookup_at.get(request_id, retrieve_start)
        return time.monotonic() - start

    def _record_outcome(self, summary: RestoreOutcomeSummary) -> None:
        with self._lock:
            self._outcomes.append(summary)
