"""TempoKV as a component of the server module: the ``tempokv.*`` methods' logic and the
retrieval hooks (``bsrkv.lmcache_ext.server.hooks.TempoKVHooks``), given to the module by
its factory. What it needs of the module is ``ServerSide``, named here.

Every payload is a record of the TempoKV wire (``bsrkv.tempokv.wire``), read with
``from_json`` (a missing or unknown key is refused, naming it); the module answers
``tempokv.configure`` and ``tempokv.update`` only for a caller holding the control token
(``server.guard``):

- ``tempokv.configure`` ``ConfigureRequest`` -> ``ConfigureReply``: (re)start the
  controller and provider (``tempokv.live.LiveTempo``) over this
  server's StorageManager; ``config: null`` turns TempoKV off. A config whose
  ``chunk_tokens`` is not this server's chunk size is refused, naming both.
- ``tempokv.update`` (the vLLM runtime adapter, ``bsrkv.vllm_ext.scheduler``):
  ``UpdateRequest`` -> ``UpdateReply``. A reported claim's objects come from this
  server's own key derivation and a probe (metadata only: nothing staged or locked).
- ``tempokv.status`` ``{}`` -> ``StatusReply`` (claims' traces, sampled protected bytes
  and C, stages, TTR at commit vs stage-ready), or ``OFF_STATUS``.

Retrieval hooks (the stock path, W = 0): at a request's lookup its claim is asked for
retrieval; READY or ORDINARY go on at once (the stock lookup finds staged objects in L1,
or reads L2 as usual), WAIT holds the lookup (its status answers "not yet", so vLLM keeps
the request waiting) until the committed staging is ready. A lookup that reads L2 itself
(no claim, or ORDINARY) is registered with the provider as an observed ordinary read
(``LiveTempo.observe_stock``), done when its prefetch status reports done. After every
rank's retrieve (the claim's or lookup's world size) the claim's protection and the
observed read end; its end_session cancels a claim still open and ends the read.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import Future
from typing import Any, Protocol

from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey

from bsrkv.hostguard import Guard
from bsrkv.lmcache_ext.bsr.mp_storage import ServerRestoreStorage
from bsrkv.lmcache_ext.tempokv.config import LiveConfig
from bsrkv.lmcache_ext.tempokv.device import LiveObject
from bsrkv.lmcache_ext.tempokv.live import LiveTempo
from bsrkv.tempokv import wire
from bsrkv.tempokv.controller import RetrievalGrant
from bsrkv.trace.spans import server_event_span, server_span

log = logging.getLogger("bsrkv.lmcache_ext.server")

WAIT_READY_MAX_S = 40.0  # a held lookup never outlives vLLM's mq timeout (60 s)


class ServerSide(Protocol):
    """What the component asks of the server module (``server.state.ModuleState``)."""

    @property
    def guard(self) -> Guard: ...

    @property
    def chunk_size(self) -> int: ...

    def count(self, name: str, n: int = 1) -> None: ...

    def counters_with(self, prefix: str) -> dict[str, int]: ...

    def looked_up(self, request_id: str) -> bool:
        """Its lookup (= retrieval start) came already."""
        ...

    def prefetch_storage(self) -> ServerRestoreStorage:
        """A storage over the server's StorageManager whose pins are prefetch read locks."""
        ...

    def key_objects(self, key: IPCCacheServerKey) -> list[LiveObject]:
        """The complete hit prefix of a lookup key (a probe), one chunk column each."""
        ...

    def hold_as_stock(self, key: IPCCacheServerKey) -> None:
        """The request goes the stock path (a status query answers "not yet" while held)."""
        ...

    def stock_lookup(self, key: IPCCacheServerKey, tp_size: int) -> None: ...

    def answer_zero(self, request_id: str) -> None: ...


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, default=str).encode()


def _payload(raw: bytes) -> dict[str, Any]:
    data = json.loads(raw.decode()) if raw else {}
    if not isinstance(data, dict):
        raise ValueError("tempokv.* payloads are JSON objects")
    return data


_OFF_REPLY = _json(wire.UpdateReply.turned_off().to_json())


class TempoKVComponent:
    """TempoKV in one server module: off (``live`` None) until ``tempokv.configure``."""

    def __init__(self, side: ServerSide) -> None:
        self._side = side
        self.live: LiveTempo | None = None
        self._held: dict[str, Future[None]] = {}

    def configure(self, body: bytes) -> bytes:
        try:
            cfg = wire.ConfigureRequest.from_json(_payload(body)).config
            old, self.live = self.live, None
            if old is not None:
                old.close()
            if cfg is None:
                return _json(wire.ConfigureReply(True, None, None).to_json())
            chunk = self._side.chunk_size
            if cfg.chunk_tokens != chunk:
                raise ValueError(
                    f"config.chunk_tokens {cfg.chunk_tokens} is not this server's chunk size "
                    f"{chunk} (--chunk-size): the claims' objects would be the wrong chunks"
                )
            live = LiveConfig.from_json(cfg.to_json())
            # TempoKV's pins are a prefetch's read locks (tempokv.device): staged by LMCache
            self.live = LiveTempo(self._side.prefetch_storage(), live)
            return _json(wire.ConfigureReply(True, cfg, None).to_json())
        except Exception as e:
            return _json(wire.ConfigureReply(False, None, str(e)).to_json())

    def status(self) -> bytes:
        tempo = self.live
        if tempo is None:
            return _json(wire.OFF_STATUS)
        counts = self._side.counters_with("tempokv_")
        # read back through the record: a key the live report renamed fails here, named
        status = wire.StatusReply.from_json({**tempo.report_json(), "reports_dropped": counts})
        log.info("tempokv status (%s): observed stock reads %s", status.policy,
                 json.dumps(status.observed_stock_reads.to_json(), sort_keys=True))  # fmt: skip
        return _json(status.to_json())

    def update(self, body: bytes) -> bytes:
        req = wire.UpdateRequest.from_json(_payload(body))
        tempo = self.live
        if tempo is None:
            return _OFF_REPLY
        # on the server's one request thread, in front of the lookups behind it: its span
        # belongs to the request when it reports that request's claim alone
        attrs: dict[str, Any] = {"claims_reported": len(req.hits)}
        if len(req.hits) == 1:
            attrs["request_id"] = next(iter(req.hits))
        with server_span("tempokv.update", attrs):
            # a controller that fails answers as one turned off: the adapter reads the
            # reply, vLLM's requests go the ordinary path
            return self._side.guard.run("tempokv_update", _OFF_REPLY, self._update, tempo, req)

    def _update(self, tempo: LiveTempo, req: wire.UpdateRequest) -> bytes:
        hit_tokens: dict[str, int] = {}
        for rid, hit in req.hits.items():
            if self._side.looked_up(rid):
                # its lookup (= retrieval start) came first: a claim now could only stage
                # what the ordinary path is already reading
                self._side.count("tempokv_reports_after_lookup")
                continue
            try:
                objects = self._objects(rid, hit)
            except Exception:
                log.exception("tempokv: objects of %s not found: no claim", rid)
                continue
            hit_tokens[rid] = len(objects) * self._side.chunk_size
            if objects:
                tempo.report(rid, objects, hit.world_size)
            else:
                self._side.count("tempokv_reports_no_hit")
        for rid in req.cancel:
            tempo.cancel(rid)
        tempo.update(list(req.order), req.ttus_s or None)
        claimed = [r for r in req.order if r in tempo.controller.claims]
        policy = tempo.policy
        reply = wire.UpdateReply(
            hit_tokens,
            tempo.eta_s(claimed),
            False,
            policy.needs_ttu,
            getattr(policy, "ttu_quantile", None),
        )
        return _json(reply.to_json())

    def _objects(self, rid: str, hit: wire.Hit) -> list[LiveObject]:
        """The claim's objects: the complete hit prefix, one chunk column each."""
        key = IPCCacheServerKey(
            model_name=hit.model_name,
            world_size=hit.world_size,
            worker_id=None,
            token_ids=hit.token_ids,
            start=0,
            end=len(hit.token_ids),
            request_id=rid,
            cache_salt=hit.cache_salt,
            num_kv_readers=hit.world_size,
        )
        return self._side.key_objects(key)

    # ---- hooks the lookup / retrieve handlers call -------------------------------------
    def gate(self, key: IPCCacheServerKey, tp_size: int) -> bool:
        """True when the lookup is held for committed staging (answered later). LMCache's
        own lookup always runs, whatever TempoKV did: a held request is never left without
        one (vLLM would wait on it to its mq timeout). On the flash tier it runs at once,
        beside the staging: every object is an L1 hit there, so it reads no byte, it only
        read-locks them, and the release has only its answer to give; on the DRAM tier it
        runs at the hold's end (it would read L2 beside the staging)."""
        tempo = self.live
        if tempo is None:
            return False
        side = self._side
        rid = key.request_id
        grant = tempo.begin_retrieval(rid)
        if grant is not RetrievalGrant.WAIT:
            return False
        fut: Future[None] = Future()
        held_from = time.time_ns()
        g = side.guard
        early = tempo.config.tier == "dax"

        def look_up() -> None:
            side.stock_lookup(key, tp_size)

        def release() -> None:
            try:
                ready = g.run("tempokv_hold", False, tempo.wait_ready, rid, WAIT_READY_MAX_S)
                # the held lookup on the request's timeline: vLLM sees "not yet" meanwhile
                server_event_span("tempokv.hold", held_from,
                                  {"request_id": rid, "stage_ready": ready})  # fmt: skip
                if not ready:
                    log.warning("tempokv: %s not stage-ready in %ss: lookup goes on", rid,
                                WAIT_READY_MAX_S)  # fmt: skip
                if not early:
                    look_up()
            except Exception:
                log.exception("tempokv: held lookup of %s failed: answering 0 chunks", rid)
                side.answer_zero(rid)
            finally:
                fut.set_result(None)

        # held before its mode says STOCK: a status query in between answers "not yet"
        self._held[rid] = fut
        side.hold_as_stock(key)
        if early:
            try:
                look_up()
            except Exception:
                self._held.pop(rid, None)
                raise  # not held: the caller's stock lookup runs
        try:
            threading.Thread(target=release, name=f"tempokv-hold-{rid}", daemon=True).start()
        except Exception:  # no thread: not held; the caller looks it up unless done here
            self._held.pop(rid, None)
            if early:
                return True  # its lookup ran: answered as the stock path, on demand
            raise
        return True

    def holding(self, request_id: str) -> bool:
        held = self._held.get(request_id)
        return held is not None and not held.done()

    def observe(self, key: IPCCacheServerKey) -> None:
        """The stock lookup of this key reads L2 itself: the provider sees that read."""
        tempo = self.live
        if tempo is None:
            return
        try:
            objects = self._side.key_objects(key)
        except Exception:
            log.exception("tempokv: objects of %s not found: stock read not observed",
                          key.request_id)  # fmt: skip
            return
        if objects:
            tempo.observe_stock(key.request_id, objects, key.world_size)

    def stock_done(self, request_id: str, chunks: int) -> None:
        tempo = self.live
        if tempo is not None:
            tempo.stock_done(request_id, chunks)

    def retrieved(self, request_id: str, rank: int | None) -> None:
        """A rank's retrieve ended: protection may end, on TempoKV's loop, after the
        retrieve's reply went back (munlock and the books are off the request's path)."""
        tempo = self.live
        if tempo is not None:
            tempo.end_retrieval_later(request_id, rank)

    def ended(self, request_id: str) -> None:
        self._held.pop(request_id, None)
        tempo = self.live
        if tempo is not None:
            tempo.end_session(request_id)

    def close(self) -> None:
        live, self.live = self.live, None
        if live is not None:
            live.close()
