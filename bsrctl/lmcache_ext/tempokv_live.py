"""TempoKV's controller and provider over LMCache's real StorageManager (the MP server's own,
inside the server module, or an in-process one in tests).

The mechanism is ``bsrctl.tempokv`` unchanged: ``Controller``, ``StagingProvider``, the
policies and estimators. What this module adds is the device under the provider:

- a KV object is one chunk column of a request's prefix (its keys on every TP rank and
  object group), identified by the chunk hash;
- a staging op is a LOCK prefetch of its objects' keys (``LMCacheRestoreStorage.stage``),
  loaded from L2 into L1 and read-locked there: the locks are the pins. LMCache's read
  locks expire after ``read_ttl_seconds``; the server runs with a TTL above the longest
  protection (bsrctl sets it), so no pin lapses under a committed claim;
- an object whose protection ended (its claim released or cancelled, no other committed
  claim protecting it) has its locks dropped with ``finish_read_prefetched``: under the
  ``retain`` prefetch policy it stays in L1 for the stock lookup to find;
- protected bytes are sampled from the objects actually locked, every loop pass, and C is
  the integral of those samples.

Everything runs on one loop thread (``LiveTempo``) under one lock: due timers (the
controller's tick), prefetch completions, pin sync, sampling. Handlers call in under the
same lock. Nothing here blocks on L2: a prefetch is polled with a zero timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lmcache.v1.distributed.api import ObjectKey

from bsrctl.clock import WallClock
from bsrctl.lmcache_ext.storage import LMCacheTicket
from bsrctl.restore.types import RestoreRequest, RowId, RowKeys, Window
from bsrctl.tempokv.claims import ClaimState
from bsrctl.tempokv.controller import Controller, RetrievalGrant
from bsrctl.tempokv.kv import KvObject, Manifest
from bsrctl.tempokv.policies import CAUSAL_POLICIES, Policy, Timed, make_policy
from bsrctl.tempokv.provider import CommitDecision, StagingProvider
from bsrctl.tempokv.ttr import QueueProjectionTtr, RateMeter

LOOP_S = 0.005  # loop pass: prefetch polling, pin sync and the protected-bytes sample


@dataclass(frozen=True, slots=True)
class LiveObject:
    """One chunk column: its key on every row (TP rank, object group)."""

    object_id: str
    keys: tuple[tuple[RowId, ObjectKey, int], ...]  # (row, key, bytes) per row

    @property
    def size_bytes(self) -> int:
        return sum(b for _, _, b in self.keys)

    def kv(self) -> KvObject:
        return KvObject(self.object_id, self.size_bytes)


@dataclass(frozen=True, slots=True)
class LiveConfig:
    policy: str = "tempokv"
    capacity_bytes: int = 64 << 20  # the fast tier the provider models (L1's room for it)
    budget_bytes: int = 32 << 20  # protected-capacity budget
    concurrency: int = 1
    prior_bytes_s: float = 64 << 20  # calibrated staging rate (the shaped L2's)
    static_rate_bytes_s: float | None = None  # TempoKV-Static (default: the prior)
    tick_s: float = 0.05
    chunk_tokens: int = 256

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> LiveConfig:
        unknown = sorted(set(raw) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(
                f"tempokv config: unknown fields {unknown};"
                f" known: {sorted(cls.__dataclass_fields__)}"
            )
        cfg = cls(**raw)
        if cfg.policy not in CAUSAL_POLICIES and not cfg.policy.startswith("queue-"):
            raise ValueError(
                f"tempokv config.policy: {cfg.policy!r};"
                f" live policies: {', '.join(CAUSAL_POLICIES)}"
                " (the oracle needs the run's future: simulation only)"
            )
        return cfg


@dataclass(slots=True)
class _Op:
    ticket: Any  # LMCacheTicket, or the server storage's routed ticket around one
    objects: list[LiveObject]
    size_bytes: int
    start_s: float
    on_done: Callable[[int], None]


@dataclass(frozen=True, slots=True)
class StageRecord:
    op_id: int
    size_bytes: int
    start_s: float
    done_s: float
    missed_objects: int  # not loaded (an L2 miss): the retrieval falls back for them


class LmcStagingDevice:
    """``StagingDevice`` over a StorageManager: an op is a LOCK prefetch of its objects."""

    def __init__(self, storage: Any, now: Callable[[], float], est_bytes_s: float) -> None:
        """`storage`: an ``LMCacheRestoreStorage`` or the server's ``ServerRestoreStorage``."""
        self.storage = storage
        self.now = now
        self.est_bytes_s = est_bytes_s
        self.objects: dict[str, LiveObject] = {}
        self.objects_of: Callable[[int], list[KvObject]] = lambda op_id: []
        self._ops: dict[int, _Op] = {}
        self.locked: dict[str, list[ObjectKey]] = {}  # object -> its read-locked keys
        self.stages: list[StageRecord] = []
        self.chunk_tokens = 256

    def start(self, op_id: int, size_bytes: int, on_done: Callable[[int], None]) -> None:
        objs = [self.objects[o.object_id] for o in self.objects_of(op_id)]
        rows: dict[RowId, list[tuple[ObjectKey, int]]] = {}
        for obj in objs:
            for row, key, nbytes in obj.keys:
                rows.setdefault(row, []).append((key, nbytes))
        request = RestoreRequest(
            f"tempokv-op{op_id}",
            tuple(
                RowKeys(row, tuple(k for k, _ in ks), ks[0][1]) for row, ks in sorted(rows.items())
            ),
            self.chunk_tokens,
        )
        ticket = self.storage.stage(request, Window(0, 0, len(objs)))
        self._ops[op_id] = _Op(ticket, objs, size_bytes, self.now(), on_done)

    def remaining_bytes(self, op_id: int) -> int:
        """The device reports no progress: bytes left at the calibrated rate since start."""
        op = self._ops.get(op_id)
        if op is None:
            return 0
        done = (self.now() - op.start_s) * self.est_bytes_s
        return max(1, int(op.size_bytes - done))

    def poll(self) -> None:
        """Complete every op whose prefetch finished (zero-timeout wait)."""
        for op_id, op in list(self._ops.items()):
            result = self.storage.wait(op.ticket, 0.0)
            if result is None:
                continue
            del self._ops[op_id]
            ticket: LMCacheTicket = getattr(op.ticket, "ticket", op.ticket)
            locked = set(ticket.hit_keys)
            missed = 0
            for obj in op.objects:
                keys = [k for _, k, _ in obj.keys if k in locked]
                if len(keys) < len(obj.keys):
                    missed += 1
                self.locked.setdefault(obj.object_id, []).extend(keys)
            ticket.released = True  # its locks are now held per object, released below
            self.stages.append(StageRecord(op_id, op.size_bytes, op.start_s, self.now(), missed))
            op.on_done(op_id)

    def sync_pins(self, keep: Collection[str]) -> None:
        """Drop the locks of every object no longer protected or pinned."""
        drop = [oid for oid in self.locked if oid not in keep]
        keys = [k for oid in drop for k in self.locked.pop(oid)]
        if keys:
            self.storage.sm.finish_read_prefetched(keys)

    def locked_bytes(self) -> int:
        return sum(self.objects[oid].size_bytes for oid, ks in self.locked.items() if ks)

    def release_all(self) -> None:
        for op in self._ops.values():
            self.storage.release(op.ticket)
        self._ops.clear()
        self.sync_pins(())


class LiveStagingProvider(StagingProvider):
    """The mechanism's provider, plus the TTR estimate at each commitment (for the TTR
    accuracy evidence): computed before committing, from the same queue view; and the
    claim's TTU then (`ttu_of`, the controller's aged estimate; None: none reported), so
    the evidence can tell a TTU error from a TTR error."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ttr = QueueProjectionTtr(self.rate)
        self.ttu_of: Callable[[str], float | None] = lambda _claim_id: None
        # claim -> (t, TTR estimate, TTU estimate)
        self.ttr_at_commit: dict[str, tuple[float, float, float | None]] = {}

    def commit(self, claim_id: str, manifest: Manifest) -> CommitDecision:
        est = self._ttr.ttr_s(self.ttr_query(manifest))
        ttu = self.ttu_of(claim_id)
        decision = super().commit(claim_id, manifest)
        if decision.ok:
            self.ttr_at_commit[claim_id] = (self.clock.now(), est, ttu)
        return decision


@dataclass
class Samples:
    """Protected bytes sampled from the locked objects, and their integral C (byte·s)."""

    at_s: list[float] = field(default_factory=list)
    locked_bytes: list[int] = field(default_factory=list)
    reserved_bytes: list[int] = field(default_factory=list)
    integral_byte_s: float = 0.0
    peak_locked_bytes: int = 0
    peak_reserved_bytes: int = 0
    max_keep: int = 20000

    def add(self, t_s: float, locked: int, reserved: int) -> None:
        if self.at_s:
            self.integral_byte_s += self.locked_bytes[-1] * (t_s - self.at_s[-1])
        self.peak_locked_bytes = max(self.peak_locked_bytes, locked)
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, reserved)
        if len(self.at_s) >= self.max_keep:  # keep the integral exact, thin the trace
            self.at_s, self.locked_bytes = self.at_s[-1:], self.locked_bytes[-1:]
            self.reserved_bytes = self.reserved_bytes[-1:]
        self.at_s.append(t_s)
        self.locked_bytes.append(locked)
        self.reserved_bytes.append(reserved)


class LiveTempo:
    """Controller + provider + device on one loop thread over a StorageManager."""

    def __init__(self, storage: Any, config: LiveConfig) -> None:
        self.config = config
        self.clock = WallClock()
        self.device = LmcStagingDevice(storage, self.clock.now, config.prior_bytes_s)
        self.device.chunk_tokens = config.chunk_tokens
        self.provider = LiveStagingProvider(
            self.clock,
            self.device,
            config.capacity_bytes,
            config.budget_bytes,
            config.concurrency,
            RateMeter(config.prior_bytes_s),
        )
        provider = self.provider
        self.device.objects_of = lambda op_id: provider._ops[op_id].objects
        static = config.static_rate_bytes_s or config.prior_bytes_s
        self.policy: Policy = make_policy(config.policy, provider, static)
        self.controller = Controller(
            self.clock,
            provider,
            self.policy,
            tick_s=config.tick_s,
            crossing_wakeup=self.policy.crossing_wakeup,
        )
        claims = self.controller.claims
        provider.ttu_of = lambda cid: (
            claims[cid].ttu_now(self.clock.now()) if cid in claims else None
        )
        self.samples = Samples()
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._ready_waiters: dict[str, threading.Event] = {}
        self.retrievals: dict[str, str] = {}  # claim -> grant name
        self.retrieval_at: dict[str, float] = {}  # claim -> when its retrieval was demanded
        self._thread = threading.Thread(target=self._loop, name="tempokv-live", daemon=True)
        self._thread.start()

    def _ttu_now(self, claim_id: str) -> float | None:
        claim = self.controller.claims.get(claim_id)
        return None if claim is None else claim.ttu_now(self.clock.now())

    # ---- runtime adapter → controller ------------------------------------------------
    def report(self, claim_id: str, objects: Sequence[LiveObject]) -> None:
        """A new claim: its objects are in L2 (the probe found them); metadata only."""
        with self.lock:
            if claim_id in self.controller.claims:
                return
            for obj in objects:
                self.device.objects.setdefault(obj.object_id, obj)
            kvs = [o.kv() for o in objects]
            self.provider.store(kvs)
            self.controller.report_hit(claim_id, Manifest(tuple(kvs)))
            self._sync()

    def update(self, order: Sequence[str], ttus_s: Mapping[str, float] | None) -> None:
        with self.lock:
            self.controller.update_runtime(order, ttus_s or None, self.clock.now())
            self._sync()

    def cancel(self, claim_id: str) -> None:
        with self.lock:
            claim = self.controller.claims.get(claim_id)
            if claim is not None and claim.state not in (
                ClaimState.RELEASED,
                ClaimState.CANCELLED,
                ClaimState.ORDINARY,
            ):
                self.controller.cancel(claim_id)
            self._sync()

    # ---- retrieval (the server module's lookup / retrieve of the request) --------------
    def begin_retrieval(self, claim_id: str) -> RetrievalGrant | None:
        """Retrieval demanded: commit now or fall back to the ordinary path. None: no claim."""
        with self.lock:
            claim = self.controller.claims.get(claim_id)
            if claim is None or claim.state in (ClaimState.CANCELLED, ClaimState.RELEASED):
                return None
            if claim.state is ClaimState.ORDINARY:
                return RetrievalGrant.ORDINARY
            event = threading.Event()
            self.retrieval_at.setdefault(claim_id, self.clock.now())
            grant = self.controller.request_retrieval(claim_id, event.set)
            if grant is RetrievalGrant.READY:
                event.set()
            self._ready_waiters[claim_id] = event
            self.retrievals[claim_id] = grant.name
            self._sync()
            return grant

    def wait_ready(self, claim_id: str, timeout_s: float) -> bool:
        event = self._ready_waiters.get(claim_id)
        return event is not None and event.wait(timeout_s)

    def end_retrieval(self, claim_id: str) -> None:
        """The transfer to the engine is done: protection on this claim's behalf ends."""
        with self.lock:
            claim = self.controller.claims.get(claim_id)
            self._ready_waiters.pop(claim_id, None)
            if claim is None:
                return
            if claim.state is ClaimState.STAGEREADY:
                self.controller.begin_transfer(claim_id)
            if claim.state is ClaimState.TRANSFERRING:
                self.controller.end_transfer(claim_id)
            self._sync()

    # ---- loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            with self.lock:
                try:
                    self.device.poll()
                    self.clock.run(until_s=self.clock.now())
                    self._sync()
                except Exception:  # a loop error must not kill the server's thread
                    import logging

                    logging.getLogger(__name__).exception("tempokv loop")
            time.sleep(LOOP_S)

    def _sync(self) -> None:  # holds self.lock
        keep = set(self.provider.tier.protect_refs) | set(self.provider.tier.pins)
        self.device.sync_pins(keep)
        self.samples.add(
            self.clock.now(), self.device.locked_bytes(), self.provider.tier.reserved_bytes
        )

    def eta_s(self, claim_ids: Sequence[str]) -> dict[str, float]:
        with self.lock:
            return {c: self.controller.ready_eta_s(c) for c in claim_ids}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        with self.lock:
            self.device.release_all()

    # ---- what the evidence reads ------------------------------------------------------
    def report_json(self) -> dict[str, Any]:
        with self.lock:
            ctl, s = self.controller, self.samples
            ttr = []
            for cid, (t_commit, est, ttu) in self.provider.ttr_at_commit.items():
                claim = ctl.claims[cid]
                ready = [tr.t_s for tr in claim.trace if tr.state is ClaimState.STAGEREADY]
                actual = ready[0] - t_commit if ready else None
                used = self.retrieval_at.get(cid)
                ttr.append(
                    {
                        "claim": cid,
                        "ttr_est_s": round(est, 6),
                        "stage_ready_s": None if actual is None else round(actual, 6),
                        "ttu_est_s": None if ttu is None else round(ttu, 6),
                        "retrieval_s": None if used is None else round(used - t_commit, 6),
                    }
                )
            return {
                "policy": self.policy.name,
                "timed": isinstance(self.policy, Timed),
                "budget_bytes": self.config.budget_bytes,
                "claims": {cid: c.trace_json() for cid, c in ctl.claims.items()},
                "attempts": len(ctl.attempts),
                "deferred_claims": ctl.deferred_claims,
                "retrievals": dict(self.retrievals),
                "c_byte_s": s.integral_byte_s,
                "peak_locked_bytes": s.peak_locked_bytes,
                "peak_reserved_bytes": s.peak_reserved_bytes,
                "samples": len(s.at_s),
                "model_c_byte_s": self.provider.meter.integral_byte_s,
                "stages": [
                    {
                        "op": r.op_id,
                        "bytes": r.size_bytes,
                        "start_s": round(r.start_s, 6),
                        "done_s": round(r.done_s, 6),
                        "missed": r.missed_objects,
                    }
                    for r in self.device.stages
                ],  # fmt: skip
                "ttr": ttr,
                "locked_bytes_now": self.device.locked_bytes(),
            }
