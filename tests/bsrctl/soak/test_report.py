"""summary.md of a soak run, from its evidence alone: the last line, each violation with its
request and fault, the faults as placed, the requests by prefix."""

from __future__ import annotations

from bsrctl.report import render

DOC = {
    "run_id": "br-soak-0123456789ab", "kind": "soak", "verdict": "FAIL", "complete": True,
    "started_at": "s", "finished_at": "f", "salt": "soak-cpu", "spec_sha256": "ab" * 32,
    "stack": {"kind": "serving"},
    "points": [
        {"id": "r0000", "verdict": "PASS", "params": {"prefix_tokens": 2048, "fault": None}},
        {"id": "r0001", "verdict": "FAIL", "params": {"prefix_tokens": 4000, "fault": 0}},
        {"id": "r0002", "verdict": "PASS", "params": {"prefix_tokens": 4000, "fault": 0}},
    ],
    "summary": {
        "seed": 1, "duration_s": 25.0,
        "line": "violations: 1; faults injected: 1; requests completed: 3",
        "violations": [{"kind": "fail_open", "detail": "request 1 (prefix 2): its restore failed",
                        "request": 1, "fault": 0}],
        "armed": [
            {"index": 0, "fault": "window-timeout", "window": 0, "prefix": 0, "start_s": 1.443,
             "armed_at_s": 4.9, "round": 1, "placed": True, "error": ""},
            {"index": 1, "fault": "object-corrupted", "window": 1, "prefix": 2, "start_s": 8.3,
             "armed_at_s": 9.1, "round": 2, "placed": False, "error": "StackFailed: no FS object"},
        ],
        "quiesced": {"markers": 0}, "pool_peak_max_bytes": 1048576, "pool_bound_bytes": 1048576,
        "checks": [{"name": "no_violations", "verdict": "FAIL", "detail": "violations: 1; ..."}],
    },
}  # fmt: skip


def test_the_summary_names_each_violation_and_each_fault_as_placed() -> None:
    md = render(DOC).splitlines()
    assert md[0] == "# br-soak-0123456789ab (soak): FAIL"
    assert "Seed 1, 25.0 s: violations: 1; faults injected: 1; requests completed: 3." in md
    assert "- fail_open: request 1 (prefix 2): its restore failed (request 1, fault 0)" in md
    assert "| 0 | window-timeout | 0 | 0 | 1.443 | 4.9 | 1 | yes |" in md
    assert "| 1 | object-corrupted | 1 | 2 | 8.3 | 9.1 | 2 | no: StackFailed: no FS object |" in md
    at = md.index("| prefix_tokens | verdict | requests |")
    assert md[at + 2 : at + 5] == [
        "| 2048 | PASS | 1 |",
        "| 4000 | FAIL | 1 |",
        "| 4000 | PASS | 1 |",
    ]
    assert "After the quiesce: {'markers': 0}; pool peak 1048576 B, bound 1048576 B." in md
    assert md[-1] == "- no_violations: FAIL: violations: 1; ..."
