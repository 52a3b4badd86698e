"""The runtime adapter does not change scheduling: the same requests through real vLLM (tiny
model, CPU, offline) with the stock scheduler (decisions recorded) and with the TempoKV
adapter give the same request order and tokens at every step, and the same outputs; the
adapter really ran (claims and TTU updates sent, no adapter errors)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bsrctl.stack.launch import tinymodel
from bsrctl.stack.launch.serving.vllm_cache import vllm_cache_root
from bsrkv.tempokv import wire
from bsrkv.tempokv.live import AdapterSettings
from bsrkv.tempokv.ttu import CostModel

pytestmark = pytest.mark.process

HERE = Path(__file__).parent


def run(
    tmp: Path, model: Path, cls: str, adapter: AdapterSettings | None
) -> tuple[list[dict], dict, list]:
    trace = tmp / f"{cls.rsplit('.', 1)[1]}.jsonl"
    out = tmp / f"{cls.rsplit('.', 1)[1]}.json"
    cfg = wire.AdapterEnv(adapter, "record", str(trace))  # the wire the launch writes
    env = {
        **os.environ,
        "BSRKV_TEMPOKV": json.dumps(cfg.to_json()),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(vllm_cache_root(tmp / "vllm-cache")),
        "VLLM_HOST_IP": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    proc = subprocess.run(
        [sys.executable, str(HERE / "onoff_driver.py"), str(model), cls, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    steps = [_plain(r) for r in records if r["kind"] == "step"]
    outputs = {_rid(k): v for k, v in json.loads(out.read_text()).items()}
    return steps, outputs, records


def _rid(req_id: str) -> str:
    """vLLM's offline ids are "<index>-<random>": the index names the request."""
    return req_id.split("-", 1)[0]


def _plain(step: dict) -> dict:
    return {
        "scheduled": [[_rid(k), n] for k, n in step["scheduled"].items()],
        "new": [_rid(r) for r in step["new"]],
        "finished": sorted(_rid(r) for r in step["finished"]),
    }


@pytest.mark.parametrize(
    ("off_cls", "on_cls"),
    [
        ("RecordingScheduler", "TempoKVScheduler"),
        ("RecordingAsyncScheduler", "TempoKVAsyncScheduler"),  # the GPU default's class
    ],
)
def test_adapter_on_and_off_decide_the_same(tmp_path: Path, off_cls: str, on_cls: str) -> None:
    model = tinymodel.build()
    adapter = AdapterSettings(
        k=2,
        needs_ttu=True,
        ttu_tolerance_s=0.0,  # send on every change: the most work the adapter can do
        output_limit_tokens=12,
        chunk_tokens=256,
        kv_bytes_per_token=tinymodel.TinyModelRecipe().kv_bytes_per_token(),
        cost=CostModel(0.005, 2e-5, 0.0, 0.0),
    )
    off_steps, off_out, _ = run(tmp_path, model, f"bsrkv.vllm_ext.scheduler.{off_cls}", None)
    on_steps, on_out, records = run(tmp_path, model, f"bsrkv.vllm_ext.scheduler.{on_cls}", adapter)
    assert len(off_steps) > 10  # chunked prefill over several steps, a queue behind 2 slots
    assert on_steps == off_steps  # same request order and token counts at every step
    assert on_out == off_out
    assert [len(on_out[str(i)]) for i in range(6)] == [3, 9, 5, 12, 4, 7]
    updates = [r for r in records if r["kind"] == "update"]
    assert [r for r in records if r["kind"] == "adapter_error"] == []
    reported = [_rid(rid) for u in updates for rid in u["report"]]
    # every request claimed exactly once: 0 and 1 at arrival (the first K=2 waiting, all
    # six are queued before the first step), the others when a step leaves them at the head
    assert sorted(reported) == [str(i) for i in range(6)]
    arrivals = [u for u in updates if u.get("arrival")]
    assert [_rid(r) for u in arrivals for r in u["report"]] == ["0", "1"]
    assert len(arrivals) == 6
    # each claim's reply settled once, before the first schedule() (slots free: it may look
    # them up); the record transport answers at once: the wait is two clock reads
    acks = [r for r in records if r["kind"] == "arrival_ack"]
    assert [r["acked"] for r in acks] == [True, True]
    assert all(r["ack_wait_s"] < 0.01 for r in acks)
    first_step = next(i for i, r in enumerate(records) if r["kind"] == "step")
    assert all(records.index(r) < first_step for r in acks)
    assert all(set(u["hits"]) == set(u["report"]) for u in updates if u["report"])
    # the trace keeps each hit's token count (whole chunks), never the ids themselves
    hits = [h for u in updates for h in u["hits"].values()]
    assert hits and all("token_ids" not in h and h["tokens"] % 256 == 0 for h in hits)
    assert any(u["ttus_s"] for u in updates)  # TTUs were projected and sent
    assert len(updates) < len(on_steps) + len(on_out)  # only on change, not every step
    # every measured step carries the adapter's own cost on the engine loop
    timed = [r for r in records if r["kind"] == "step_time"]
    assert len(timed) == len(on_steps)
    assert all(r["adapter_s"] >= 0.0 and r["s"] >= 0.0 for r in timed)
    assert any(r["adapter_s"] > 0.0 for r in timed)
    # each pass says what it did; an update sent is one of the trace's updates
    assert {r["pass"] for r in timed} <= {"quiet", "view", "sent"}
    sent = sum(r["pass"] == "sent" for r in timed)
    assert 0 < sent == len([u for u in updates if not u.get("arrival") and not u["cancel"]])
    # and when its output came, in order, and whether it continued a request of the step
    # before it (the loop cannot have idled between them)
    done = [r["done_s"] for r in timed]
    assert done == sorted(done) and isinstance(timed[0]["busy"], bool)
    assert not timed[0]["busy"] and any(r["busy"] for r in timed)
