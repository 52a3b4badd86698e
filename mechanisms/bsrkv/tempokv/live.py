"""The live runtime adapter's engine-independent half: from a plain view of a serving
engine's scheduler (running, loading and waiting requests in scan order, slot and token
limits, free KV) to the messages the controller needs: claims for the first K waiting
requests, the waiting order, and TTUs projected with the same `ttu` code the simulation
checks against its engine (queued loads: vLLM's WAITING_FOR_REMOTE_KVS).

Read-only by construction: it takes frozen views and returns messages; the scheduler
subclass (``bsrkv.vllm_ext.scheduler``) builds the views after vLLM decided, and sends
the messages. A simulation drives this same core (the harness's runtime): its
engine builds a view at every iteration, adds its exact state (``EngineState``), and hands
the messages straight to its controller. Updates are sent only when something the
controller reads changed: the claimed set, the order, or a TTU that moved by more than
`ttu_tolerance_s` from the last one sent, aged by the time since (a TTU that merely counts
down is no change); the simulation sets `every_view`, and each view sends."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bsrkv.tempokv.ttu import (
    CostModel,
    EngineLimits,
    EngineSnapshot,
    OutputPredictor,
    QueuedSeq,
    RunningSeq,
    project_ttus,
)
from bsrkv.tempokv.ttu_quantile import project_ttu_quantiles


@dataclass(frozen=True, slots=True)
class LiveRunning:
    req_id: str
    prompt_tokens: int
    computed_tokens: int  # KV on the device after the steps scheduled so far
    output_tokens: int  # outputs the engine has processed
    # outputs the steps in flight (scheduled, output not processed yet) will add: the
    # projection counts them as produced, as it counts those steps' time as busy and their
    # tokens as computed, so no in-flight token is counted twice
    inflight_tokens: int = 0


@dataclass(frozen=True, slots=True)
class LiveWaiting:
    req_id: str
    prompt_tokens: int
    loading: bool = False  # retrieval begun (WAITING_FOR_REMOTE_KVS)


@dataclass(frozen=True, slots=True)
class EngineState:
    """An engine's own exact state, where the engine knows it (the simulated engine does):
    its limits and a snapshot with the step in progress, each load's time left and each
    waiting request's hit and staging ETA. The projection then reads it instead of deriving
    a snapshot from the view's fields (vLLM's scheduler knows none of these: it leaves it
    out, and the core models the step just scheduled and queued loads)."""

    limits: EngineLimits
    snapshot: EngineSnapshot


@dataclass(frozen=True, slots=True)
class LiveView:
    """One scheduler step as decided, taken after the scheduler returned."""

    at_s: float
    step: int
    scheduled: tuple[str, ...]  # request ids given tokens this step, scheduler order
    scheduled_tokens: int
    running: tuple[LiveRunning, ...]
    waiting: tuple[LiveWaiting, ...]  # scan order (block holders first, as vLLM scans)
    max_seqs: int
    max_batched_tokens: int
    free_kv_tokens: int
    engine: EngineState | None = None  # exact state, when the engine knows it
    # steps scheduled before this view's and still in flight, oldest first (vLLM's async
    # scheduling runs one ahead: step N+1 is scheduled while step N computes), and how long
    # the oldest has computed: the engine is busy with their rest before the step just
    # scheduled (zero-token steps compute nothing and are left out)
    ahead_tokens: tuple[int, ...] = ()
    ahead_elapsed_s: float = 0.0


@dataclass(frozen=True, slots=True)
class AdapterSettings:
    k: int = 4  # claims for the first K waiting requests
    needs_ttu: bool = True  # timed policies read TTU; the others only the order
    ttu_quantile: float | None = None  # TempoKV-U
    # a TTU that moved less than this is not sent again, and TTUs are projected at most this
    # often while the claimed set and the order stay the same (each projection and each
    # update cost the engine loop and the server; a change below the controller's tick
    # changes no commitment by more than a tick: serving runs set it to the tick)
    ttu_tolerance_s: float = 0.005
    # send the order and every projected TTU after every view, changed or not: the
    # simulated runtime does (its controller re-evaluates at each engine iteration, at no
    # cost); a live update costs the engine loop a send, so serving runs keep it off
    every_view: bool = False
    # an arrival's claim must reach the controller before vLLM looks the request up (in
    # its next schedule()): add_request waits this long at most for the server's reply
    arrival_ack_s: float = 0.2
    output_limit_tokens: int = 16  # the generation limit (max_tokens) of the workload
    output_prior_tokens: tuple[int, ...] = ()  # calibration completions seeding the TTU
    # predictor before any request finished (the simulation draws them from the spec)
    chunk_tokens: int = 256
    retrieval_bytes_s: float = 1e9  # fast tier → engine, for the projection's load_s
    kv_bytes_per_token: int = 0
    cost: CostModel = field(default_factory=lambda: CostModel(0.01, 0.0, 0.0, 0.0))

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> AdapterSettings:
        data = dict(raw)
        cost = data.pop("cost", None)
        if "output_prior_tokens" in data:
            data["output_prior_tokens"] = tuple(int(n) for n in data["output_prior_tokens"])
        out = cls(**data)
        return replace(out, cost=CostModel(**cost)) if cost is not None else out


@dataclass(frozen=True, slots=True)
class Update:
    """What the controller is told after a step (None fields: unchanged since last sent)."""

    at_s: float
    report: tuple[str, ...]  # new claims (the controller probes their hits)
    cancel: tuple[str, ...]  # claims whose requests left without retrieval
    order: tuple[str, ...]  # the whole waiting order (Queue-K ranks in it)
    ttus_s: dict[str, float]  # projected TTU of each claimed, still-waiting request

    def to_json(self) -> dict[str, Any]:
        return {
            "at_s": round(self.at_s, 6),
            "report": list(self.report),
            "cancel": list(self.cancel),
            "order": list(self.order),
            "ttus_s": {k: round(v, 6) for k, v in self.ttus_s.items()},
        }


class StepCalibrator:
    """Online step cost: the ratio of measured to modelled step time over recent steps,
    applied to the whole cost model (measured in ``update_from_output``)."""

    def __init__(self, cost: CostModel, window: int = 32) -> None:
        self.base = cost
        self._samples: deque[tuple[float, float]] = deque(maxlen=window)

    def observe(self, modelled_s: float, measured_s: float) -> None:
        if modelled_s > 0 and measured_s > 0:
            self._samples.append((modelled_s, measured_s))

    @property
    def scale(self) -> float:
        modelled = sum(m for m, _ in self._samples)
        return sum(s for _, s in self._samples) / modelled if modelled > 0 else 1.0

    def cost(self) -> CostModel:
        k, b = self.scale, self.base
        return CostModel(
            b.step_base_s * k, b.token_s * k, b.attn_pair_s * k, b.decode_ctx_token_s * k
        )


class LiveAdapterCore:
    def __init__(self, settings: AdapterSettings) -> None:
        self.s = settings
        self.predictor = OutputPredictor(settings.output_limit_tokens, settings.output_prior_tokens)
        self.calibrator = StepCalibrator(settings.cost)
        self.claimed: dict[str, int] = {}  # claimed request -> its hit tokens (0: unknown)
        self.settled: set[str] = set()  # claimed, no TTU read any more (``settle``)
        self.eta_s: dict[str, float] = {}  # controller's staging ETA per claim (last reply)
        self._sent_order: tuple[str, ...] | None = None
        self._sent_ttus: dict[str, tuple[float, float]] = {}  # id -> (ttu_s, at_s)
        self.updates_sent = 0
        self.steps_seen = 0
        self.projections = 0
        self._projected_at = -math.inf
        self._seen_queue: tuple[tuple[str, bool], ...] | None = None  # the last view's

    def set_hit(self, req_id: str, hit_tokens: int) -> None:
        if req_id in self.claimed:
            self.claimed[req_id] = hit_tokens

    def settle(self, req_ids: Iterable[str]) -> None:
        """Claimed requests the controller reads no TTU for any more (committed, on the
        ordinary path, or no claim made for want of a hit): none is projected for them, so
        the projection reaches only as far down the queue as an open claim. The simulated
        runtime knows them from its controller; the vLLM scheduler is not told (yet)."""
        self.settled.update(r for r in req_ids if r in self.claimed)

    def quiet(self, queue: tuple[tuple[str, bool], ...], at_s: float) -> bool:
        """Whether a step can change nothing the controller reads, before its view is built:
        its waiting queue (``queue_of``: ids and loading flags, scan order) is the last
        view's, and no TTU projection is due. ``on_step`` would then return None and change
        nothing but the step count (counted here); the caller skips building the view,
        which is most of the adapter's cost on a step (a dozen frozen records)."""
        if self.s.every_view or queue != self._seen_queue:
            return False
        open_claims = any(r not in self.settled for r in self.claimed)
        if self.s.needs_ttu and open_claims and at_s - self._projected_at >= self.s.ttu_tolerance_s:
            return False
        self.steps_seen += 1
        return True

    def on_step(self, view: LiveView) -> Update | None:
        """The step's update, or None when nothing the controller reads changed."""
        self.steps_seen += 1
        return self._observe(view)

    def on_arrival(self, view: LiveView) -> Update | None:
        """The same rule at a request's arrival (the view taken right after vLLM queued
        it, before any schedule() could look it up): a request that arrives among the
        first K waiting is claimed now. With a connector whose loads hold no slot, vLLM
        looks most requests up in the first schedule() after arrival, before any step's
        view shows them waiting."""
        return self._observe(view)

    def _observe(self, view: LiveView) -> Update | None:
        self._seen_queue = queue_of(view.waiting)
        waiting_ids = [w.req_id for w in view.waiting if not w.loading]
        head = waiting_ids[: self.s.k]
        report = tuple(r for r in head if r not in self.claimed)
        for r in report:
            self.claimed[r] = 0
        # a claim leaves the adapter once its request is no longer waiting (retrieval began,
        # or it finished): the controller sees retrieval through the connector's own path
        still_waiting = set(waiting_ids)
        for r in [r for r in self.claimed if r not in still_waiting]:
            del self.claimed[r]
            self.settled.discard(r)
            self._sent_ttus.pop(r, None)
        order = tuple(w.req_id for w in view.waiting)
        ttus: dict[str, float] = {}
        every = self.s.every_view
        due = (
            every
            or report
            or order != self._sent_order
            or view.at_s - self._projected_at >= self.s.ttu_tolerance_s
        )
        targets = [r for r in self.claimed if r not in self.settled]
        if self.s.needs_ttu and targets and due:
            ttus = self._project(view, targets)
            self.projections += 1
            self._projected_at = view.at_s
        changed_ttus = {
            r: t
            for r, t in ttus.items()
            if every
            or r not in self._sent_ttus
            or abs(t - (self._sent_ttus[r][0] - (view.at_s - self._sent_ttus[r][1])))
            > self.s.ttu_tolerance_s
        }
        if not every and not report and order == self._sent_order and not changed_ttus:
            return None
        self._sent_order = order
        for r, t in changed_ttus.items():
            self._sent_ttus[r] = (t, view.at_s)
        self.updates_sent += 1
        return Update(view.at_s, report, (), order, changed_ttus)

    def on_finished(self, req_ids: Sequence[str], output_tokens: Sequence[int]) -> Update | None:
        """Requests that ended (finished, aborted): their claims are cancelled; finished
        outputs calibrate the output predictor."""
        for n in output_tokens:
            self.predictor.observe(n)
        gone = tuple(r for r in req_ids if r in self.claimed)
        for r in gone:
            del self.claimed[r]
            self.settled.discard(r)
            self._sent_ttus.pop(r, None)
        if not gone:
            return None
        self.updates_sent += 1
        return Update(0.0, (), gone, self._sent_order or (), {})

    def _project(self, view: LiveView, targets: list[str]) -> dict[str, float]:
        cost = self.calibrator.cost()
        exact = view.engine
        if exact is None:
            snap, limits = self._snapshot(view, cost)
        else:
            snap, limits = exact.snapshot, exact.limits
        if self.s.ttu_quantile is None:
            return project_ttus(snap, cost, limits, self.predictor, targets)
        return project_ttu_quantiles(
            snap, cost, limits, self.predictor, self.s.ttu_quantile, targets
        )

    def _snapshot(self, view: LiveView, cost: CostModel) -> tuple[EngineSnapshot, EngineLimits]:
        """The engine as the view shows it: queued loads (vLLM's WAITING_FOR_REMOTE_KVS),
        the hits and ETAs the controller replied, the step just scheduled modelled with
        the calibrated cost."""
        limits = EngineLimits(
            max_seqs=view.max_seqs,
            max_batched_tokens=view.max_batched_tokens,
            sync_loads=False,
            queued_loads=True,
            gpu_kv_tokens=view.free_kv_tokens + sum(r.computed_tokens for r in view.running),
        )
        running = tuple(
            RunningSeq(
                max(0, r.prompt_tokens - r.computed_tokens),
                r.computed_tokens,
                r.output_tokens + r.inflight_tokens,
            )
            for r in view.running
        )
        holding = tuple(
            RunningSeq(max(1, w.prompt_tokens - self._hit(w)), self._hit(w), 0)
            for w in view.waiting
            if w.loading
        )
        waiting = tuple(
            QueuedSeq(
                w.req_id,
                w.prompt_tokens,
                self._hit(w),
                self._hit(w) * self.s.kv_bytes_per_token / self.s.retrieval_bytes_s,
                self.eta_s.get(w.req_id, 0.0),
            )
            for w in view.waiting
            if not w.loading
        )
        return EngineSnapshot(view.at_s, busy_s(view, cost), running, waiting, holding), limits

    def _hit(self, w: LiveWaiting) -> int:
        hit = self.claimed.get(w.req_id, 0)
        return min(hit, max(0, w.prompt_tokens - 1))


def queue_of(waiting: Iterable[LiveWaiting]) -> tuple[tuple[str, bool], ...]:
    """A waiting queue as ``LiveAdapterCore.quiet`` compares it."""
    return tuple((w.req_id, w.loading) for w in waiting)


def busy_s(view: LiveView, cost: CostModel) -> float:
    """Engine time committed before the projection's first pass: the rest of the steps in
    flight ahead of the view's (the oldest has run ``ahead_elapsed_s``), then the step just
    scheduled, each at its modelled cost."""
    ahead = [cost.step_s(n, 0, 0) for n in view.ahead_tokens]
    if ahead:
        ahead[0] = max(0.0, ahead[0] - view.ahead_elapsed_s)
    now = cost.step_s(view.scheduled_tokens, 0, 0) if view.scheduled else 0.0
    return sum(ahead) + now
