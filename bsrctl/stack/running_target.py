"""The measure path of a running serving deployment (vLLM + LMCache MP server with the BSR
server module, + Mooncake), whoever started it: seed, forget L1 and vLLM's prefix cache,
switch W over ``bsr.configure``, restore, read the pool's peak and the outcomes, check health.

``ServingTarget`` (bsrctl launched the stack) and ``AttachTarget`` (an operator did) differ only
in how they get a running stack (``deploy``), describe it and let go of it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bsrctl.errors import StackFailed
from bsrctl.lmcache_ext.protocol import PeakReply, RegistrationReply, RestoreOutcomeSummary
from bsrctl.prompts import expected_external_tokens, prompt_ids, tokens_sha256
from bsrctl.registration import Registration, first_difference
from bsrctl.settings import RestoreSettings
from bsrctl.specs import TargetSpec
from bsrctl.stack.bsr_client import outcomes_since
from bsrctl.stack.machine import l1_fits
from bsrctl.stack.seeding import seed_tiers
from bsrctl.stack.target import Prompt, RestoreMeasures, SeedRecord, exact_div

HEALTH_PROMPT_TOKENS = 64  # the follow-up request: shorter than any chunk, stores nothing
HEALTH_MAX_TOKENS = 4


class RunningStackTarget:
    """The measure path on a running deployment; subclasses give `deploy`, `describe`,
    `teardown` (``self.stack``: a ServingClient, ``self.client``: its BsrModuleClient)."""

    kind = "serving"

    def __init__(self, spec: TargetSpec, run_dir: Path) -> None:
        self.spec = spec
        self.reg: Registration = spec.registration_for("serving")
        self.run_dir = Path(run_dir)
        self.stack: Any = None
        self.client: Any = None
        self.settings = RestoreSettings()  # of the deployment; W switched per point
        self.window_chunks = 0
        self.canonical: dict[Prompt, str] = {}
        self.vocab = 0
        self.deployments = 0
        self.seeded: dict[Prompt, SeedRecord] = {}
        self.live: RegistrationReply | None = None  # what the engines registered, at deploy
        self.stored: dict[Prompt, tuple[str, ...] | None] = {}  # live geometry when stored
        self.on_phase: Callable[[str], None] = lambda _step: None  # seed, forget, restore, check

    def _model_dir(self) -> Path:
        from bsrctl.stack import tinymodel

        v = self.spec.stack.vllm
        return tinymodel.build() if v.model == "tiny" else Path(v.model)

    def prepare(self, prompts: list[Prompt]) -> None:
        """Canonical outputs of every prompt (a connector-less vLLM, cached on disk)."""
        from bsrctl.stack import tinymodel
        from bsrctl.stack.canonical import canonical_outputs

        self._before_prepare()
        self.vocab = tinymodel.vocab_size(self._model_dir())
        ids = [prompt_ids(salt, n, self.vocab) for salt, n in prompts]
        outs = canonical_outputs(self.spec.stack, self.run_dir, ids, self.spec.max_tokens)
        self.canonical = {p: tokens_sha256(o) for p, o in zip(prompts, outs, strict=True)}

    def _before_prepare(self) -> None:
        """Checks before anything starts (the launched stack: its ports are free)."""

    @property
    def tier(self) -> str:
        """The L2 tier the restores read: FS when the deployment has one, else Mooncake."""
        return "fs" if self.spec.stack.lmcache.fs_l2 else "mooncake"

    def fits(self, l1_bytes: int) -> tuple[bool, str]:
        return l1_fits(l1_bytes, self.spec.memory_reserve_bytes)

    def live_geometry(self, reply: RegistrationReply | None = None) -> tuple[str, ...] | None:
        """The live registration as ``Registration.geometry()``: of the first engine instance
        (TP rank) whose tensors differ from the expected ones, else of the first instance;
        None when no engine registered with this TP size."""
        reply = reply if reply is not None else self.client.registration()
        want = self.reg.geometry()
        found = [
            tuple(f"kv[{t.index}]={list(t.shape)} {t.dtype} g{t.group}" for t in r.tensors)
            for r in reply.registrations
            if r.world_size == self.reg.tp_size
        ]
        if not found:
            return None
        return next((g for g in found if first_difference(want, g, "live")), found[0])

    def _set_window(self, window_chunks: int) -> None:
        if window_chunks != self.window_chunks:
            budget = self.settings.admission_budget_chunks if window_chunks else 0
            self.client.configure(window_chunks=window_chunks, admission_budget_chunks=budget)
            self.window_chunks = window_chunks

    def store(self, prompts: list[Prompt]) -> None:
        """Compute and store each prompt's prefix, wait until its L2 tier holds every whole
        chunk, then empty L1."""
        for p in prompts:
            self.seeded[p] = self._seed(prompt_ids(p.salt, p.tokens, self.vocab))
            self.stored[p] = self.live_geometry()
        self.client.forget(wait_s=120.0)

    def _seed(self, ids: list[int]) -> SeedRecord:
        """Cold request(s) until the L2 tier the restore reads holds all of the prompt's whole
        chunks (per rank), at most SEED_ATTEMPTS. vLLM answers before LMCache has the KV in
        L2: an L1 emptied too early loses the prefix and the point would measure a miss."""
        lm, tier = self.spec.stack.lmcache, self.tier
        s = seed_tiers(
            self.stack,
            self.client,
            ids,
            chunk_tokens=lm.chunk_size,
            tiers=(tier,),
            max_tokens=self.spec.max_tokens,
            forget_first=False,
            forget_wait_s=10.0,
            ranks=self.reg.tp_size,
        )
        return SeedRecord(
            tier=tier,
            chunks=s.chunks,
            held_chunks=s.held[tier],
            attempts=tuple(
                {"cached_tokens": a.cached_tokens, "held_chunks": a.held[tier]} for a in s.attempts
            ),
            seed_s=s.seed_s,
        )

    def measure(self, prompt: Prompt, window_chunks: int, cold: bool = True) -> RestoreMeasures:
        """One restore point. `cold`: first compute and store the prefix on these engines
        (False when an earlier deployment of the run stored it into the shared L2)."""
        st, c = self.stack, self.client
        tokens = prompt.tokens
        ids = prompt_ids(prompt.salt, tokens, self.vocab)
        if cold:
            self.on_phase("seed")
        seed = self._seed(ids) if cold else self.seeded.get(prompt)
        if cold:
            self.stored[prompt] = self.live_geometry()
        self._set_window(window_chunks)
        self.on_phase("forget")
        c.forget(wait_s=120.0)  # L1 emptied first: only the L2 tier can serve
        st.forget_local()  # and vLLM's own prefix cache cannot
        l1_before = c.reset_peak().after.l1_used_bytes
        before = c.status()
        self.on_phase("restore")
        comp = st.complete(ids, self.spec.max_tokens)
        peak = c.peak()
        after = c.status()
        outcomes = outcomes_since(before.recent_outcomes, after.recent_outcomes)
        m = self._measures(prompt, window_chunks, comp, peak, outcomes, l1_before)
        m.update(
            registration_tensors_expected=self.reg.geometry(),
            registration_tensors_live=self.live_geometry(),
            registration_tensors_stored=self.stored.get(prompt),
        )
        m["cold_cached_tokens"] = seed.attempts[0]["cached_tokens"] if cold and seed else None
        if seed is not None:
            m.update(seed_chunks_expected=seed.chunks, seed_chunks_held=seed.held_chunks)
            m["seed"] = seed
        self.on_phase("check")
        healthy, detail = self._health(ids)
        return RestoreMeasures(**m, healthy=healthy, health_detail=detail)

    def _measures(
        self,
        prompt: Prompt,
        w: int,
        comp: Any,
        peak: PeakReply,
        outcomes: list[RestoreOutcomeSummary],
        l1_before: int,
    ) -> dict[str, Any]:
        reg = self.reg
        tokens, chunk = prompt.tokens, reg.chunk_tokens
        bsr = [o for o in outcomes if o.mode == "bsr"]
        peak_bytes = peak.restore_pool_peak_bytes
        by_rank = {str(k): v for k, v in peak.restore_pool_peak_bytes_by_rank.items()}
        if w:
            restored = sum(o.bytes_restored or 0 for o in bsr)
            chunks = sum(o.cached_chunks or 0 for o in bsr)
            bpc = exact_div(restored, chunks)
            read = restored
        else:  # stock whole plan: the gauge accounts the pinned plan; L1 was empty before
            restored = sum(by_rank.values())
            bpc = exact_div(peak_bytes, tokens // chunk) if peak_bytes else None
            read = peak.l1_used_peak_bytes - l1_before
        return {
            "tokens": tokens,
            "window_chunks": w,
            "l1_capacity_bytes": peak.l1_capacity_bytes,
            "restore_pool_peak_bytes": peak_bytes,
            "restore_pool_peak_bytes_by_rank": by_rank,
            "l1_used_peak_bytes": peak.l1_used_peak_bytes,
            "rws_bound_bytes": reg.rws_bound_bytes(w) if w else 0,
            "cached_tokens": comp.cached_tokens,
            "external_hit_tokens": comp.external_hit_tokens,
            "expected_cached_tokens": expected_external_tokens(tokens, chunk),
            "output_sha256": tokens_sha256(comp.output_token_ids),
            "canonical_sha256": self.canonical.get(prompt),
            "ttft_s": round(comp.ttft_s, 4),
            "restore_s": max((o.restore_s for o in outcomes), default=None),
            "bytes_restored": restored,
            "bytes_restored_source": "bsr outcomes" if w else "whole-plan gauge",
            "windows_done": sum(o.windows_done or 0 for o in bsr) if w else None,
            "restore_modes": tuple(sorted({o.mode for o in outcomes})),
            "restore_failures": tuple(str(o.detail) for o in outcomes if not o.ok),
            "tier": self.tier,
            "l1_bytes_before_restore": l1_before,
            "tier_bytes_read": read,
            "bytes_per_chunk_expected": reg.bytes_per_chunk,
            "bytes_per_chunk_measured": bpc,
        }

    def _health(self, ids: list[int]) -> tuple[bool, str]:
        try:
            follow = self.stack.complete(ids[:HEALTH_PROMPT_TOKENS], HEALTH_MAX_TOKENS)
            parts = self.stack.health()
        except StackFailed as exc:
            return False, f"follow-up request failed: {exc}"
        bad = sorted(n for n, h in parts.items() if isinstance(h, dict) and not h.get("healthy"))
        n_out = len(follow.output_token_ids)
        return (
            n_out == HEALTH_MAX_TOKENS and not bad,
            f"follow-up returned {n_out}/{HEALTH_MAX_TOKENS} tokens; unhealthy parts: "
            f"{bad or 'none'}",
        )
