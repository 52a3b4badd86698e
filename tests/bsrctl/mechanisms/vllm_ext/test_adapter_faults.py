"""The adapter never takes vLLM's scheduler down: with its trace on /dev/full, a transport
that raises, a start that failed, or any of its hooks raising, vLLM's real schedulers (the
sync one under the engine's sync loop, the async one under its batch queue, transcribed in
``test_async_adapter``) raise nothing and decide exactly what the stock scheduler decides
(every step's requests and tokens, every output), and each failure is counted on the
scheduler's guard."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bsrctl.evidence.guards import GuardCounts, GuardDelta, extensions_healthy
from bsrctl.stack.contracts.guards import VLLM, vllm_guards
from bsrkv.hostguard import process_failures
from bsrkv.tempokv import wire
from bsrkv.vllm_ext import scheduler
from tests.bsrctl.mechanisms.vllm_ext.test_async_adapter import (
    ADAPTER,
    BLOCK,
    Books,
    Clock,
    Device,
    add_requests,
    batch_queue_loop,
    sync_loop,
    vllm_config,
)

DEV_FULL = Path("/dev/full")


def verdict_from_trace(before: list, trace: Path) -> tuple[str, str]:
    """``extensions_healthy`` over the run, as the harness reads it: the trace's last
    ``guards`` record against the engine process's counts before the scheduler was built
    (this test process's earlier tests counted too)."""
    base = GuardCounts({(g, s, t): n for g, s, t, n in before})
    c = extensions_healthy([GuardDelta.over(VLLM, base, vllm_guards(trace))])
    return str(c.verdict), c.detail


@pytest.fixture(scope="module")
def cfg() -> Any:
    return vllm_config()


def build(cls: type, cfg: Any, trace: Path | None, mp: pytest.MonkeyPatch, transport: str) -> Any:
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    env = wire.AdapterEnv(ADAPTER, transport, None if trace is None else str(trace))
    mp.setenv(scheduler.ENV, json.dumps(env.to_json()))
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=16, dtype=torch.float32)
    kv = KVCacheConfig(1000, [], [KVCacheGroupSpec(["l0"], spec)])
    clock = Clock()
    sub = type(cls.__name__, (cls,), {"_tk_clock": staticmethod(clock)})
    return sub(
        vllm_config=cfg, kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(cfg), block_size=BLOCK,
    )  # fmt: skip


def decisions(sched: Any, queued: bool) -> tuple[list[dict[str, int]], dict[str, list[int]]]:
    """Every step's scheduled tokens per request, and every request's output tokens, after
    the whole workload ran through ``sched`` (any exception fails the test)."""
    books = Books()
    device = Device(Clock(), books)
    add_requests(sched)
    outputs: dict[str, list[int]] = {}
    update = sched.update_from_output

    def seen(out: Any, runner: Any) -> Any:
        got = update(out, runner)
        for eco in got.values():
            for o in eco.outputs:
                outputs.setdefault(o.request_id, []).extend(o.new_token_ids)
        return got

    sched.update_from_output = seen
    (batch_queue_loop if queued else sync_loop)(sched, device)
    return [s["scheduled"] for s in books.steps], outputs


def stock(cfg: Any, queued: bool) -> tuple[list[dict[str, int]], dict[str, list[int]]]:
    import torch
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    cfg.scheduler_config.async_scheduling = queued
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=16, dtype=torch.float32)
    kv = KVCacheConfig(1000, [], [KVCacheGroupSpec(["l0"], spec)])
    cls = AsyncScheduler if queued else Scheduler
    som = StructuredOutputManager(cfg)
    sched = cls(vllm_config=cfg, kv_cache_config=kv, structured_output_manager=som,
                block_size=BLOCK)  # fmt: skip
    return decisions(sched, queued)


CLASSES = [
    ("TempoKVScheduler", False),
    ("TempoKVAsyncScheduler", True),
    ("RecordingScheduler", False),
    ("RecordingAsyncScheduler", True),
]


@pytest.mark.parametrize(("cls_name", "queued"), CLASSES)
def test_a_trace_on_dev_full_never_reaches_the_scheduler(
    cfg: Any, monkeypatch: pytest.MonkeyPatch, cls_name: str, queued: bool
) -> None:
    want = stock(cfg, queued)
    sched = build(getattr(scheduler, cls_name), cfg, DEV_FULL, monkeypatch, "record")
    assert decisions(sched, queued) == want  # raised nothing, decided the same
    # the first record hit the full disk (the adapter's engine record at start, or the
    # recorder's first step): the trace was dropped then, once, and nothing else failed
    assert sched._bk_guard.counts() == {"trace": 1}
    if cls_name.startswith("TempoKV"):
        assert sched._tk_on  # the adapter itself ran on: only its trace is gone
        assert sched._tk.steps_seen == len(want[0])
        assert sched._tk.updates_sent > 0


class Raising:
    """A transport whose sends, or whose reply collection, raise (a closed socket, a dead
    server)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.calls = 0

    def send(self, method: str, payload: dict, wait_s: float = 0.0) -> bool:
        if self.what == "send":
            self.calls += 1
            raise ConnectionError("server gone")
        return True

    def replies(self) -> list:
        if self.what == "replies":
            self.calls += 1
            raise ConnectionError("server gone")
        return []


@pytest.mark.parametrize("what", ["send", "replies"])
@pytest.mark.parametrize(("cls_name", "queued"), CLASSES[:2])
def test_a_transport_that_raises_changes_no_decision(
    cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cls_name: str, queued: bool,
    what: str,
) -> None:  # fmt: skip
    want = stock(cfg, queued)
    trace = tmp_path / "t.jsonl"
    sched = build(getattr(scheduler, cls_name), cfg, trace, monkeypatch, "record")
    transport = Raising(what)
    sched._tk_transport = transport
    assert decisions(sched, queued) == want
    counts = sched._bk_guard.counts()
    # the hooks that reached the transport failed there and were counted, each time: an
    # arrival (its claim, or its reply collection) and a step (an update, or collection);
    # no request ended while claimed, so no cancellation was sent
    assert set(counts) == {"add_request", "schedule"}
    assert sched._tk_errors == sum(counts.values()) == transport.calls
    if what == "replies":  # collected at every arrival and every step
        assert counts == {"add_request": 6, "schedule": len(want[0])}
    errors = [json.loads(x) for x in trace.read_text().splitlines() if "adapter_error" in x]
    # the trace keeps each site's 1st, 2nd, 4th, ... failure, not one per step
    for site, n in counts.items():
        assert [e["count"] for e in errors if e["where"] == site] == [
            2**i for i in range(n.bit_length())
        ]
    assert {e["error"] for e in errors} == {"ConnectionError('server gone')"}


def test_a_start_that_failed_leaves_the_stock_scheduler(
    cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state never initialised: the adapter's start raised, so every hook is vLLM's."""
    want = stock(cfg, False)

    def broken(*_a: Any) -> Any:
        raise RuntimeError("no core")

    monkeypatch.setattr(scheduler, "LiveAdapterCore", broken)
    trace = tmp_path / "t.jsonl"
    before = process_failures()
    sched = build(scheduler.TempoKVScheduler, cfg, trace, monkeypatch, "record")
    assert not sched._tk_on
    assert decisions(sched, False) == want
    assert sched._bk_guard.counts() == {"init": 1}
    recs = [json.loads(x) for x in trace.read_text().splitlines()]
    assert [r for r in recs if r["kind"] == "adapter_error"] == [
        {"kind": "adapter_error", "where": "init", "error": "RuntimeError('no core')", "count": 1}
    ]
    # the recorder still ran; the engine's guard failures went with its records
    assert {r["kind"] for r in recs} == {"step", "adapter_error", "guards"}
    assert verdict_from_trace(before, trace) == (
        "FAIL",
        "extension degraded to stock: vLLM engine: bsrkv.vllm_ext [init] RuntimeError x1",
    )


@pytest.mark.parametrize(
    ("method", "site"),
    [
        ("_tk_view", "schedule"),  # also add_request's view
        ("_tk_measure", "update_from_output"),
        ("_tk_finished", "free_request"),
        ("_bk_record", "record"),
    ],
)
def test_each_hook_that_raises_is_counted_and_changes_nothing(
    cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, site: str
) -> None:
    want = stock(cfg, False)

    def boom(*_a: Any, **_k: Any) -> Any:
        raise ValueError(method)

    monkeypatch.setattr(scheduler.TempoKVScheduler, method, boom)
    trace = tmp_path / "t.jsonl"
    before = process_failures()
    sched = build(scheduler.TempoKVScheduler, cfg, trace, monkeypatch, "record")
    assert decisions(sched, False) == want
    counts = sched._bk_guard.counts()
    assert counts[site] > 0
    sites = {"schedule", "add_request"} if method == "_tk_view" else {site}
    assert set(counts) == sites
    # the run's verdict: FAIL, naming each site, its exception type and its exact count
    named = "; ".join(f"vLLM engine: bsrkv.vllm_ext [{s}] ValueError x{counts[s]}"
                      for s in sorted(sites))  # fmt: skip
    assert verdict_from_trace(before, trace) == ("FAIL", f"extension degraded to stock: {named}")


def test_an_engine_that_cannot_say_it_is_idle_still_writes_its_failures(
    cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trace goes to disk when the engine goes idle; a vLLM whose ``has_requests`` is
    gone has it written at that step anyway, the failure counted in the record written."""
    trace = tmp_path / "t.jsonl"
    before = process_failures()
    sched = build(scheduler.RecordingScheduler, cfg, trace, monkeypatch, "record")

    def gone() -> bool:
        raise AttributeError("'Scheduler' object has no attribute 'has_requests'")

    sched.has_requests = gone
    sched._bk_idle()
    assert verdict_from_trace(before, trace) == (
        "FAIL",
        "extension degraded to stock: vLLM engine: bsrkv.vllm_ext [record] AttributeError x1",
    )
