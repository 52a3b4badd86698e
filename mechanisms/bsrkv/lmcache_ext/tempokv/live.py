"""TempoKV's controller and provider over LMCache's real StorageManager (the MP server's own,
inside the server module, or an in-process one in tests).

The mechanism is ``bsrkv.tempokv`` unchanged: ``Controller``, ``StagingProvider``, the
policies and estimators. The device under the provider is ``tempokv.device`` (LOCK
prefetches; the locks are the pins), the provider's live additions and the pin sampler are
``tempokv.provider``. What this module adds is the loop that drives them and the stock
lookup's own L2 reads:

- the stock lookup's reads (a request with no claim, or a claim that went ORDINARY) share
  the same device, so each is registered as the provider's ordinary read
  (``observe_stock``): an ORDINARY op the device does NOT perform (the stock lookup does),
  done when the lookup's prefetch is reported done (``stock_done``), so the queue view TTR
  is projected from holds it and its objects become resident in the provider's tier
  through the normal completion path. At the request's retrieve (every rank) or
  end_session the read ends; an op still outstanding then (or after ``STOCK_READ_MAX_S``)
  is removed, or performed by the device if a commitment joined it;
- protected bytes are sampled from the objects actually locked, every loop pass, and C is
  the integral of those samples.

Everything runs on one loop thread (``LiveTempo``) under one lock: due timers (the
controller's tick), prefetch completions, pin sync, sampling. Handlers call in under the
same lock.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from bsrkv.clock import WallClock
from bsrkv.hostguard import Guard
from bsrkv.lmcache_ext.tempokv.config import LiveConfig
from bsrkv.lmcache_ext.tempokv.device import LiveObject, LmcStagingDevice
from bsrkv.lmcache_ext.tempokv.provider import LiveStagingProvider, Samples, StockRead
from bsrkv.tempokv.claims import ClaimState
from bsrkv.tempokv.controller import Controller, RetrievalGrant
from bsrkv.tempokv.kv import Manifest
from bsrkv.tempokv.policies import Policy, Timed, make_policy
from bsrkv.tempokv.ttr import RateMeter

# loop pass: due timers, pin sync and the protected-bytes sample; prefetch polling too, but
# the device wakes the loop at once when a poll may find an op done (``device.wake``)
LOOP_S = 0.005
# An observed stock read whose prefetch was never reported done nor its session ended is
# ended after this long (vLLM's mq timeout is 60 s: no lookup it waits on lasts longer).
STOCK_READ_MAX_S = 60.0


class LiveTempo:
    """Controller + provider + device on one loop thread over a StorageManager."""

    def __init__(
        self, storage: Any, config: LiveConfig, clock: Any = None, loop: bool = True
    ) -> None:
        """`clock`: the wall clock; a test may pass a ``VirtualClock`` (exact estimates) and
        `loop` False: no loop thread, the test calls ``step`` and moves the clock."""
        self.config = config
        self.clock = clock if clock is not None else WallClock()
        if config.tier == "dax":
            from bsrkv.lmcache_ext.tempokv.flash import DaxStagingDevice

            self.device: LmcStagingDevice = DaxStagingDevice(
                storage, self.clock.now, config.prior_bytes_s, config.prior_latency_s,
                budget_bytes=config.budget_bytes,
            )  # fmt: skip
        else:
            self.device = LmcStagingDevice(
                storage, self.clock.now, config.prior_bytes_s, config.prior_latency_s
            )
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
        self.device.objects_of = provider.op_objects
        self.device.kind_of = provider.op_kind
        static = config.static_rate_bytes_s or config.prior_bytes_s
        self.policy: Policy = make_policy(config.policy, provider, static)
        self.controller = Controller(
            self.clock,
            provider,
            self.policy,
            tick_s=config.tick_s,
            crossing_wakeup=self.policy.crossing_wakeup,
        )
        provider.ttu_of = self._ttu_now
        self.samples = Samples()
        self.lock = threading.RLock()
        self.guard = Guard("bsrkv.lmcache_ext.tempokv", logging.getLogger(__name__))
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.device.wake = self._wake.set
        self._ends: deque[tuple[str, int | None]] = deque()  # end_retrieval_later's
        self._ready_waiters: dict[str, threading.Event] = {}
        self.retrievals: dict[str, str] = {}  # claim -> grant name
        self.retrieval_at: dict[str, float] = {}  # claim -> when its retrieval was demanded
        self._world: dict[str, int] = {}  # claim -> TP ranks whose retrieve ends it
        self._retrieved: dict[str, set[int]] = {}  # claim -> ranks whose retrieve came
        self._stock: dict[str, StockRead] = {}  # request -> its observed stock read, open
        self.stock_reads: list[StockRead] = []  # ended
        self._thread: threading.Thread | None = None
        if loop:
            self._thread = threading.Thread(target=self._loop, name="tempokv-live", daemon=True)
            self._thread.start()

    def _ttu_now(self, claim_id: str) -> float | None:
        claim = self.controller.claims.get(claim_id)
        return None if claim is None else claim.ttu_now(self.clock.now())

    # ---- runtime adapter → controller ------------------------------------------------
    def report(self, claim_id: str, objects: Sequence[LiveObject], world_size: int = 1) -> None:
        """A new claim: its objects are in L2 (the probe found them); metadata only. Its
        protection ends once `world_size` ranks retrieved it."""
        with self.lock:
            if claim_id in self.controller.claims:
                return
            self._world[claim_id] = max(1, world_size)
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

    def end_retrieval_later(self, claim_id: str, rank: int | None = None) -> None:
        """``end_retrieval`` at the loop's next pass, woken now: the caller (a retrieve
        handler) answers vLLM without waiting on it."""
        self._ends.append((claim_id, rank))
        self._wake.set()

    def end_retrieval(self, claim_id: str, rank: int | None = None) -> None:
        """One rank's transfer to the engine is done; after every rank's (the claim's
        world size; a call without a rank counts as a new one), protection on this claim's
        behalf ends, and an observed stock read of the request ends."""
        with self.lock:
            stock = self._stock.get(claim_id)
            world = self._world.get(claim_id) or (stock.world_size if stock else 1)
            got = self._retrieved.setdefault(claim_id, set())
            got.add(rank if rank is not None else -1 - len(got))
            if len(got) < world:
                return
            self._retrieved.pop(claim_id, None)
            stock = self._stock.get(claim_id)
            if self.config.tier == "dax" and stock is not None and stock.done_s is None:
                self._finish_stock(stock)  # its faults were the retrieve's: done with it
            self._end_stock(claim_id)
            claim = self.controller.claims.get(claim_id)
            self._ready_waiters.pop(claim_id, None)
            if claim is None:
                self._sync()
                return
            if claim.state is ClaimState.STAGEREADY:
                self.controller.begin_transfer(claim_id)
            if claim.state is ClaimState.TRANSFERRING:
                self.controller.end_transfer(claim_id)
            self._sync()

    # ---- the stock lookup's own L2 reads ------------------------------------------------
    def observe_stock(
        self, request_id: str, objects: Sequence[LiveObject], world_size: int = 1
    ) -> StockRead | None:
        """The stock lookup of `request_id` is about to read its hit objects (`objects`, the
        complete hit prefix) from L2: register an ordinary read on the provider, so an
        ORDINARY op of those neither resident nor in flight joins its queue view. The
        device does not perform it. A claim granted ORDINARY reads as itself (the
        controller's ``ordinary_read``: its manifest); a request with no claim (or a
        cancelled/released one) as ``stock:<id>``. A claim TempoKV serves (READY, WAIT):
        None, its objects are TempoKV's."""
        with self.lock:
            self._end_stock(request_id)  # a repeated lookup: the earlier read ends first
            claim = self.controller.claims.get(request_id)
            ordinary = claim is not None and claim.state is ClaimState.ORDINARY
            if (
                claim is not None
                and not ordinary
                and claim.state
                not in (
                    ClaimState.CANCELLED,
                    ClaimState.RELEASED,
                )
            ):
                return None
            for obj in objects:
                self.device.objects.setdefault(obj.object_id, obj)
            kvs = [o.kv() for o in objects]
            self.provider.store(kvs)
            read_id = request_id if ordinary else f"stock:{request_id}"
            if ordinary:
                ops = self.provider.issued_by(
                    lambda: self.controller.ordinary_read(request_id, lambda: None)
                )
            else:
                ops = self.provider.issued_by(
                    lambda: self.provider.ordinary_read(read_id, Manifest(tuple(kvs)), lambda: None)
                )
            p = self.provider
            sr = StockRead(
                request_id,
                read_id,
                ordinary,
                ops,
                sum(len(p.op_objects(i)) for i in ops),
                sum(p.op_bytes(i) for i in ops),
                self.clock.now(),
                world_size=max(1, world_size),
            )
            self._stock[request_id] = sr
            self.clock.call_later(STOCK_READ_MAX_S, lambda: self._expire(sr))
            self._sync()
            return sr

    def stock_done(self, request_id: str, chunks: int) -> None:
        """The stock lookup's prefetch reported done (`chunks` found): its ops complete
        (the provider's normal completion: objects resident, the rate meter observes). On
        the flash tier the lookup reads nothing (its objects are L1 hits): the read is the
        retrieve's page faults, done when every rank's retrieve ended (``end_retrieval``)."""
        with self.lock:
            sr = self._stock.get(request_id)
            if sr is None or sr.done_s is not None:
                return
            sr.chunks_found = chunks
            if self.config.tier != "dax":
                self._finish_stock(sr)
            self._sync()

    def _finish_stock(self, sr: StockRead) -> None:  # holds self.lock
        sr.done_s, sr.outcome = self.clock.now(), "done"
        # every observed op it waits on, its own or one it joined: the lookup found all its
        # objects, so whoever issued them, they are loaded now
        for op_id in sorted(self.provider.read_pending(sr.read_id)):
            self.device.finish_observed(op_id)

    def end_session(self, request_id: str) -> None:
        """The request is torn down: an open claim is cancelled, a stock read ends."""
        with self.lock:
            self._retrieved.pop(request_id, None)
            self._end_stock(request_id)
            self.cancel(request_id)

    def _expire(self, sr: StockRead) -> None:
        if self._stock.get(sr.request_id) is sr:
            self._end_stock(sr.request_id, expired=True)
            self._sync()

    def _end_stock(self, request_id: str, expired: bool = False) -> None:  # holds self.lock
        """End the read (its pins). An observed op it waited on and no done came for: left
        to another stock read waiting on it (its done completes it), else performed by the
        device if a commitment joined it, else removed."""
        sr = self._stock.pop(request_id, None)
        if sr is None:
            return
        pending = self.provider.read_pending(sr.read_id) | set(sr.ops)
        if sr.claimed:
            self.controller.end_ordinary(sr.read_id)
        else:
            self.provider.end_ordinary(sr.read_id)
        observed = self.device.observed_ops()
        for op_id in sorted(pending & observed):
            commitments, reads = self.provider.waiters(op_id)
            if reads:
                continue
            if commitments:
                self.device.adopt(op_id)
                sr.outcome = "adopted"
            else:
                self.device.drop_observed(op_id)
                self.provider.drop_op(op_id)
                sr.outcome = "expired" if expired else "dropped"
        if sr.outcome == "open":
            sr.outcome = "ended"  # before done, its ops left to another read's lookup
        sr.end_s = self.clock.now()
        self.stock_reads.append(sr)

    # ---- loop ---------------------------------------------------------------------------
    def step(self) -> None:
        """One loop pass: retrievals ended, prefetch completions, due timers, pin sync, the
        sample."""
        with self.lock:
            while self._ends:
                self.end_retrieval(*self._ends.popleft())
            self.device.poll()
            self.clock.run(until_s=self.clock.now())
            self._sync()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before the pass: a wake during it makes the next one at once
            # a loop error must not kill the thread, nor log at every pass (200 a second)
            self.guard.call("tempokv_loop", self.step)
            self._wake.wait(LOOP_S)

    def _sync(self) -> None:  # holds self.lock
        # Locks are protection only: an ordinary read's pins (the stock lookup's) are the
        # model's; that lookup holds its own L1 read locks on what it reads.
        keep = set(self.provider.tier.protect_refs)
        self.device.sync_pins(keep)
        self.samples.add(
            self.clock.now(), self.device.locked_bytes(), self.provider.tier.reserved_bytes
        )

    def eta_s(self, claim_ids: Sequence[str]) -> dict[str, float]:
        with self.lock:
            return {c: self.controller.ready_eta_s(c) for c in claim_ids}

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
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
                "observed_stock_reads": self.stock_json(),
                "locked_bytes_now": self.device.locked_bytes(),
            }

    def stock_json(self) -> dict[str, Any]:
        """The stock lookups' L2 reads the provider observed: ended and still open."""
        with self.lock:
            reads = [r.json() for r in (*self.stock_reads, *self._stock.values())]
            outcomes: dict[str, int] = {}
            for r in reads:
                outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
            return {
                "count": len(reads),
                "bytes": sum(r["bytes"] for r in reads),
                "outcomes": outcomes,
                "reads": reads,
            }
