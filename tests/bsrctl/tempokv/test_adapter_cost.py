"""The adapter's cost on vLLM's engine loop, read from its trace: exact sums and shares."""

from __future__ import annotations

import json
from pathlib import Path

from bsrctl.tempokv.experiments.adapter_cost import adapter_cost, read_trace

TRACE = [
    {"kind": "step", "scheduled": {}},
    {"kind": "step_time", "tokens": 1, "s": 0.010, "adapter_s": 0.001},
    {"kind": "step_time", "tokens": 9, "s": 0.030, "adapter_s": 0.003},
    {"kind": "update", "arrival": True, "acked": True, "ack_wait_s": 0.02},  # older traces
    {"kind": "update", "arrival": False},  # a post-step update waits for nothing
    {"kind": "update", "arrival": True},  # today's arrival: its wait is its arrival_ack's
    {"kind": "arrival_ack", "acked": True, "ack_wait_s": 0.005, "after_s": 0.007},
    {"kind": "step_time", "tokens": 4, "s": 0.020},  # before adapter_s existed: counted 0
    {"kind": "step_time", "tokens": 2, "s": 0.012, "adapter_s": 0.0004, "pass": "sent"},
    {"kind": "step_time", "tokens": 2, "s": 0.011, "adapter_s": 0.00002, "pass": "quiet"},
    {"kind": "step_time", "tokens": 2, "s": 0.011, "adapter_s": 0.00001, "pass": "quiet"},
]


def test_costs_are_summed_exactly() -> None:
    c = adapter_cost(TRACE)
    assert c["steps"] == {
        "n": 6, "p50_s": 0.0115, "p95_s": 0.0275, "max_s": 0.03, "total_s": 0.094
    }  # fmt: skip
    assert c["adapter_per_step"]["total_s"] == 0.00443 and c["adapter_per_step"]["n"] == 6
    assert c["arrival_ack_wait"] == {
        "n": 2, "p50_s": 0.0125, "p95_s": 0.01925, "max_s": 0.02, "total_s": 0.025
    }  # fmt: skip
    assert c["loop_share"] == round((0.00443 + 0.025) / 0.094, 6)
    # the passes that say what they did, split (the older records say nothing); 6 decimals
    assert c["adapter_by_pass"] == {
        "quiet": {"n": 2, "p50_s": 1.5e-05, "p95_s": 1.9e-05, "max_s": 2e-05, "total_s": 3e-05},
        "sent": {"n": 1, "p50_s": 0.0004, "p95_s": 0.0004, "max_s": 0.0004, "total_s": 0.0004},
    }


def test_no_trace_costs_nothing(tmp_path: Path) -> None:
    assert read_trace(tmp_path / "none.jsonl") == []
    c = adapter_cost([])
    assert c["loop_share"] == 0.0 and c["steps"]["n"] == 0
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in TRACE) + "\n")
    assert read_trace(path) == TRACE
