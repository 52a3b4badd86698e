"""The simulated runtime's adapter: the live adapter's core (``tempokv.live``) driven by the
simulated engine. After every engine iteration (scheduling pass, arrival, step boundary
inside a decode stretch) the engine is taken as the same frozen ``LiveView`` vLLM's
scheduler builds, plus its exact state (``EngineState``: the simulated engine knows the step
in progress, each load's time left, each waiting request's hit and staging ETA), and
``LiveAdapterCore`` decides what the controller is told. Its updates go straight to the
controller, as the server's ``tempokv.update`` handler applies one, without the wire.

The sim's settings (``adapter_settings``) are explicit, from the run's inputs: K covers the
whole trace (every waiting request is claimed: the trace's hits, which its events report at
``hit_s``, are all known to the controller), and ``every_view`` sends the order and every TTU
after every iteration (the simulated controller re-evaluates at each one)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bsrctl.tempokv.sim.device import DeviceConfig
from bsrctl.tempokv.sim.engine import RequestLog, SimEngine
from bsrctl.tempokv.sim.models import ModelProfile
from bsrctl.tempokv.sim.workload import Request
from bsrkv.tempokv.controller import Controller
from bsrkv.tempokv.live import (
    AdapterSettings,
    EngineState,
    LiveAdapterCore,
    LiveRunning,
    LiveView,
    LiveWaiting,
    Update,
)
from bsrkv.tempokv.policies import Policy


def adapter_settings(
    policy: Policy,
    model: ModelProfile,
    device: DeviceConfig,
    output_limit_tokens: int,
    output_prior_tokens: tuple[int, ...],
    requests: int,
) -> AdapterSettings:
    """The adapter as the simulated runtime runs it (module docstring)."""
    return AdapterSettings(
        k=max(1, requests),
        needs_ttu=policy.needs_ttu,
        ttu_quantile=getattr(policy, "ttu_quantile", None),
        ttu_tolerance_s=0.0,
        every_view=True,
        output_limit_tokens=output_limit_tokens,
        output_prior_tokens=output_prior_tokens,
        retrieval_bytes_s=device.retrieval_bytes_s,
        kv_bytes_per_token=model.kv_bytes_per_token,
        cost=model.cost,
    )


class SimRuntime:
    """The engine's hooks (``on_iteration``, ``on_arrival``, ``on_complete``) → the core →
    the controller."""

    def __init__(
        self,
        engine: SimEngine,
        controller: Controller,
        settings: AdapterSettings,
        requests: Sequence[Request],
    ) -> None:
        self.engine = engine
        self.controller = controller
        self.core = LiveAdapterCore(settings)
        self._requests: Mapping[str, Request] = {r.req_id: r for r in requests}
        self._step = 0

    # ---- the engine's hooks -----------------------------------------------------------
    def on_iteration(self) -> None:
        self._step += 1
        self._settle()
        self.apply(self.core.on_step(self.view()))

    def on_arrival(self) -> None:
        self._settle()
        self.apply(self.core.on_arrival(self.view()))

    def on_complete(self, log: RequestLog) -> None:
        self.apply(self.core.on_finished([log.req.req_id], [log.req.output_tokens]))

    # ---- the core's messages, straight to the controller --------------------------------
    def apply(self, update: Update | None) -> None:
        """What ``tempokv.update`` does with an update: claims for reported requests (the
        trace's events reported every hit before its request arrived, so these are known),
        their hit tokens back to the core, cancellations, then the order and TTUs. The
        staging ETAs the server replies are in the engine's exact state already."""
        if update is None:
            return
        ctl = self.controller
        for rid in update.report:
            manifest = self._requests[rid].manifest
            if manifest.objects and rid not in ctl.claims:
                ctl.report_hit(rid, manifest)
            self.core.set_hit(rid, self._requests[rid].cached_tokens if manifest.objects else 0)
        for rid in update.cancel:
            ctl.cancel(rid)
        ctl.update_runtime(update.order, update.ttus_s, update.at_s)

    def _settle(self) -> None:
        """Claims the controller no longer plans (committed, ordinary, or never made: no
        hit) need no TTU: the projection stops at the last one it still plans."""
        planned = self.controller.planned_ids()
        core = self.core
        settled = [r for r in core.claimed if r not in planned and r not in core.settled]
        if settled:
            core.settle(settled)

    # ---- the engine as a view -----------------------------------------------------------
    def view(self) -> LiveView:
        """The engine now, as vLLM's scheduler view shows one: the sequences in the step in
        progress, the waiting queue in scan order (queued loads: the loading requests at
        its head), slot and token limits, free GPU KV; and its exact state when the core
        projects TTUs."""
        eng, limits = self.engine, self.engine.limits
        held = eng.holding()
        queued = limits.queued_loads
        running = [
            LiveRunning(s.log.req.req_id, s.log.req.prompt_tokens, s.ctx, s.generated)
            for s in eng.running
        ]
        if not queued:  # a load holds its slot: a running sequence with its KV on the way
            running += [
                LiveRunning(lg.req.req_id, lg.req.prompt_tokens, lg.req.cached_tokens, 0)
                for lg in held
            ]
        loading = [LiveWaiting(lg.req.req_id, lg.req.prompt_tokens, True) for lg in held]
        waiting = (loading if queued else []) + [
            LiveWaiting(lg.req.req_id, lg.req.prompt_tokens) for lg in eng.waiting
        ]
        # the exact state costs a snapshot: taken only when the core will project, i.e. a
        # waiting request's claim is still planned (K covers the queue: every waiting
        # request is claimed, and only claims no longer planned are settled)
        planned = self.controller.planned_ids()
        projects = self.core.s.needs_ttu and any(lg.req.req_id in planned for lg in eng.waiting)
        exact = EngineState(limits, eng.snapshot()) if projects else None
        kv_cap, tokens = limits.gpu_kv_tokens, eng.step_tokens()
        return LiveView(
            at_s=eng.clock.now(),
            step=self._step,
            scheduled=tuple(s.log.req.req_id for s in eng.running) if tokens else (),
            scheduled_tokens=tokens,
            running=tuple(running),
            waiting=tuple(waiting),
            max_seqs=limits.max_seqs,
            max_batched_tokens=limits.max_batched_tokens,
            free_kv_tokens=max(0, kv_cap - eng.kv_tokens()) if kv_cap else 0,
            engine=exact,
        )
