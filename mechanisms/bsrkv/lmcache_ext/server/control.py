"""The ``bsr.*`` methods (``server_module_call``: UTF-8 JSON object in, JSON object out).

Every reply is a ``bsrkv.lmcache_ext.bsr.protocol`` type sent as its ``to_json()``.
``bsr.reset_peak``, ``bsr.forget``, ``bsr.configure`` and ``bsr.fault`` change the server:
they run only for a caller holding the control token (``server.guard``); the others answer
anyone. ``bsr.fault`` is answered by whatever registered the ``bsr.fault`` control extension in this
process (the fault-injecting L2 adapter does, when LMCache loads it); this package never
imports it.
"""

from __future__ import annotations

import json
import time
from typing import Any

from bsrkv.hostguard import process_failures
from bsrkv.lmcache_ext.bsr import extensions
from bsrkv.lmcache_ext.bsr.protocol import (
    ConfigureReply,
    ConfigureRequest,
    ForgetReply,
    GuardFailure,
    HoldsReply,
    PeakReply,
    RegistrationReply,
    ResetPeakReply,
    StatusReply,
)
from bsrkv.lmcache_ext.server.config import ServerConfigError
from bsrkv.lmcache_ext.server.guard import handler, mutating
from bsrkv.lmcache_ext.server.holds import l2_holds
from bsrkv.lmcache_ext.server.layout import live_registrations
from bsrkv.lmcache_ext.server.state import ModuleState
from bsrkv.trace.spans import GUARD as SPANS_GUARD

# bsr.forget runs on the pool that also answers PING: never hold it near the 10 s timeout.
FORGET_MAX_WAIT_S = 3.0


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, default=str).encode()


def _payload(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    data = json.loads(raw.decode())
    if not isinstance(data, dict):
        raise ServerConfigError("bsr.* payloads are JSON objects")
    return data


class ControlHandlers(ModuleState):
    """``bsr.status``, ``bsr.peak``, ``bsr.reset_peak``, ``bsr.forget``, ``bsr.configure``,
    ``bsr.markers``, ``bsr.registration``, ``bsr.holds`` and ``bsr.fault``."""

    def peak(self) -> PeakReply:
        used, total = self._sm.get_l1_usage()
        with self._lock:
            l1_peak = self._l1_used_peak
        return PeakReply(
            restore_pool_peak_bytes_by_rank=self.gauge.peak_bytes(),
            restore_pool_peak_bytes=self.gauge.peak_max_bytes(),
            restore_pool_level_bytes_by_rank=self.gauge.level_bytes(),
            l1_used_peak_bytes=l1_peak,
            l1_used_bytes=int(used),
            l1_capacity_bytes=int(total),
        )

    def status(self) -> StatusReply:
        budget = self.restorer.budget
        guarded = {f"guard_{k}": n for k, n in self._guard.counts().items()}
        guarded |= {f"guard_trace_{k}": n for k, n in SPANS_GUARD.counts().items()}
        with self._lock:
            counters = {**self._counters, **guarded}
            outcomes = tuple(self._outcomes)
            modes = len(self._modes)
        return StatusReply(
            config=self.config.model_dump(),
            effective_window_chunks=self.window_chunks,
            effective_budget_chunks=budget.budget_chunks if budget else 0,
            budget_in_use_chunks=budget.in_use_chunks if budget else 0,
            budget_peak_in_use_chunks=budget.peak_in_use_chunks if budget else 0,
            degraded=self.degraded,
            counters=counters,
            force_local_markers=len(self.markers),
            force_local_events=dict(self.markers.counts),
            l1_used_after_last_probe_bytes=self._l1_after_lookup,
            last_probe=self._last_lookup,
            tracked_requests=modes,
            peak=self.peak(),
            recent_outcomes=outcomes,
            guard_failures=tuple(GuardFailure(*f) for f in process_failures()),
        )

    @handler("bsr.status")
    def bsr_status(self, payload: bytes) -> bytes:
        return _json(self.status().to_json())

    @handler("bsr.peak")
    def bsr_peak(self, payload: bytes) -> bytes:
        return _json(self.peak().to_json())

    @mutating("bsr.reset_peak")
    def bsr_reset_peak(self, payload: bytes) -> bytes:
        before = self.peak()
        self.gauge.reset()
        used = self._l1_used()
        with self._lock:
            self._l1_used_peak = used
        if self.restorer.budget is not None:
            self.restorer.budget.reset_peak()
        return _json(ResetPeakReply(before, self.peak()).to_json())

    @mutating("bsr.forget")
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
        waited = round(max(0.0, wait_s - (deadline - time.monotonic())), 3)
        return _json(ForgetReply(before, after, force, waited).to_json())

    @mutating("bsr.configure")
    def bsr_configure(self, payload: bytes) -> bytes:
        """Change W / B / timeouts at run time (refused while a window is in flight).

        Payload: a ``ConfigureRequest`` (an unknown or mistyped key is refused, naming
        it). A request keeps the path its lookup chose; change the config between
        requests, not during one.
        """
        try:
            changes = ConfigureRequest.from_json(_payload(payload)).changes()
            self._apply_config(self.config.merged(changes), only_when_idle=True)
            self._count("reconfigurations")
            reply = ConfigureReply(True, self.config.model_dump())
        except Exception as e:
            reply = ConfigureReply(False, self.config.model_dump(), str(e))
        return _json(reply.to_json())

    @mutating("bsr.fault")
    def bsr_fault(self, payload: bytes) -> bytes:
        """Arm/clear/read rules of bsrkv's fault-injecting L2 adapter in this process."""
        fault = extensions.control_handler("bsr.fault")
        if fault is None:
            return _json(
                {
                    "ok": False,
                    "error": "fault adapter unavailable: none loaded in this server process",
                }
            )
        return fault(payload)

    @handler("bsr.registration")
    def bsr_registration(self, payload: bytes) -> bytes:
        """The KV cache layout every engine instance registered (REGISTER_KV_CACHE)."""
        live = live_registrations(self._transfer_mod, self._ctx.chunk_size)
        return _json(RegistrationReply(live).to_json())

    @handler("bsr.holds")
    def bsr_holds(self, payload: bytes) -> bytes:
        """Whole chunks of a prompt each L2 adapter holds (``server.holds``)."""
        try:
            reply = l2_holds(self._ctx, _payload(payload))
        except Exception as e:  # a raising handler would hang the caller: answer why
            reply = HoldsReply(0, (), f"{type(e).__name__}: {e}")
        return _json(reply.to_json())

    @handler("bsr.markers")
    def bsr_markers(self, payload: bytes) -> bytes:
        return _json(self.markers.reply().to_json())
