"""BSR inside the real LMCache MP server: probe-only lookup, windowed fail-closed retrieve.

Loaded by the stock server (lmcache 0.5.6) with::

    lmcache server ... --supported-transfer-mode auto \\
      --server-module '{"module_path": "bsrkv.lmcache_ext.server",
                        "config": {"window_chunks": 2, "admission_budget_chunks": 2,
                                   "window_timeout_s": 30}}'

The server builds plugin modules after its built-in ones and its message queue keeps the
last handler registered for an operation, so this module's ``lookup``,
``query_prefetch_status``, ``wait_prefetch_status``, ``free_lookup_locks``, ``retrieve``,
``store`` and ``end_session`` replace the built-ins. With ``window_chunks`` = 0 they pass
through to the built-in handlers (the stock whole-plan path) and only measure.

With W > 0:

- lookup is probe-only (``bsrkv.lmcache_ext.bsr.storage.LMCacheRestoreStorage.probe``): the
  complete hit count, nothing staged, nothing locked; free_lookup_locks has nothing to free.
- retrieve runs ``bsrkv.restore.BoundedRestorer.restore`` for the worker's rows: windows
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
out; an empty payload means ``{}``). The mutating ones (``bsr.reset_peak``, ``bsr.forget``,
``bsr.configure``, ``bsr.fault``, ``tempokv.configure``, ``tempokv.update``) run only when the
payload carries ``"control_token"`` equal to the server's (``$BSRKV_CONTROL_TOKEN`` or
``"control_token"`` in the config; none set: all refused), else answer
``protocol.RefusedReply``; see ``bsrkv.control_token`` and ``server.guard``:

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
- ``bsr.configure`` ``ConfigureRequest`` (W, B, readback, window staging, timeouts; an
  unknown or mistyped key refused, naming it) -> ``{"ok": bool, "config": {...},
  "error"?: str}``: change them between requests (refused mid-window).
- ``bsr.fault`` ``{"op": "set|clear|stats|list", "name": "...", "rules": [...]}`` ->
  ``bsrkv.lmcache_ext.faults.control.handle_control``'s answer (arms the fault adapter
  living in this server process; registered through ``bsrkv.lmcache_ext.bsr.extensions`` when
  LMCache loads that adapter, else ``{"ok": false, "error": "fault adapter unavailable..."}``).

The request's and replies' types are in ``bsrkv.lmcache_ext.bsr.protocol``. Layout of this
package: ``config`` (ServerModuleConfig), ``state`` (what the handlers share), ``lookup``,
``retrieve``, ``control`` (the ``bsr.*`` methods), ``markers``, ``hooks`` (what the module
asks of TempoKV, and ``NO_TEMPOKV``), ``module`` (BsrServerModule and the factory, which
composes ``bsrkv.lmcache_ext.tempokv.component`` in).
"""

from bsrkv.lmcache_ext.server.config import ServerConfigError, ServerModuleConfig
from bsrkv.lmcache_ext.server.module import BsrServerModule, build_server_modules

__all__ = ["BsrServerModule", "ServerConfigError", "ServerModuleConfig", "build_server_modules"]
