"""What the runtime adapter cost vLLM's engine loop, from its trace: its own pass after
each schedule() (`step_time.adapter_s`: TTU projection and sends) and what each arrival's
claim held the loop waiting for the server's reply (`arrival_ack.ack_wait_s`; a trace from
before the wait moved to schedule() has it on the arrival's `update`), beside the measured
step times. The adapter
decides nothing, but it does take time on the loop that runs the engine. Its cost against
stock vLLM, side by side: ``adapter_arms`` (``bench/tempokv/adapter_cost.py``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bsrctl.tempokv.experiments.pooled import quantile


def _dist(xs: list[float]) -> dict[str, float | int]:
    return {
        "n": len(xs),
        "p50_s": round(quantile(xs, 0.5), 6) if xs else 0.0,
        "p95_s": round(quantile(xs, 0.95), 6) if xs else 0.0,
        "max_s": round(max(xs), 6) if xs else 0.0,
        "total_s": round(sum(xs), 6),
    }


def adapter_cost(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Sums and distributions; ``adapter_by_pass`` splits the step passes by what they did
    (``quiet``: no view; ``view``: a view, nothing sent; ``sent``: an update sent; traces
    from before the split have none of these)."""
    steps, adapter, acks = [], [], []
    by_pass: dict[str, list[float]] = {}
    for r in records:
        if r.get("kind") == "step_time":
            steps.append(float(r["s"]))
            adapter.append(float(r.get("adapter_s", 0.0)))
            if "pass" in r:
                by_pass.setdefault(str(r["pass"]), []).append(adapter[-1])
        elif r.get("kind") == "arrival_ack" or (
            r.get("kind") == "update" and r.get("arrival") and "ack_wait_s" in r
        ):
            acks.append(float(r["ack_wait_s"]))
    total_step = sum(steps)
    return {
        "steps": _dist(steps),
        "adapter_per_step": _dist(adapter),
        "adapter_by_pass": {k: _dist(v) for k, v in sorted(by_pass.items())},
        "arrival_ack_wait": _dist(acks),
        "loop_share": round((sum(adapter) + sum(acks)) / total_step, 6) if total_step else 0.0,
    }


def read_trace(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
