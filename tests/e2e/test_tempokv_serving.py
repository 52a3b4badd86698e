"""`bsrctl tempokv SPEC --stack serving` end to end on the CPU stack: one seeded workload,
every live policy on one shared stack (vLLM with the TempoKV adapter, LMCache with the
controller, shaped FS L2). The run must finish; every output is canonical and the pinned
bytes stay within the budget (per policy); C, p95 TTFT, throughput and the TTR errors are in
the evidence. The paper's two orderings are run-level checks, reported as they come out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e

SPEC = {
    "name": "serving-small",
    "seed": 5,
    "models": [{"name": "llama-3.1-8b"}],
    "serving": {
        "documents_tokens": [3072, 2048, 2560],
        "question_tokens": 32,
        "num_requests": 8,
        "interval_s": 0.08,
        "max_tokens": 32,
        "l2_bandwidth_mib_s": 16.0,
        "budget_mib": 6.0,
        "max_num_seqs": 1,
    },
    "experiment": {"kind": "policies", "cache_ratios": [1.0]},
}


def test_every_policy_on_the_serving_stack(tmp_path: Path, bsrctl) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    out = tmp_path / "runs"
    res = bsrctl("tempokv", str(spec), "--stack", "serving", "--out", str(out), "--quiet",
                 timeout=840)  # fmt: skip
    (run,) = out.iterdir()
    doc = json.loads((run / "evidence.json").read_text())
    assert doc["complete"], res.stderr[-3000:]
    points = {p["params"]["policy"]: p for p in doc["points"]}
    assert list(points) == [
        "demand", "immediate", "queue-1", "queue-4", "tempokv-static", "tempokv", "tempokv-u"
    ]  # fmt: skip
    assert doc["summary"]["skipped_policies"] == {"oracle": "needs the run's future: "
                                                  "simulation only"}  # fmt: skip
    for policy, p in points.items():
        checks = {c["name"]: c["verdict"] for c in p["checks"]}
        assert checks["canonical_output"] == "PASS", (policy, p["checks"])
        assert checks["protected_within_budget"] == "PASS", (policy, p["checks"])
        m = p["measures"]
        assert m["canonical"] == m["requests"] == 8
        assert m["peak_locked_bytes"] <= m["budget_bytes"]
    assert points["demand"]["measures"]["retrievals"]  # retrieval demand reached the controller
    assert points["immediate"]["measures"]["committed"] > 0
    assert points["immediate"]["measures"]["c_byte_s"] > 0
    assert points["tempokv"]["measures"]["ttr_error_s"]  # TTR vs stage-ready, per commitment
    names = {c["name"] for c in doc["summary"]["checks"]}
    assert names == {"c_below_immediate", "p95_below_demand"}
    assert (run / "summary.md").read_text().count("| tempokv |") == 1
