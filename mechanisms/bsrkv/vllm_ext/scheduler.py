"""The TempoKV runtime adapter inside vLLM, with no fork: a ``--scheduler-cls`` subclass.

    vllm ... --scheduler-cls bsrkv.vllm_ext.scheduler.TempoKVScheduler        (CPU: sync)
    vllm ... --scheduler-cls bsrkv.vllm_ext.scheduler.TempoKVAsyncScheduler   (GPU default)

(the launch names the class matching vLLM's scheduling: ``stack.extensions``).

Configured by the environment variable ``BSRKV_TEMPOKV``, since ``--scheduler-cls`` takes
only a class: the wire's ``AdapterEnv`` (``adapter``, every ``AdapterSettings`` field;
``trace_path``, a JSON-lines file of every step's decision and message; ``transport``:
``"connector"``, the LMCacheMPConnector's ``server_module_call``, or ``"record"``), read
with unknown and missing keys refused. Updates and replies are the wire's records too.

After ``super().schedule()`` decided, it reads the scheduler (waiting queues in scan
order, running requests' computed and output tokens, slot and token limits, free KV
blocks) into a frozen ``LiveView`` and sends what ``LiveAdapterCore`` says changed. In
``add_request`` it applies the same rule to the arriving request before any schedule()
can look it up (that lookup starts the retrieval, and the server drops a claim reported
after it). A new claim's reply must be back before that lookup, so the next schedule() that
may look a waiting request up (a running slot free: vLLM's waiting loop stops at
``max_num_active_reqs`` before any lookup) first waits for it, up to ``arrival_ack_s`` after
its send; while the slots are full nothing waits, and the reply is usually back before one
frees (the engine loop pays no round trip per arrival under load). In
``update_from_output`` it measures the step; in ``_free_request`` it learns outputs and
cancels claims of requests that end. It never writes scheduler state and swallows its own
errors (counted in the trace), so it cannot change what the scheduler decides; the
on/off test checks that.

Under async scheduling vLLM's engine schedules step N+1 before it processes step N's
output (a two-deep batch queue): a view then has two steps in flight. Their tokens are
computed already (vLLM advances ``num_computed_tokens`` at schedule time), their outputs
are the async scheduler's placeholders, and the older one's rest is busy time ahead of
the newer one: the view carries all three, so the projection counts each in-flight token
once. A step that scheduled nothing calibrates nothing. The same rule holds for the sync
scheduler, whose only step in flight is the one just scheduled.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from bsrkv.hostsurface import require

# before vLLM's names are imported: one missing is refused in one line naming it
require("bsrkv.vllm_ext")

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

from bsrkv.tempokv import wire  # noqa: E402
from bsrkv.tempokv.live import LiveAdapterCore, LiveRunning, LiveView, LiveWaiting  # noqa: E402
from bsrkv.vllm_ext.recorder import ENV, StepRecorder, adapter_env  # noqa: E402
from bsrkv.vllm_ext.step_trace import traced  # noqa: E402
from bsrkv.vllm_ext.transport import Pending, RecordTransport, ServerModuleTransport, Transport  # noqa: E402

UPDATE_METHOD = wire.UPDATE
SCHEDULED_KEPT = 16  # steps kept until their output (vLLM keeps at most 2 in flight)
UNACKED_KEPT = 1024  # arrival claims awaiting their reply (a server that never answers)


class TempoKVAdapter(StepRecorder):
    """The mixin: read-only hooks around the scheduler's own methods. Each hook calls
    vLLM's method first and returns what it returned; the adapter's part runs after it,
    under the guard, and only once ``__init__`` completed (``_tk_on``: a hook vLLM calls
    before then, or after the adapter's start failed, is vLLM's alone)."""

    _tk_clock: Callable[[], float] = staticmethod(time.monotonic)  # a test's own clock
    _tk_on = False
    _tk_errors = 0  # failures of the adapter's parts (each an ``adapter_error`` record)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = adapter_env()
        if cfg.adapter is None:
            raise ValueError(f"{ENV}.adapter is null: the TempoKV scheduler needs its settings")
        self._bk_guard.on_failure = self._tk_fail
        self._tk_on = self._bk_guard.run("init", False, self._tk_start, cfg)

    def _tk_start(self, cfg: wire.AdapterEnv) -> bool:
        assert cfg.adapter is not None
        self._tk = LiveAdapterCore(cfg.adapter)
        self._tk_transport_kind = cfg.transport
        self._tk_transport: Transport | None = None
        self._tk_t0 = self._tk_clock()
        # [out, at, modelled, adapter_s, pass]: adapter_s is what the adapter's own pass
        # after schedule() cost the engine loop (TTU projection, sends), measured; pass is
        # what that pass did: "quiet" (no view), "view" (a view, nothing to send), "sent"
        # (bounded: a step whose output never came, or a failing measure, cannot pile up)
        self._tk_scheduled: deque[list[Any]] = deque(maxlen=SCHEDULED_KEPT)
        self._tk_last_done = 0.0
        self._tk_prev_ids: set[str] = set()
        # arrival claims whose reply may not be back: (its reply, when it was sent)
        self._tk_unacked: deque[tuple[Pending, float]] = deque(maxlen=UNACKED_KEPT)
        self._tk_async = isinstance(self, AsyncScheduler)
        self._tk_engine_record()
        return True

    # ---- hooks ----------------------------------------------------------------------
    def add_request(self, request: Any) -> None:
        super().add_request(request)  # type: ignore[misc]
        if self._tk_on:
            self._bk_guard.call("add_request", self._tk_on_arrival)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self._tk_on and getattr(self, "_tk_unacked", None):  # cheap: most steps have none
            self._bk_guard.call("arrival_ack", self._tk_settle)
        out = super().schedule(*args, **kwargs)
        if self._tk_on:
            self._bk_guard.call("schedule", self._tk_step, out)
        return out

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        done_at = self._tk_clock() if self._tk_on else 0.0
        result = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        if self._tk_on:
            self._bk_guard.call("update_from_output", self._tk_measure, scheduler_output, done_at)
            self._bk_guard.call("record", self._bk_idle)  # with this step's own record
        return result

    def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        result = super()._free_request(request, *args, **kwargs)  # type: ignore[misc]
        if self._tk_on:
            self._bk_guard.call("free_request", self._tk_finished, request)
        return result

    # ---- the adapter ----------------------------------------------------------------
    def _tk_now(self) -> float:
        return self._tk_clock() - self._tk_t0

    def _tk_view(self, out: Any | None) -> LiveView:
        """The scheduler as just decided (``out``), or between steps (``None``: arrival)."""
        sched: Any = self
        waiting = []
        for queue in (sched.kv_holding_waiting, sched.waiting):
            for req in queue:
                waiting.append(
                    LiveWaiting(
                        req.request_id,
                        req.num_prompt_tokens,
                        req.status == RequestStatus.WAITING_FOR_REMOTE_KVS,
                    )
                )
        running = tuple(
            LiveRunning(
                r.request_id,
                r.num_prompt_tokens,
                r.num_computed_tokens,
                r.num_output_tokens,
                self._tk_inflight(r, out),
            )
            for r in sched.running
        )
        free_blocks = sched.kv_cache_manager.block_pool.get_num_free_blocks()
        # the steps still in flight ahead of this one (``out`` is not queued yet)
        ahead = [e for e in self._tk_scheduled if e[0].total_num_scheduled_tokens > 0]
        ahead_tokens = tuple(int(e[0].total_num_scheduled_tokens) for e in ahead)
        elapsed = self._tk_clock() - max(ahead[0][1], self._tk_last_done) if ahead else 0.0
        return LiveView(
            at_s=self._tk_now(),
            step=int(getattr(sched, "current_step", 0)),
            scheduled=tuple(out.num_scheduled_tokens) if out is not None else (),
            scheduled_tokens=int(out.total_num_scheduled_tokens) if out is not None else 0,
            running=running,
            waiting=tuple(waiting),
            max_seqs=int(sched.max_num_running_reqs),
            max_batched_tokens=int(sched.max_num_scheduled_tokens),
            free_kv_tokens=int(free_blocks) * int(sched.block_size),
            ahead_tokens=ahead_tokens,
            ahead_elapsed_s=max(0.0, elapsed),
        )

    def _tk_queue(self) -> tuple[tuple[str, bool], ...]:
        """The waiting queues as the view would show them (``live.queue_of``), cheaply."""
        sched: Any = self
        loading = RequestStatus.WAITING_FOR_REMOTE_KVS
        return tuple(
            (req.request_id, req.status == loading)
            for queue in (sched.kv_holding_waiting, sched.waiting)
            for req in queue
        )

    def _tk_inflight(self, req: Any, out: Any | None) -> int:
        """Outputs the steps in flight will give ``req`` beyond ``num_output_tokens``: vLLM's
        async scheduler keeps them as placeholders (one per scheduled step that is not a
        prefill chunk, vllm/v1/core/sched/async_scheduler.py:25-47; vLLM's own count of a
        request's outputs adds them, vllm/v1/core/sched/scheduler.py:1738-1740). The sync
        scheduler keeps none: its one step in flight is the one just scheduled, which yields
        a token unless it is a prefill chunk (set in ``_update_after_schedule``)."""
        if self._tk_async:
            return int(req.num_output_placeholders)
        scheduled = out is not None and req.request_id in out.num_scheduled_tokens
        return int(scheduled and not req.is_prefill_chunk)

    def _tk_engine_record(self) -> None:
        """The engine as vLLM resolved it, once: its scheduling (the class's and the
        config's, which a launch must make agree), its batch queue depth and its KV pool
        (``num_gpu_blocks`` × ``block_size`` tokens: sized by vLLM at startup, on a GPU from
        ``gpu_memory_utilization``; the sim cross-check reads it there)."""
        sched: Any = self
        cfg = sched.vllm_config
        blocks = int(cfg.cache_config.num_gpu_blocks or 0)
        self._bk_trace.write(
            {
                "kind": "engine",
                "scheduler": type(self).__name__,
                "async_class": self._tk_async,
                "async_scheduling": bool(cfg.scheduler_config.async_scheduling),
                "max_concurrent_batches": int(cfg.max_concurrent_batches),
                "num_gpu_blocks": blocks,
                "block_size": int(sched.block_size),
                "kv_tokens": blocks * int(sched.block_size),
            }
        )

    def _tk_step(self, out: Any) -> None:
        began = self._tk_clock()
        try:
            self._tk_after_schedule(out)
        finally:
            if self._tk_scheduled and self._tk_scheduled[-1][0] is out:
                self._tk_scheduled[-1][3] = self._tk_clock() - began  # the engine loop's cost

    def _tk_finished(self, request: Any) -> None:
        update = self._tk.on_finished([request.request_id], [request.num_output_tokens])
        if update is not None:
            self._tk_send(wire.UpdateRequest.of(update))

    def _tk_after_schedule(self, out: Any) -> None:
        self._tk_collect()
        modelled = self._tk.calibrator.base.step_s(int(out.total_num_scheduled_tokens), 0, 0)
        if self._tk.quiet(self._tk_queue(), self._tk_now()):
            self._tk_scheduled.append([out, self._tk_clock(), modelled, 0.0, "quiet"])
            return  # nothing the controller reads can have changed: no view to build
        view = self._tk_view(out)
        entry = [out, self._tk_clock(), modelled, 0.0, "view"]
        self._tk_scheduled.append(entry)
        update = self._tk.on_step(view)
        if update is None:
            return
        hits = self._tk_hits(update.report) if update.report else None
        self._tk_send(wire.UpdateRequest.of(update, hits))
        entry[4] = "sent"

    def _tk_on_arrival(self) -> None:
        self._tk_collect()
        update = self._tk.on_arrival(self._tk_view(None))
        if update is None:
            return
        if not update.report:
            self._tk_send(wire.UpdateRequest.of(update), arrival=True)  # no claim: no wait
            return
        req = wire.UpdateRequest.of(update, self._tk_hits(update.report))
        # the claim must be on the server before a schedule() looks the request up
        self._tk_unacked.append((self._tk_send(req, arrival=True), self._tk_clock()))

    def _tk_may_look_up(self) -> bool:
        """Whether the coming schedule() may look a waiting request up: vLLM 0.32's waiting
        loop breaks, before any lookup, once the running requests (and paused streaming
        sessions) fill ``max_num_active_reqs`` (vllm/v1/core/sched/scheduler.py:922-924);
        schedule() adds to ``running``, never removes but to preempt, and a step that
        preempts schedules no waiting request."""
        sched: Any = self
        active = getattr(sched, "max_num_active_reqs", sched.max_num_running_reqs)
        busy = len(sched.running) + int(getattr(sched, "num_waiting_for_streaming_input", 0))
        return busy < int(active)

    def _tk_settle(self) -> None:
        """Before schedule(): each arrival claim's reply that is back is done with; when
        this schedule() may look a request up, the rest are waited for (each up to
        ``arrival_ack_s`` after its send). Each is traced once, with what it held the
        engine loop (``ack_wait_s``)."""
        must = self._tk_may_look_up()
        bound = self._tk.s.arrival_ack_s
        left: deque[tuple[Pending, float]] = deque(maxlen=UNACKED_KEPT)
        for pending, sent_at in self._tk_unacked:
            t0 = self._tk_clock()
            acked = pending.wait(max(0.0, sent_at + bound - t0) if must else 0.0)
            if not acked and not must:
                left.append((pending, sent_at))
                continue
            now = self._tk_clock()
            self._bk_trace.write({"kind": "arrival_ack", "acked": acked,
                                  "ack_wait_s": round(now - t0, 6),
                                  "after_s": round(now - sent_at, 6)})  # fmt: skip
        self._tk_unacked = left

    def _tk_hits(self, req_ids: tuple[str, ...]) -> dict[str, wire.Hit]:
        """What the server module needs to find each new claim's objects (its own lookup
        keys from the prompt tokens, metadata only)."""
        sched: Any = self
        out = {}
        chunk = self._tk.s.chunk_tokens
        lmc = getattr(self.get_kv_connector(), "scheduler_adapter", None)  # type: ignore[attr-defined]
        model = getattr(lmc, "model_name", None) or sched.vllm_config.model_config.model
        world = int(getattr(lmc, "world_size", 1) or 1)
        for rid in req_ids:
            req = sched.requests.get(rid)
            if req is None:
                continue
            n = (req.num_prompt_tokens // chunk) * chunk
            out[rid] = wire.Hit(tuple(req.prompt_token_ids[:n]), req.cache_salt or "", model, world)
        return out

    def _tk_measure(self, scheduler_output: Any, done_at: float) -> None:
        """Step time: from when the step could start (scheduled, and the previous step
        that computed done: async scheduling runs a step ahead) to its output. A step that
        scheduled no token computed nothing (vLLM's batch queue passes one through when
        every running request already has its last token in flight): it calibrates nothing
        and is no previous step."""
        while self._tk_scheduled:
            out, at, modelled, adapter_s, kind = self._tk_scheduled.popleft()
            if out is scheduler_output:
                start = max(at, self._tk_last_done)
                # the measured step, for calibrating a simulation of the same run offline
                tokens = int(out.total_num_scheduled_tokens)
                if tokens > 0:
                    self._tk.calibrator.observe(modelled, done_at - start)
                    self._tk_last_done = done_at
                # busy: a request of this step was in the previous one too (the loop cannot
                # have idled between them), so done_s − the previous done_s is what one
                # step cost the engine loop as a whole (scheduling, adapter, output)
                ids = set(out.num_scheduled_tokens)
                busy, self._tk_prev_ids = bool(ids & self._tk_prev_ids), ids
                self._bk_trace.write({"kind": "step_time", "tokens": tokens,
                                      "s": round(done_at - start, 6),
                                      "adapter_s": round(adapter_s, 6), "pass": kind,
                                      "done_s": round(done_at - self._tk_t0, 6),
                                      "busy": busy})  # fmt: skip
                return

    def _tk_collect(self) -> None:
        transport = self._tk_transport
        if transport is None:
            return
        for _method, raw in transport.replies():
            reply = wire.UpdateReply.from_json(raw)  # a renamed key: an adapter_error naming it
            for rid, hit in reply.hit_tokens.items():
                self._tk.set_hit(rid, hit)
            self._tk.eta_s.update(reply.eta_s)
            if reply.needs_ttu is not None:  # the controller's policy says what it reads
                self._tk.s = replace(
                    self._tk.s, needs_ttu=reply.needs_ttu, ttu_quantile=reply.ttu_quantile
                )

    def _tk_send(self, req: wire.UpdateRequest, arrival: bool = False) -> Pending:
        transport = self._tk_transport
        if transport is None:
            transport = self._tk_transport = self._tk_make_transport()
        payload = req.to_json()
        pending = transport.send(UPDATE_METHOD, payload)
        extra: dict[str, Any] = {"arrival": True} if arrival else {}
        self._bk_trace.write({"kind": "update", **traced(payload), **extra})
        return pending

    def _tk_make_transport(self) -> Transport:
        if self._tk_transport_kind == "connector":
            connector = self.get_kv_connector()  # type: ignore[attr-defined]
            made = ServerModuleTransport.from_connector(connector)
            if made is not None:
                return made
        return RecordTransport()

    def _tk_fail(self, where: str, e: BaseException, n: int) -> None:
        """The guard's hook: every failure counted; the trace keeps the first of each site
        and then the 2nd, 4th, 8th, ... (``count``: that site's failures so far)."""
        self._tk_errors += 1
        if n & (n - 1) == 0:
            self._bk_trace.write(
                {"kind": "adapter_error", "where": where, "error": repr(e), "count": n}
            )


class RecordingScheduler(StepRecorder, Scheduler):
    """The stock scheduler, its decisions recorded (the adapter-off side)."""


class RecordingAsyncScheduler(StepRecorder, AsyncScheduler):
    """The stock async scheduler, its decisions recorded."""


class TempoKVScheduler(TempoKVAdapter, Scheduler):
    pass


class TempoKVAsyncScheduler(TempoKVAdapter, AsyncScheduler):
    pass
