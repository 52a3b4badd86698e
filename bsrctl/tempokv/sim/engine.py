"""A simulated serving engine: FCFS, at most `max_seqs` active sequences, chunked prefill.

A scheduling pass runs at each step boundary: a waiting request is granted a free slot while
the step's token budget is not spent (vLLM walks its waiting queue only while budget
remains), and its retrieval is requested then. It loads its KV while holding that slot:
- asynchronous loads (`EngineLimits.sync_loads` false): the other sequences keep stepping
  and it joins the batch at the first step boundary after its load;
- synchronous loads: the step that carries it waits for its load before computing (a KV
  connector that loads in start_load_kv), so every running sequence stalls meanwhile.
Protection ends when the transfer ends, or (`EngineLimits.release_at_first_step`) when the
first step that computes over the restored KV ends, where the runtime sees the load done.
Both rules are inferred from the paper's Figure 4: its C values imply holds beyond staging
plus transfer that grow as the cached ratio falls, by about one prefill step (Llama 50%:
≈ 1.3 s per request for ≈ 0.36 s of staging and transfer; 100%: ≈ 1.0 s for ≈ 0.74 s), and
TempoKV's throughput is 20.4% above Demand's (Qwen 100%), which needs the batch to wait
for a late load.
Decode-only stretches run as one event (k steps at one step time); an arrival that finds a
free slot, or a finished asynchronous load, cuts the stretch at the next step boundary.
Queued loads (`EngineLimits.queued_loads`) are vLLM's with LMCache's MP connector, which
reports every external hit as an asynchronous load (WAITING_FOR_REMOTE_KVS): a loading
request holds no slot and no token budget, only GPU KV for its prompt, and stays at the head
of the waiting queue; a pass first admits loaded requests in order while slots remain, then,
if a slot is still free, starts loads for every waiting request whose prompt fits the GPU KV
(FCFS, stopping at the first that does not). A pass with a free slot so pre-loads the
whole queue, and early staging buys little: the Figure 4 spec with queued loads (release
at transfer end) puts Immediate's p95 TTFT at 100% only 8.9% (Llama) and 11.7% (Qwen) below
Demand's (paper: 23.1%, 21.3%), and TempoKV's C only 9% and 53% below Immediate's (paper:
63–91%). The paper's stack did not schedule this way, so the shipped specs keep sync loads.
The runtime adapter (``sim/runtime.py``) hears of every scheduling pass and, while requests
wait, of every step boundary inside a decode stretch (``on_iteration``: a runtime's estimates
update each step), and of every arrival (``on_arrival``: a claim carries a TTU from the start)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

from bsrctl.tempokv.sim.workload import Request
from bsrkv.clock import Clock, Timer
from bsrkv.tempokv.controller import Controller, RetrievalGrant
from bsrkv.tempokv.ttu import (
    SAME_S,
    CostModel,
    EngineLimits,
    EngineSnapshot,
    QueuedSeq,
    RunningSeq,
    budget_left,
    prefill_pairs,
)


class EngineMode(IntEnum):
    IDLE = 0  # nothing to step (loads may be in flight)
    PREFILL_STEP = 1  # one step that includes prefill chunks
    DECODE_RUN = 2  # k decode-only steps
    LOAD_WAIT = 3  # synchronous loads: the next step waits for the loads it carries


@dataclass(slots=True)
class RequestLog:
    """What happened to one request, for metrics and traces."""

    req: Request
    retrieval_s: float | None = None  # slot granted, retrieval requested
    admitted_s: float | None = None  # KV on the GPU, joins the batch
    first_token_s: float | None = None
    done_s: float | None = None
    path: str = "none"  # "committed", "ordinary" or "none" (nothing cached)
    transfer_end_s: float | None = None  # fast tier→GPU transfer under way, ends then


@dataclass(slots=True)
class _Seq:
    log: RequestLog
    prefill_left: int
    ctx: int
    generated: int = 0
    computed: bool = False  # a step has computed over its restored KV


class SimEngine:
    def __init__(
        self,
        clock: Clock,
        cost: CostModel,
        limits: EngineLimits,
        retrieval_bytes_s: float,
        controller: Controller | None,
        on_iteration: Callable[[], None] = lambda: None,
        on_complete: Callable[[RequestLog], None] = lambda log: None,
        on_arrival: Callable[[], None] = lambda: None,
    ) -> None:
        self.clock = clock
        self.cost = cost
        self.limits = limits
        self.retrieval_bytes_s = retrieval_bytes_s
        self.controller = controller
        self.on_iteration = on_iteration  # the runtime adapter's hook after each iteration
        self.on_complete = on_complete
        self.on_arrival = on_arrival
        self._unreleased: set[str] = set()  # committed claims kept until their first step
        self.waiting: deque[RequestLog] = deque()
        self.loading: list[RequestLog] = []  # hold a slot, KV on its way
        self.loaded: list[RequestLog] = []  # KV on the GPU, join at the next boundary
        self.running: list[_Seq] = []
        self._held: list[RequestLog] = []  # loading or loaded, in the order loads began
        self.mode = EngineMode.IDLE
        self._run: tuple[float, float, int] = (0.0, 0.0, 0)  # start_s, step_s, k
        self._step_start_s = 0.0
        self._timer: Timer | None = None
        self._iterations: Timer | None = None  # the next step boundary inside a decode run
        self._wake: Timer | None = None  # an idle engine's pass, due now
        self._transfers: dict[str, Timer] = {}  # fast tier→GPU transfers under way

    def _slots_free(self) -> int:
        if self.limits.queued_loads:  # loading requests wait outside the running set
            return self.limits.max_seqs - len(self.running)
        return self.limits.max_seqs - len(self.running) - len(self.loading) - len(self.loaded)

    def holding(self) -> list[RequestLog]:
        """Queued loads: requests loading or loaded, not admitted, in request order (vLLM
        keeps them at the head of its waiting queue)."""
        return list(self._held)

    # ---- inputs -------------------------------------------------------------------------
    def submit(self, log: RequestLog) -> None:
        self.waiting.append(log)
        if self.mode is EngineMode.IDLE:
            self._schedule()
            return
        if self.mode is EngineMode.DECODE_RUN and self._slots_free() > 0:
            self._cut_run()
        self._arm_iterations()
        # The waiting queue changed mid-step: the adapter reports the new order and TTUs
        # now, as a runtime does when it adds a request (else a claim reported while a load
        # or a long decode stretch is under way has no TTU until that ends).
        self.on_arrival()

    # ---- the loop: one scheduling pass per step boundary ----------------------------------
    def _schedule(self) -> None:
        # Loads ending within SAME_S of this pass land at it, as the TTU projection counts them.
        for log in list(self.loading):
            due = self._transfers.get(log.req.req_id)
            if due is not None and due.at_s <= self.clock.now() + SAME_S:
                due.cancel()
                due.fn()
        if self.limits.queued_loads:
            self._grant_queued()
        else:
            self._grant_slots()
        if self.limits.sync_loads and self.loading:
            self.mode = EngineMode.LOAD_WAIT  # the step starts when its loads are done
        elif self.running:
            self._step()
        else:
            self.mode = EngineMode.IDLE
        self.on_iteration()

    def _grant_slots(self) -> None:
        """Loaded requests join; waiting ones take free slots while budget remains."""
        self._join_loaded()
        budget = budget_left([s.prefill_left for s in self.running], self.limits)
        while self._slots_free() > 0 and self.waiting and budget > 0:
            log = self.waiting.popleft()
            budget -= min(budget, max(1, log.req.prompt_tokens - log.req.cached_tokens))
            self._start_load(log)

    def _grant_queued(self) -> None:
        """vLLM's pass with async connector loads: loaded requests are admitted first, in
        order, while slots and token budget remain (one still loading is skipped); then,
        while a slot is still free, every waiting request whose prompt fits the GPU KV starts
        its load without taking a slot or budget."""
        budget = budget_left([s.prefill_left for s in self.running], self.limits)
        for log in self.holding():
            if self._slots_free() <= 0 or budget <= 0:
                break
            if log in self.loaded:
                self.loaded.remove(log)
                budget -= min(budget, self._admit(log))
        kv_cap = self.limits.gpu_kv_tokens
        while self._slots_free() > 0 and self.waiting and budget > 0:
            req = self.waiting[0].req
            if kv_cap and self.kv_tokens() + req.prompt_tokens > kv_cap:
                if not self.running and not self._held:  # it could never be admitted
                    raise ValueError(
                        f"request {req.req_id}: its {req.prompt_tokens}-token prompt exceeds "
                        f"the GPU KV capacity of {kv_cap} tokens"
                    )
                break  # FCFS: vLLM stops at the first request it cannot allocate
            self._start_load(self.waiting.popleft())

    def kv_tokens(self) -> int:
        """GPU KV in use: running sequences' context and unprefilled prompt, and the whole
        prompt of each request whose load has begun."""
        used = sum(s.ctx + s.prefill_left for s in self.running)
        return used + sum(lg.req.prompt_tokens for lg in (*self.loading, *self.loaded))

    def _join_loaded(self) -> None:
        for log in self.loaded:
            self._admit(log)
        self.loaded.clear()

    def _admit(self, log: RequestLog) -> int:
        """Into the batch with its KV on the GPU; returns its prefill tokens."""
        self._held.remove(log)
        req = log.req
        prefill = max(1, req.prompt_tokens - req.cached_tokens)  # ≥ 1: the last token
        self.running.append(_Seq(log, prefill, req.cached_tokens))
        return prefill

    def _start_load(self, log: RequestLog) -> None:
        log.retrieval_s = self.clock.now()
        self.loading.append(log)
        self._held.append(log)
        req = log.req
        ctl = self.controller
        if ctl is None or not req.manifest.objects:
            self.clock.call_later(0.0, lambda: self._loaded(log))
            return
        grant = ctl.request_retrieval(req.req_id, lambda: self._transfer(log))
        if grant is RetrievalGrant.READY:
            self._transfer(log)
        elif grant is RetrievalGrant.ORDINARY:
            log.path = "ordinary"
            ctl.ordinary_read(req.req_id, lambda: self._transfer(log))

    def _transfer(self, log: RequestLog) -> None:
        """Fast tier → GPU. A committed claim is TRANSFERRING until it completes."""
        ctl = self.controller
        assert ctl is not None
        req_id = log.req.req_id
        committed = log.path != "ordinary"
        if committed:
            log.path = "committed"
            ctl.begin_transfer(req_id)

        def done() -> None:
            self._transfers.pop(req_id, None)
            if not committed:
                ctl.end_ordinary(req_id)
            elif self.limits.release_at_first_step:
                self._unreleased.add(req_id)
            else:
                ctl.end_transfer(req_id)
            self._loaded(log)

        transfer_s = log.req.manifest.size_bytes / self.retrieval_bytes_s
        log.transfer_end_s = self.clock.now() + transfer_s
        self._transfers[req_id] = self.clock.call_later(transfer_s, done)

    def _loaded(self, log: RequestLog) -> None:
        self.loading.remove(log)
        log.admitted_s = self.clock.now()
        self.loaded.append(log)
        if self.mode is EngineMode.LOAD_WAIT:
            if not self.loading:  # the waiting step carries its loaded requests, no new pass
                self._join_loaded()
                self._step()
        elif self.mode is EngineMode.IDLE:
            # the pass runs once every load ending at this instant has landed
            if self._wake is None:
                self._wake = self.clock.call_later(0.0, self._on_wake)
        elif self.mode is EngineMode.DECODE_RUN:
            # it joins at the next step boundary (queued loads: only if a slot is free there)
            if not self.limits.queued_loads or self._slots_free() > 0:
                self._cut_run()

    def _on_wake(self) -> None:
        self._wake = None
        if self.mode is EngineMode.IDLE:
            self._schedule()

    def _step(self) -> None:
        decoding = [s for s in self.running if s.prefill_left == 0]
        now_s = self.clock.now()
        if len(decoding) < len(self.running):
            self.mode = EngineMode.PREFILL_STEP
            self._step_start_s = now_s
            step_s = self._prefill_step_s(decoding)
            self._timer = self.clock.call_later(step_s, self._end_prefill_step)
        else:
            k = min(s.log.req.output_tokens - s.generated for s in self.running)
            step_s = self.cost.step_s(len(self.running), 0, sum(s.ctx for s in self.running))
            self.mode = EngineMode.DECODE_RUN
            self._run = (now_s, step_s, k)
            self._timer = self.clock.call_later(k * step_s, lambda: self._end_run(k))
            if self._iterations is not None:  # left from a stretch that was cut short
                self._iterations.cancel()
                self._iterations = None
            self._arm_iterations()

    def _arm_iterations(self) -> None:
        """Inside a decode stretch, an iteration at every step boundary (the adapter's
        estimates update each step, as on a real engine) while claims wait on a timed
        policy: nothing else reads them, and skipping them keeps long traces cheap."""
        ctl = self.controller
        timed = ctl is not None and ctl.policy.needs_ttu and ctl.has_planned()
        armed = self._iterations is not None
        if armed or not timed or self.mode is not EngineMode.DECODE_RUN or not self.waiting:
            return
        start_s, step_s, k = self._run
        j = math.floor((self.clock.now() - start_s) / step_s + 1e-9) + 1
        if j < k:
            self._iterations = self.clock.call_at(start_s + j * step_s, self._on_step_boundary)

    def _on_step_boundary(self) -> None:
        self._iterations = None
        if self.mode is EngineMode.DECODE_RUN and self.clock.now() < self._timer_at():
            self.on_iteration()
            self._arm_iterations()

    def _timer_at(self) -> float:
        return self._timer.at_s if self._timer is not None else -math.inf

    def _prefill_step_s(self, decoding: list[_Seq]) -> float:
        tokens, pairs = self._prefill_work(len(decoding))
        return self.cost.step_s(tokens, pairs, sum(s.ctx for s in decoding))

    def _prefill_work(self, decoding: int) -> tuple[int, int]:
        """Tokens and attention pairs of a step with prefill (chunks within the budget)."""
        budget = self.limits.max_batched_tokens - decoding
        tokens, pairs = decoding, 0
        for s in self.running:
            if s.prefill_left and budget > 0:
                n = min(s.prefill_left, budget)
                budget -= n
                tokens += n
                pairs += prefill_pairs(n, s.ctx)
        return tokens, pairs

    def step_tokens(self) -> int:
        """Tokens of the step in progress (0: none under way)."""
        if self.mode is EngineMode.DECODE_RUN:
            return len(self.running)
        if self.mode is EngineMode.PREFILL_STEP:
            return self._prefill_work(sum(1 for s in self.running if not s.prefill_left))[0]
        return 0

    def _end_prefill_step(self) -> None:
        now_s = self.clock.now()
        budget = self.limits.max_batched_tokens - sum(1 for s in self.running if not s.prefill_left)
        for s in self.running:
            if s.prefill_left == 0:
                s.generated += 1
                s.ctx += 1
            elif budget > 0:
                n = min(s.prefill_left, budget)
                budget -= n
                s.prefill_left -= n
                s.ctx += n
                s.computed = True
                if s.prefill_left == 0:
                    s.generated = 1  # the prefill's last step yields the first token
                    s.log.first_token_s = now_s
        self._release_computed()
        self._finish_done()

    def _release_computed(self) -> None:
        """Committed claims whose KV a finished step computed over: protection ends."""
        if not self._unreleased:
            return
        ctl = self.controller
        assert ctl is not None
        for s in self.running:
            req_id = s.log.req.req_id
            if s.computed and req_id in self._unreleased:
                self._unreleased.discard(req_id)
                ctl.end_transfer(req_id)

    def _end_run(self, k: int) -> None:
        for s in self.running:
            s.generated += k
            s.ctx += k
        self._finish_done()

    def _cut_run(self) -> None:
        """Stop the decode stretch after the step now in progress."""
        start_s, step_s, k = self._run
        done = max(1, math.ceil((self.clock.now() - start_s) / step_s - 1e-9))
        if done >= k or self._timer is None:
            return
        self._timer.cancel()
        self._run = (start_s, step_s, done)
        self._timer = self.clock.call_at(start_s + done * step_s, lambda: self._end_run(done))

    def _finish_done(self) -> None:
        now_s = self.clock.now()
        still = []
        for s in self.running:
            if s.generated >= s.log.req.output_tokens:
                s.log.done_s = now_s
                self.on_complete(s.log)
            else:
                still.append(s)
        self.running = still
        self._schedule()

    # ---- what the runtime adapter reads -------------------------------------------------
    def snapshot(self) -> EngineSnapshot:
        """The engine as of now. busy_s is engine time before the projection's first step:
        the rest of the decode step in progress (counted as done), or minus the elapsed part
        of a prefill step (which the projection then replays). Loading requests are taken as
        about to join (their KV assumed stage-ready)."""
        now_s = self.clock.now()
        done, busy_s = 0, 0.0
        if self.mode is EngineMode.DECODE_RUN:
            start_s, step_s, k = self._run
            done = min(k, math.ceil((now_s - start_s) / step_s - 1e-9))
            busy_s = start_s + done * step_s - now_s
        elif self.mode is EngineMode.PREFILL_STEP:
            busy_s = self._step_start_s - now_s
        seqs = [RunningSeq(s.prefill_left, s.ctx + done, s.generated + done) for s in self.running]
        queued = self.limits.queued_loads
        pending = [
            RunningSeq(
                max(1, log.req.prompt_tokens - log.req.cached_tokens),
                log.req.cached_tokens,
                0,
                self._load_left_s(log, now_s),
            )
            for log in (self.holding() if queued else (*self.loading, *self.loaded))
        ]
        holding = tuple(pending) if queued else ()  # queued loads hold no slot
        seqs.extend(() if queued else pending)
        eta = self.controller.ready_eta_s if self.controller is not None else None
        waiting = tuple(
            QueuedSeq(
                log.req.req_id,
                log.req.prompt_tokens,
                log.req.cached_tokens,
                log.req.manifest.size_bytes / self.retrieval_bytes_s,
                eta(log.req.req_id) if eta is not None else 0.0,
            )
            for log in self.waiting
        )
        return EngineSnapshot(now_s, busy_s, tuple(seqs), waiting, holding)

    def _load_left_s(self, log: RequestLog, now_s: float) -> float:
        """A slot holder's known retrieval dependency: the rest of its transfer, or its pending
        staging / ordinary read (as the controller projects it) plus the transfer; 0 loaded."""
        if log in self.loaded or self.controller is None or not log.req.manifest.objects:
            return 0.0
        if log.transfer_end_s is not None:
            return max(0.0, log.transfer_end_s - now_s)
        transfer_s = log.req.manifest.size_bytes / self.retrieval_bytes_s
        return self.controller.ready_eta_s(log.req.req_id) + transfer_s
