"""TempoKV inside the server module: the ``tempokv.*`` methods and the retrieval hooks.

- ``tempokv.configure`` ``{LiveConfig fields}`` -> ``{"ok", "config" | "error"}``: (re)start
  the controller and provider (``bsrctl.lmcache_ext.tempokv_live.LiveTempo``) over this
  server's StorageManager; ``{"policy": null}`` turns TempoKV off.
- ``tempokv.update`` (the vLLM runtime adapter, ``bsrctl.vllm_ext.scheduler``):
  ``{"report": [ids], "hits": {id: {"token_ids", "cache_salt", "model_name",
  "world_size"}}, "cancel": [ids], "order": [ids], "ttus_s": {id: s}}`` ->
  ``{"hit_tokens": {id: n}, "eta_s": {id: s}}``. A reported claim's objects come from this
  server's own key derivation and a probe (metadata only: nothing staged or locked).
- ``tempokv.status`` ``{}`` -> the live report (claims' traces, sampled protected bytes and
  C, stages, TTR at commit vs stage-ready).

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
import threading
from concurrent.futures import Future
from dataclasses import asdict
from typing import Any

from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.ext_server_module import server_module_handler

from bsrctl.lmcache_ext.mp_storage import ServerRestoreStorage
from bsrctl.lmcache_ext.server.state import Mode, ModuleState, log
from bsrctl.lmcache_ext.tempokv_device import LiveObject
from bsrctl.lmcache_ext.tempokv_live import LiveConfig, LiveTempo
from bsrctl.tempokv.controller import RetrievalGrant

WAIT_READY_MAX_S = 40.0  # a held lookup never outlives vLLM's mq timeout (60 s)


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, default=str).encode()


def _payload(raw: bytes) -> dict[str, Any]:
    data = json.loads(raw.decode()) if raw else {}
    if not isinstance(data, dict):
        raise ValueError("tempokv.* payloads are JSON objects")
    return data


class TempoKVHandlers(ModuleState):
    _tempo: LiveTempo | None = None
    _tempo_held: dict[str, Future[None]]

    def _tempo_init(self) -> None:
        if not hasattr(self, "_tempo_held"):
            self._tempo_held = {}

    @server_module_handler("tempokv.configure")
    def tempokv_configure(self, payload: bytes) -> bytes:
        self._tempo_init()
        try:
            req = _payload(payload)
            old, self._tempo = self._tempo, None
            if old is not None:
                old.close()
            if req.get("policy", "") is None:
                return _json({"ok": True, "config": None})
            cfg = LiveConfig.from_json(req)
            storage = ServerRestoreStorage(self._sm, self._layouts_of)
            self._tempo = LiveTempo(storage, cfg)
            return _json({"ok": True, "config": asdict(cfg)})
        except Exception as e:
            return _json({"ok": False, "error": str(e)})

    @server_module_handler("tempokv.status")
    def tempokv_status(self, payload: bytes) -> bytes:
        tempo = self._tempo
        if tempo is None:
            return _json({"policy": None})
        with self._lock:
            counts = {k: v for k, v in self._counters.items() if k.startswith("tempokv_")}
        report = tempo.report_json()
        seen = report["observed_stock_reads"]
        log.info("tempokv status (%s): observed stock reads %s", report["policy"],
                 json.dumps(seen, sort_keys=True))  # fmt: skip
        return _json({**report, "reports_dropped": counts})

    @server_module_handler("tempokv.update")
    def tempokv_update(self, payload: bytes) -> bytes:
        tempo = self._tempo
        if tempo is None:
            return _json({"hit_tokens": {}, "eta_s": {}, "off": True})
        req = _payload(payload)
        hit_tokens: dict[str, int] = {}
        for rid, hit in (req.get("hits") or {}).items():
            with self._lock:
                looked_up = rid in self._modes
            if looked_up:
                # its lookup (= retrieval start) came first: a claim now could only stage
                # what the ordinary path is already reading
                self._count("tempokv_reports_after_lookup")
                continue
            try:
                objects = self._tempo_objects(rid, hit)
            except Exception:
                log.exception("tempokv: objects of %s not found: no claim", rid)
                continue
            hit_tokens[rid] = len(objects) * self._ctx.chunk_size
            if objects:
                tempo.report(rid, objects, int(hit["world_size"]))
            else:
                self._count("tempokv_reports_no_hit")
        for rid in req.get("cancel") or ():
            tempo.cancel(rid)
        tempo.update(list(req.get("order") or ()), req.get("ttus_s") or None)
        claimed = [r for r in req.get("order") or () if r in tempo.controller.claims]
        policy = tempo.policy
        return _json(
            {
                "hit_tokens": hit_tokens,
                "eta_s": tempo.eta_s(claimed),
                "needs_ttu": policy.needs_ttu,
                "ttu_quantile": getattr(policy, "ttu_quantile", None),
            }
        )

    def _tempo_objects(self, rid: str, hit: dict[str, Any]) -> list[LiveObject]:
        """The claim's objects: the complete hit prefix, one chunk column each."""
        model, world = str(hit["model_name"]), int(hit["world_size"])
        tokens = [int(t) for t in hit["token_ids"]]
        key = IPCCacheServerKey(
            model_name=model,
            world_size=world,
            worker_id=None,
            token_ids=tuple(tokens),
            start=0,
            end=len(tokens),
            request_id=rid,
            cache_salt=str(hit.get("cache_salt", "")),
            num_kv_readers=world,
        )
        return self._tempo_key_objects(key)

    def _tempo_key_objects(self, key: IPCCacheServerKey) -> list[LiveObject]:
        """The complete hit prefix of a lookup key (probe: metadata only), one chunk column
        each; a claim's and a lookup's objects of one document share their ids."""
        model = key.model_name
        attn_desc = self._ctx.layout_desc_registry.find_attn_desc(model, key.world_size)
        hashes = self._ctx.token_hasher.compute_chunk_hashes(list(key.token_ids), end=key.end)
        if not hashes:
            return []
        request = self._lookup_request(key, hashes, attn_desc)  # type: ignore[attr-defined]
        plan = self.restorer.probe(request)
        return [
            LiveObject(
                f"{model}/{hashes[j].hex()}",
                tuple((r.row, r.keys[j], r.chunk_bytes) for r in request.rows),
            )
            for j in range(plan.prefix_chunks)
        ]

    # ---- hooks the lookup / retrieve handlers call -------------------------------------
    def _tempo_gate(self, key: IPCCacheServerKey, tp_size: int) -> bool:
        """True when the lookup is held for committed staging (answered later)."""
        tempo = self._tempo
        if tempo is None:
            return False
        self._tempo_init()
        rid = key.request_id
        grant = tempo.begin_retrieval(rid)
        if grant is not RetrievalGrant.WAIT:
            return False
        with self._lock:
            self._modes[rid] = Mode.STOCK
            self._stock_keys[rid] = key
        fut: Future[None] = Future()
        self._tempo_held[rid] = fut

        def release() -> None:
            try:
                if not tempo.wait_ready(rid, WAIT_READY_MAX_S):
                    log.warning("tempokv: %s not stage-ready in %ss: lookup goes on", rid,
                                WAIT_READY_MAX_S)  # fmt: skip
                self._count("lookups_stock")
                self._lookup_mod.lookup(key, tp_size)
            finally:
                fut.set_result(None)

        threading.Thread(target=release, name=f"tempokv-hold-{rid}", daemon=True).start()
        return True

    def _tempo_holding(self, request_id: str) -> bool:
        held = getattr(self, "_tempo_held", {}).get(request_id)
        return held is not None and not held.done()

    def _tempo_observe(self, key: IPCCacheServerKey) -> None:
        """The stock lookup of this key reads L2 itself: the provider sees that read."""
        tempo = self._tempo
        if tempo is None:
            return
        try:
            objects = self._tempo_key_objects(key)
        except Exception:
            log.exception("tempokv: objects of %s not found: stock read not observed",
                          key.request_id)  # fmt: skip
            return
        if objects:
            tempo.observe_stock(key.request_id, objects, key.world_size)

    def _tempo_stock_done(self, request_id: str, chunks: int) -> None:
        tempo = self._tempo
        if tempo is not None:
            tempo.stock_done(request_id, chunks)

    def _tempo_retrieved(self, request_id: str, rank: int | None = None) -> None:
        tempo = self._tempo
        if tempo is not None:
            tempo.end_retrieval(request_id, rank)

    def _tempo_ended(self, request_id: str) -> None:
        getattr(self, "_tempo_held", {}).pop(request_id, None)
        tempo = self._tempo
        if tempo is not None:
            tempo.end_session(request_id)
