"""TEST ONLY: deliberately broken builds of the BSR server module, so the failure matrix can
be seen to FAIL ("the matrix can fail"). Never load this in a real deployment.

Loaded instead of ``bsrkv.lmcache_ext.server`` by the failure matrix's own stack
(``FailmatrixStack(..., mutations, mutant_module=MODULE_PATH)``: ``--server-module
'{"module_path": "failmatrix_mutants", "config": {..., "mutations": ["skip_invalidation"]}}'``);
with no mutation it behaves exactly like the real module. ``bsr.mutation``
``{"mutations": [...]}`` switches them at run time.

Importable as the top-level module ``failmatrix_mutants`` from ``MODULE_DIR`` (this folder):
the tests' conftest puts it on ``sys.path``, and the LMCache server process needs it on its
``PYTHONPATH`` (``server_pythonpath()``). Not ``tests.failmatrix...``: a wheel in the venv
ships a top-level ``tests`` package that would shadow this repository's.

Mutations (each breaks one rule of the protocol):

- ``skip_invalidation``: a failed restore answers ok=True, so vLLM takes the destination
  blocks the restore never (or only partly) filled as valid.
- ``partial_after_failure``: after a failed restore, the request's next lookup advertises
  the windows that did complete instead of 0 (a partial prefix, and no force-local).
- ``partial_lookup``: every lookup advertises one chunk fewer than the probe found.
- ``skip_force_local``: a failed restore sets no force-local marker.
- ``ghost_hits``: a probe that finds nothing advertises every whole chunk of the prompt
  (a stale index that outlived its tiers).
- ``guard_failure_once``: the books after the next BSR restore raise once they are kept
  (an extension's own part failing inside the server: its guard counts it, the restore's
  answer stands; ``extensions_healthy`` must name it). Spent at its first use.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.ext_server_module import (
    ExtServerModuleBuildContext,
    server_module_handler,
)
from lmcache.v1.multiprocess.request_handler import HandlerType, request_handler

from bsrkv.lmcache_ext.server import BsrServerModule, ServerModuleConfig
from bsrkv.lmcache_ext.server.markers import RecordingMarkers
from bsrkv.lmcache_ext.server.state import Mode
from bsrkv.restore.types import RestoreOutcome

MODULE_PATH = "failmatrix_mutants"
MODULE_DIR = Path(__file__).resolve().parent


def server_pythonpath() -> str:
    """PYTHONPATH for an LMCache server process that must import MODULE_PATH."""
    rest = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return os.pathsep.join([str(MODULE_DIR), *(p for p in rest if p and p != str(MODULE_DIR))])


MUTATIONS = (
    "skip_invalidation",
    "partial_after_failure",
    "partial_lookup",
    "skip_force_local",
    "ghost_hits",
    "guard_failure_once",
)


def check_mutations(names: Any) -> frozenset[str]:
    if not isinstance(names, list | tuple | set | frozenset):
        raise ValueError(f"mutations must be a list, got {names!r}")
    unknown = sorted(set(names) - set(MUTATIONS))
    if unknown:
        raise ValueError(f"unknown mutation(s) {unknown}; valid: {list(MUTATIONS)}")
    return frozenset(names)


class _MutantMarkers(RecordingMarkers):
    def __init__(self, module: MutantBsrServerModule) -> None:
        super().__init__()
        self._module = module

    def set(self, request_id: str, reason: str) -> None:
        if "skip_force_local" in self._module.mutations:
            return
        super().set(request_id, reason)


class MutantBsrServerModule(BsrServerModule):
    def __init__(self, build_ctx: ExtServerModuleBuildContext, mutations: frozenset[str]) -> None:
        self.mutations = mutations
        self._partial: dict[str, int] = {}  # request -> chunks of its completed windows
        super().__init__(build_ctx)

    def _apply_config(self, cfg: ServerModuleConfig, only_when_idle: bool = False) -> None:
        if not isinstance(self.markers, _MutantMarkers):
            self.markers = _MutantMarkers(self)
        super()._apply_config(cfg, only_when_idle)

    # ---- lookup side ----

    def _probe_lookup(self, key: IPCCacheServerKey) -> int:
        n = super()._probe_lookup(key)
        if n == 0 and "ghost_hits" in self.mutations:
            n = int(key.end) // self._ctx.chunk_size
        if n > 1 and "partial_lookup" in self.mutations:
            n -= 1
        return n

    def _forced(self, request_id: str) -> bool:
        if "partial_after_failure" in self.mutations and request_id in self._partial:
            chunks = self._partial.pop(request_id)
            with self._lock:
                self._modes[request_id] = Mode.BSR
                self._results[request_id] = chunks
            self.markers.on_admitted(request_id)
            return True
        return super()._forced(request_id)

    # ---- transfer side ----

    def _after_restore(self, key: IPCCacheServerKey, outcome: RestoreOutcome, t0: float) -> None:
        super()._after_restore(key, outcome, t0)
        if not outcome.ok and outcome.windows_done:
            self._partial[key.request_id] = outcome.windows_done * self.window_chunks
        if "guard_failure_once" in self.mutations:
            self.mutations = self.mutations - {"guard_failure_once"}
            raise RuntimeError("mutant: the books after a restore raised")

    @request_handler(HandlerType.BLOCKING, requires_client_affinity=True)
    def retrieve(
        self,
        key: IPCCacheServerKey,
        instance_id: int,
        gpu_block_ids: list[list[int]],
        event_ipc_handle: bytes,
        skip_first_n_tokens: int = 0,
    ) -> tuple[bytes, bool]:
        handle, ok = super().retrieve(
            key, instance_id, gpu_block_ids, event_ipc_handle, skip_first_n_tokens
        )
        if not ok and "skip_invalidation" in self.mutations:
            self._count("mutant_failures_reported_ok")
            return handle, True
        return handle, ok

    @server_module_handler("bsr.mutation")
    def bsr_mutation(self, payload: bytes) -> bytes:
        try:
            req = json.loads(payload.decode()) if payload else {}
            if "mutations" in req:
                self.mutations = check_mutations(req["mutations"])
                self._partial.clear()
            return json.dumps({"ok": True, "mutations": sorted(self.mutations)}).encode()
        except Exception as e:
            return json.dumps({"ok": False, "error": str(e)}).encode()


def build_server_modules(ctx: ExtServerModuleBuildContext) -> MutantBsrServerModule:
    cfg = dict(ctx.config or {})
    mutations = check_mutations(cfg.pop("mutations", []))
    return MutantBsrServerModule(dataclasses.replace(ctx, config=cfg), mutations)
