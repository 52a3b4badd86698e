"""The running target: restore experiments (ladder, sweep, law) on one serving
``Deployment`` (``bsrctl.stack.contracts.deployment``), launched by bsrctl or attached to the
operator's: seed, forget L1 and vLLM's prefix cache, switch W over ``bsr.configure``, restore,
read the pool's peak and the outcomes, check health. The measure path is the same whoever
started the deployment; what differs (how it comes up, what it reports, how it is let go)
is the deployment's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bsrctl.prompts import expected_external_tokens, prompt_ids, tokens_sha256
from bsrctl.registration.live import live_geometry
from bsrctl.specs import TargetSpec
from bsrctl.stack.contracts.bsr_client import outcomes_since
from bsrctl.stack.contracts.deployment import (
    FOLLOW_UP_MAX_TOKENS,
    FOLLOW_UP_PROMPT_TOKENS,
    Deployment,
    OnDeployment,
)
from bsrctl.stack.contracts.guards import GuardWatch
from bsrctl.stack.contracts.measures import SeedRecord, ServingMeasures, exact_div
from bsrctl.stack.contracts.readback import readback_measures
from bsrctl.stack.contracts.target import Prompt
from bsrctl.stack.launch.model import prepare_model
from bsrctl.stack.measure.canonical_outputs import Reference, canonical_references, divergence
from bsrctl.stack.measure.machine import l1_fits
from bsrctl.stack.measure.seeding import seed_tiers
from bsrkv.lmcache_ext.bsr.protocol import PeakReply, RegistrationReply, RestoreOutcomeSummary
from bsrkv.registration import Registration, first_difference
from bsrkv.settings import RestoreSettings


class RunningTarget(OnDeployment):
    """The measure path on one serving deployment (``self.deployment``; ``self.stack`` and
    ``self.client`` are its ServingClient and bsr.* client while it is up)."""

    def __init__(self, spec: TargetSpec, run_dir: Path, deployment: Deployment) -> None:
        self.spec = spec
        self.deployment = deployment
        self.kind: str = deployment.kind  # "serving" | "attach"
        self.reg: Registration = spec.registration_for(self.kind)
        self.run_dir = Path(run_dir)
        self.window_chunks = 0
        self.readback: bool | None = None  # the module's read-back as set; None: not yet
        self.canonical: dict[Prompt, str] = {}
        self.references: dict[Prompt, Reference] = {}  # ids and logprobs (output check)
        self.vocab = 0
        self.seeded: dict[Prompt, SeedRecord] = {}
        self.stored: dict[Prompt, tuple[str, ...] | None] = {}  # live geometry when stored
        self.on_phase: Callable[[str], None] = lambda _step: None  # seed, forget, restore, check

    @property
    def settings(self) -> RestoreSettings:
        """The deployment's settings; W is switched per point."""
        return self.deployment.settings

    @property
    def live(self) -> RegistrationReply | None:
        return self.deployment.live

    @property
    def deployments(self) -> int:
        return self.deployment.ups

    def prepare(self, prompts: list[Prompt]) -> None:
        """Check the deployment can come up (ports free / endpoints answer), then the
        canonical outputs of every prompt (a connector-less vLLM, cached on disk)."""
        self.deployment.check()
        self.vocab = prepare_model(self.spec.stack.vllm).vocab
        ids = [prompt_ids(salt, n, self.vocab) for salt, n in prompts]
        refs = canonical_references(self.spec.stack, self.run_dir, ids, self.spec.max_tokens)
        self.references = dict(zip(prompts, refs, strict=True))
        self.canonical = {p: tokens_sha256(r.ids) for p, r in self.references.items()}

    @property
    def tier(self) -> str:
        """The L2 tier the restores read (the deployment's)."""
        return self.deployment.tier

    def l1_bytes(self, asked: int) -> int:
        """The L1 a deployment asked for `asked` runs with: launched, `asked`; attached, the
        operator's server's (read when ``prepare`` connected)."""
        got = getattr(self.deployment, "l1_capacity_bytes", None)
        return int(got) if got else asked

    def deploy(self, l1_bytes: int, settings: RestoreSettings) -> None:
        """A deployment with this L1 and these settings: launched, a fresh one; attached,
        the operator's with W, B and timeouts set (its L1 is the operator's)."""
        self.deployment.up(settings, l1_bytes)
        self.window_chunks, self.readback = settings.window_chunks, None  # set at the measure

    def describe(self) -> dict[str, Any]:
        """The evidence's `stack` block: the deployment's, with the registration restored."""
        out = self.deployment.describe() if self.client is not None else {"kind": self.kind}
        return {**out, "registration": self.reg.to_dict()}

    def forget_salt_files(self) -> None:
        """Nothing to bound: a serving deployment's L2 is its own (the storage target removes
        an old salt's files)."""

    def teardown(self) -> None:
        """Let the deployment go (launched: stop by PID; attached: give W, B back)."""
        self.deployment.down()

    def cleanup(self) -> None:
        self.teardown()

    def fits(self, l1_bytes: int) -> tuple[bool, str]:
        return l1_fits(l1_bytes, self.spec.memory_reserve_bytes)

    def live_geometry(self, reply: RegistrationReply | None = None) -> tuple[str, ...] | None:
        """The live registration as ``Registration.geometry()``: of the first engine instance
        (TP rank) whose tensors differ from the expected ones, else of the first instance;
        None when no engine registered with this TP size."""
        reply = reply if reply is not None else self.client.registration()
        want = self.reg.geometry()
        found = [
            live_geometry(self.reg, r.tensors)
            for r in reply.registrations
            if r.world_size == self.reg.tp_size
        ]
        if not found:
            return None
        return next((g for g in found if first_difference(want, g, "live")), found[0])

    def _set_mode(self, window_chunks: int, readback: bool) -> None:
        """W of the next restore and whether it carries the install read-back (the oracle:
        on for an accuracy pass where the run's settings have it, off for a timed one)."""
        if (window_chunks, readback) != (self.window_chunks, self.readback):
            budget = self.settings.admission_budget_chunks if window_chunks else 0
            self.deployment.configure(window_chunks, budget, readback)
            self.window_chunks, self.readback = window_chunks, readback

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
                {
                    "cached_tokens": a.cached_tokens,
                    "held_chunks": a.held[tier],
                    "hidden": list(a.hidden),
                }
                for a in s.attempts
            ),
            seed_s=s.seed_s,
        )

    def measure(
        self, prompt: Prompt, window_chunks: int, cold: bool = True, oracle: bool = True
    ) -> ServingMeasures:
        """One restore point. `cold`: first compute and store the prefix on these engines
        (False when an earlier deployment of the run stored it into the shared L2, or an
        earlier repeat of the point on this deployment did). `oracle`: the install read-back
        on (where the run's settings have it); off, the production path."""
        st, c = self.stack, self.client
        tokens = prompt.tokens
        ids = prompt_ids(prompt.salt, tokens, self.vocab)
        watch = GuardWatch()  # the whole point: seeding, restore, follow-up
        watch.start(c)
        if cold:
            self.on_phase("seed")
        seed = self._seed(ids) if cold else self.seeded.get(prompt)
        if cold and seed is not None:  # a repeat of this point restores it without reseeding
            self.seeded[prompt] = seed
            self.stored[prompt] = self.live_geometry()
        self._set_mode(window_chunks, oracle and self.settings.readback)
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
        m["request_id"] = comp.request_id  # the restore, not the seeding: the report's timeline
        m["readback"] = readback_measures(outcomes, after.config.get("readback"))
        first, gap = divergence(
            comp.output_token_ids, comp.token_logprobs, self.references.get(prompt)
        )
        tol = self.spec.stack.vllm.output_tolerance
        m.update(
            output_first_divergence=first,
            output_max_logprob_gap=gap,
            output_tolerance=None if tol is None else tol.model_dump(),
        )
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
        m["guards"] = tuple(watch.end(c))
        return ServingMeasures(**m, healthy=healthy, health_detail=detail)

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
            "retrieve_s": max(
                (o.retrieve_s for o in outcomes if o.retrieve_s is not None), default=None
            ),
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
        f = self.deployment.follow_up(ids[:FOLLOW_UP_PROMPT_TOKENS], FOLLOW_UP_MAX_TOKENS)
        return f.ok, f.detail
