"""The TempoKV adapter on vLLM's async scheduler under the engine's two-deep batch queue (step
N+1 scheduled before step N's output is processed), against the sync adapter under the
sync loop, over the on/off test's six requests: vLLM's real schedulers, driven offline on a
virtual device and clock (the loops below), so every value is exact.

- the same claims, in the same order, as the sync adapter, and the same decisions as the
  stock async scheduler under the same queue (the adapter changes nothing);
- the zero-token steps the queue passes through reach no calibration sample;
- every view counts each in-flight token once: computed tokens include every scheduled
  step, outputs include every in-flight step's token (the async scheduler's placeholders),
  the older in-flight step's rest is busy time; and the TTUs sent are the projection of
  the engine as the loop's own books know it.

The engine core's two loops, transcribed (no model runs):

- ``sync_loop``: ``EngineCore.step`` (vllm/v1/engine/core.py:657-687): schedule, execute,
  block on the output, ``update_from_output``.
- ``batch_queue_loop``: ``EngineCore.step_with_batch_queue`` (core.py:698-812) with the
  two-deep queue async scheduling gives (``max_concurrent_batches`` 2,
  vllm/config/vllm.py:577-587): schedule step N+1 and queue it, and only when the queue is
  full (or nothing more can be scheduled) block on the oldest step's output and process it.

The device runs queued steps in order, each taking ``cost.step_s(tokens)`` (a zero-token step
computes nothing) from when it was scheduled or the device is free; ``schedule()`` takes
``HOST_S`` of the loop's clock and ``update_from_output()`` ``OUTPUT_S``. Outputs are what
vLLM's model runner returns: one sampled token per request whose step is not a prefill
chunk, none for a chunk. Times are dyadic, so every sum is exact.
"""

from __future__ import annotations

import json
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from bsrctl.stack.launch import tinymodel
from bsrkv.tempokv import wire
from bsrkv.tempokv.live import AdapterSettings
from bsrkv.tempokv.ttu import (
    CostModel,
    EngineLimits,
    EngineSnapshot,
    OutputPredictor,
    QueuedSeq,
    RunningSeq,
    project_ttus,
)

# ---- the engine loops -------------------------------------------------------------------

HOST_S = 2.0**-10  # one schedule() on the engine loop
OUTPUT_S = 2.0**-9  # one update_from_output() on it
COST = CostModel(2.0**-7, 2.0**-14, 0.0, 0.0)  # the device's step time, and the adapter's prior
BLOCK = 16
SetEnv = Callable[[str, str], None]
PROMPTS = (1200, 700, 1500, 520, 900, 1100)  # the on/off test's requests
MAX_TOKENS = (3, 9, 5, 12, 4, 7)
ADAPTER = AdapterSettings(
    k=2,
    needs_ttu=True,
    ttu_tolerance_s=0.0,  # send on every change
    output_limit_tokens=12,
    chunk_tokens=256,
    kv_bytes_per_token=tinymodel.TinyModelRecipe().kv_bytes_per_token(),
    cost=COST,
)


def vllm_config() -> Any:
    """A CPU VllmConfig of the tiny model (2 slots, 512-token steps, 1000 KV blocks)."""
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig

    model = ModelConfig(
        model=str(tinymodel.build()), dtype="float32", max_model_len=2048, seed=0,
        skip_tokenizer_init=True,
    )  # fmt: skip
    sched = SchedulerConfig(
        max_num_seqs=2, max_num_batched_tokens=512, max_model_len=2048, is_encoder_decoder=False
    )
    cfg = VllmConfig(
        model_config=model, scheduler_config=sched,
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
    )  # fmt: skip
    cfg.cache_config.num_gpu_blocks = 1000
    return cfg


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Books:
    """What the loop itself knows: every step as scheduled (tokens, which requests it
    yields a token for, when), and the device's finish of each."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    # (view, the steps as the loop knew them then, the update the core made of it)
    views: list[tuple[Any, list[dict[str, Any]], Any]] = field(default_factory=list)
    observed: list[tuple[float, float]] = field(default_factory=list)  # calibration samples


def make_scheduler(
    cls: type,
    cfg: Any,
    trace: Path,
    clock: Clock,
    books: Books,
    setenv: SetEnv,
    quiet: bool = False,
) -> Any:
    """``cls`` on ``cfg`` with the adapter's settings in BSRKV_TEMPOKV (set by ``setenv``,
    a test's monkeypatch), on ``clock``; every view the adapter's core takes, with its
    update, and every calibration sample are kept in ``books``."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    env = wire.AdapterEnv(ADAPTER, "record", str(trace))
    setenv("BSRKV_TEMPOKV", json.dumps(env.to_json()))

    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=16, dtype=torch.float32)
    kv = KVCacheConfig(1000, [], [KVCacheGroupSpec(["l0"], spec)])
    sub = type(cls.__name__, (cls,), {"_tk_clock": staticmethod(clock)})
    sched = sub(
        vllm_config=cfg, kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(cfg), block_size=BLOCK,
    )  # fmt: skip
    core = getattr(sched, "_tk", None)
    if core is None:  # the stock scheduler, its decisions recorded (the adapter-off side)
        return sched
    on_step, observe = core.on_step, core.calibrator.observe
    if not quiet:  # every step's view taken (the quiet path skips the unchanged ones)
        core.quiet = lambda *_a: False

    def seen(view: Any) -> Any:
        update = on_step(view)
        books.views.append((view, [dict(s) for s in books.steps], update))
        return update

    def sample(modelled: float, measured: float) -> None:
        books.observed.append((modelled, measured))
        observe(modelled, measured)

    core.on_step, core.calibrator.observe = seen, sample
    return sched


def add_requests(sched: Any) -> None:
    from vllm import SamplingParams
    from vllm.v1.request import Request

    for i, (n, m) in enumerate(zip(PROMPTS, MAX_TOKENS, strict=True)):
        params = SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True)
        sched.add_request(Request(str(i), list(range(1, n + 1)), params, None, arrival_time=0.0))


class Device:
    def __init__(self, clock: Clock, books: Books) -> None:
        self.clock, self.books, self.free_s = clock, books, 0.0

    def schedule(self, sched: Any) -> dict[str, Any]:
        """One schedule() (then its host time), queued on the device at once."""
        out = sched.schedule()
        at = self.clock.t
        reqs = sched.requests
        yields = frozenset(r for r in out.num_scheduled_tokens if not reqs[r].is_prefill_chunk)
        tokens = int(out.total_num_scheduled_tokens)
        start = max(at, self.free_s)
        finish = start + (COST.step_s(tokens, 0, 0) if tokens else 0.0)
        self.free_s = finish
        step = {"out": out, "tokens": tokens, "yields": yields, "at": at, "finish": finish,
                "scheduled": dict(out.num_scheduled_tokens), "done": None}  # fmt: skip
        self.books.steps.append(step)
        self.clock.t += HOST_S
        return step

    def output(self, sched: Any, step: dict[str, Any]) -> None:
        """Block until the step's output is back, then process it."""
        from vllm.v1.outputs import ModelRunnerOutput

        self.clock.t = max(self.clock.t, step["finish"])
        ids = list(step["scheduled"])
        runner = ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[7] if r in step["yields"] else [] for r in ids],
        )  # fmt: skip
        step["done"] = self.clock.t
        sched.update_from_output(step["out"], runner)
        self.clock.t += OUTPUT_S


def sync_loop(sched: Any, device: Device) -> None:
    while sched.has_requests():
        device.output(sched, device.schedule(sched))


def batch_queue_loop(sched: Any, device: Device, size: int = 2) -> None:
    queue: deque[dict[str, Any]] = deque()

    def step() -> None:
        if sched.has_requests():
            entry = device.schedule(sched)
            queue.appendleft(entry)
            if len(queue) < size and (entry["tokens"] > 0 or sched.has_requests()):
                return  # the queue is not full: schedule the next step first
        elif not queue:
            return
        device.output(sched, queue.pop())

    while sched.has_requests() or queue:
        step()


def run(
    cls: type,
    loop: Callable[[Any, Device], None],
    cfg: Any,
    trace: Path,
    setenv: SetEnv,
    quiet: bool = False,
) -> tuple[Any, Books]:
    # the CPU platform turned async scheduling off (vllm/platforms/cpu.py:329-331); the loop
    # is what the CUDA platform's resolution runs, and the config says so
    cfg.scheduler_config.async_scheduling = loop is batch_queue_loop
    clock, books = Clock(), Books()
    sched = make_scheduler(cls, cfg, trace, clock, books, setenv, quiet)
    add_requests(sched)
    loop(sched, Device(clock, books))
    return sched, books


def records(trace: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in trace.read_text().splitlines()]


# ---- the tests --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cfg() -> Any:
    return vllm_config()


def _run(cfg: Any, tmp: Path, mp: pytest.MonkeyPatch, cls_name: str, queued: bool):
    from bsrkv.vllm_ext import scheduler

    trace = tmp / f"{cls_name}.jsonl"
    loop = batch_queue_loop if queued else sync_loop
    sched, books = run(getattr(scheduler, cls_name), loop, cfg, trace, mp.setenv)
    return sched, books, records(trace)


def _claims(records: list[dict]) -> list[tuple[list[str], bool]]:
    return [(u["report"], bool(u.get("arrival"))) for u in records if u["kind"] == "update"
            if u["report"]]  # fmt: skip


def test_the_async_adapter_claims_what_the_sync_one_does(
    cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _s, sync_books, sync = _run(cfg, tmp_path, monkeypatch, "TempoKVScheduler", False)
    _a, async_books, on = _run(cfg, tmp_path, monkeypatch, "TempoKVAsyncScheduler", True)
    _o, _ob, off = _run(cfg, tmp_path, monkeypatch, "RecordingAsyncScheduler", True)
    # every request claimed once, in arrival order; 0 and 1 at their arrival (the first
    # K = 2 waiting), the others when a step leaves them at the head
    want = [(["0"], True), (["1"], True), (["2"], False), (["3"], False), (["4"], False),
            (["5"], False)]  # fmt: skip
    assert _claims(on) == _claims(sync) == want
    assert [r for r in on + sync if r["kind"] == "adapter_error"] == []
    # the adapter decides nothing: the stock async scheduler's steps under the same queue
    steps = [[r["scheduled"], r["new"], r["finished"]] for r in on if r["kind"] == "step"]
    assert steps == [[r["scheduled"], r["new"], r["finished"]] for r in off if r["kind"] == "step"]
    # the queue really ran one ahead: 31 steps against the sync loop's 28 (it cannot see a
    # request finish before scheduling the next step), two in flight at 29 of its 31 views
    assert (len(async_books.steps), len(sync_books.steps)) == (31, 28)
    assert sum(1 for v, _t, _u in async_books.views if v.ahead_tokens) == 29
    assert not any(v.ahead_tokens for v, _t, _u in sync_books.views)
    (sync_engine,) = [r for r in sync if r["kind"] == "engine"]
    (async_engine,) = [r for r in on if r["kind"] == "engine"]
    assert sync_engine == {"kind": "engine", "scheduler": "TempoKVScheduler",
                           "async_class": False, "async_scheduling": False,
                           "max_concurrent_batches": 1, "num_gpu_blocks": 1000,
                           "block_size": 16, "kv_tokens": 16000}  # fmt: skip
    assert {k: async_engine[k] for k in ("async_class", "async_scheduling")} == {
        "async_class": True, "async_scheduling": True}  # fmt: skip
    assert async_engine["max_concurrent_batches"] == 2


@pytest.mark.parametrize("queued", [False, True], ids=["sync", "batch-queue"])
def test_no_zero_token_step_reaches_the_calibration(
    cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, queued: bool
) -> None:
    cls = "TempoKVAsyncScheduler" if queued else "TempoKVScheduler"
    _s, books, records = _run(cfg, tmp_path, monkeypatch, cls, queued)
    empty = [i for i, s in enumerate(books.steps) if s["tokens"] == 0]
    # the loops pass empty steps through at the end (the last finish to report; under the
    # queue also the step scheduled while the last token was in flight)
    assert empty == ([29, 30] if queued else [27])
    real = [s for s in books.steps if s["tokens"] > 0]
    # one sample per step that computed, in order: its modelled time, and the device's
    # time for it exactly (under the queue a step starts when the one before it ends)
    starts = [max(s["at"], prev["finish"]) for prev, s in zip(real, real[1:], strict=False)]
    assert books.observed == [
        (COST.step_s(s["tokens"], 0, 0), s["finish"] - start)
        for s, start in zip(real, [real[0]["at"], *starts], strict=True)
    ]
    assert all(m == s for m, s in books.observed)  # so the calibrated cost is the device's
    timed = [r for r in records if r["kind"] == "step_time"]
    assert [r["tokens"] for r in timed] == [s["tokens"] for s in books.steps]  # all traced


def _books_snapshot(view: Any, then: list[dict], cur: dict) -> EngineSnapshot:
    """The engine at ``view`` as the loop's own books know it: every scheduled step's tokens
    computed, every scheduled step's token produced, the older in-flight step's rest and the
    new one busy; the waiting requests with no hit (the record transport gets no reply)."""
    steps = [*then, cur]
    prompt = {str(i): n for i, n in enumerate(PROMPTS)}
    running = []
    for r in view.running:
        computed = sum(s["scheduled"].get(r.req_id, 0) for s in steps)
        produced = sum(1 for s in steps if r.req_id in s["yields"])
        running.append(RunningSeq(max(0, prompt[r.req_id] - computed), computed, produced))
    flight = [s for s in then if s["done"] is None and s["tokens"] > 0]
    busy = 0.0
    if flight:
        last_done = max((s["done"] for s in then if s["done"] is not None and s["tokens"]),
                        default=0.0)  # fmt: skip
        rest = COST.step_s(flight[0]["tokens"], 0, 0) - (view.at_s - max(flight[0]["at"],
                                                                        last_done))  # fmt: skip
        busy = max(0.0, rest) + sum(COST.step_s(s["tokens"], 0, 0) for s in flight[1:])
    busy += COST.step_s(cur["tokens"], 0, 0) if cur["tokens"] else 0.0
    waiting = tuple(QueuedSeq(w.req_id, w.prompt_tokens, 0, 0.0) for w in view.waiting)
    return EngineSnapshot(view.at_s, busy, tuple(running), waiting)


@pytest.mark.parametrize("queued", [False, True], ids=["sync", "batch-queue"])
def test_every_in_flight_token_is_counted_once(
    cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, queued: bool
) -> None:
    cls = "TempoKVAsyncScheduler" if queued else "TempoKVScheduler"
    _s, books, _records = _run(cfg, tmp_path, monkeypatch, cls, queued)
    checked: list[tuple[int, ...]] = []  # the steps ahead at each view whose TTUs were checked
    for view, then, update in books.views:
        cur = books.steps[len(then)]  # the step this view was taken in
        steps = [*then, cur]
        for r in view.running:  # computed: every step scheduled; outputs: every one's token
            assert r.computed_tokens == sum(s["scheduled"].get(r.req_id, 0) for s in steps)
            done = [s for s in then if s["done"] is not None]
            assert r.output_tokens == sum(1 for s in done if r.req_id in s["yields"])
            assert r.output_tokens + r.inflight_tokens == sum(
                1 for s in steps if r.req_id in s["yields"])  # fmt: skip
        flight = [s["tokens"] for s in then if s["done"] is None and s["tokens"] > 0]
        assert view.ahead_tokens == tuple(flight)
        done = [s for s in then if s["done"] is not None]
        ended = any(sum(1 for s in done if str(i) in s["yields"]) >= m
                    for i, m in enumerate(MAX_TOKENS))  # fmt: skip
        if update is None or not update.ttus_s or ended:
            continue  # TTUs recomputed below while no request ended (the predictor's prior)
        snap = _books_snapshot(view, then, cur)
        free = view.free_kv_tokens + sum(r.computed_tokens for r in view.running)
        limits = EngineLimits(2, 512, sync_loads=False, queued_loads=True, gpu_kv_tokens=free)
        want = project_ttus(snap, COST, limits, OutputPredictor(12), list(update.ttus_s))
        assert update.ttus_s == want
        checked.append(view.ahead_tokens)
    assert checked == ([(), (512,), (2,)] if queued else [(), (), (), (), ()])
    # under the queue the in-flight outputs are the async scheduler's placeholders (two
    # steps of one request in flight), the older step's rest ``OUTPUT_S`` short of its time
    two = [v for v, _t, _u in books.views if any(r.inflight_tokens == 2 for r in v.running)]
    assert bool(two) is queued
    if queued:
        v = two[0]
        assert (v.ahead_tokens, v.ahead_elapsed_s) == ((512,), OUTPUT_S)
        assert HOST_S < OUTPUT_S < COST.step_s(1, 0, 0)
        assert MAX_TOKENS[0] == 3


@pytest.mark.parametrize("queued", [False, True], ids=["sync", "batch-queue"])
@pytest.mark.parametrize("tolerance_s", [0.0, 2.0**-6])
def test_the_quiet_path_sends_what_every_view_sends(
    cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, queued: bool, tolerance_s: float
) -> None:
    """Skipping the view of a step whose waiting queue is unchanged and whose projection is
    not due (``LiveAdapterCore.quiet``) changes no update, no calibration sample and no
    step count: the same run with every view taken sends the same messages."""
    from bsrkv.vllm_ext import scheduler

    monkeypatch.setattr(sys.modules[__name__], "ADAPTER",
                        replace(ADAPTER, ttu_tolerance_s=tolerance_s))  # fmt: skip
    cls = getattr(scheduler, "TempoKVAsyncScheduler" if queued else "TempoKVScheduler")
    loop = batch_queue_loop if queued else sync_loop
    got, passes = {}, {}
    for quiet in (False, True):
        trace = tmp_path / f"{quiet}.jsonl"
        sched, books = run(cls, loop, cfg, trace, monkeypatch.setenv, quiet=quiet)
        recs = [r for r in records(trace) if r["kind"] in ("update", "step_time")]
        passes[quiet] = [r.pop("pass") for r in recs if r["kind"] == "step_time"]
        got[quiet] = (recs, books.observed, sched._tk.steps_seen, len(books.views))
    (every, samples, steps, views), (q_sent, q_samples, q_steps, q_views) = got[False], got[True]
    assert (q_sent, q_samples, q_steps) == (every, samples, steps)
    # each step pass says what it did: the same steps sent; only the quiet run skipped views
    assert [k == "sent" for k in passes[True]] == [k == "sent" for k in passes[False]]
    assert "quiet" not in passes[False] and "quiet" in passes[True]
    assert any(u["ttus_s"] for u in every if u["kind"] == "update")
    assert q_views < views  # and it did skip views
