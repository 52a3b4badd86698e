"""The soak's checker over recorded values: a canonical answer in time is clean; each way a
request, the pool or the quiesce goes wrong is one violation naming its request and fault."""

from __future__ import annotations

from dataclasses import replace

from bsrctl.experiments.soak.checker import (
    Sent,
    Violation,
    pool_violations,
    quiesce_violations,
    request_violations,
    summary_line,
)

OK = Sent(index=7, round=2, prefix=1, sent_s=12.5, answer_s=1.25, output_sha256="a" * 64,
          cached_tokens=0, error="", fault=3)  # fmt: skip


def test_a_canonical_answer_within_its_deadline_is_clean() -> None:
    assert request_violations(OK, "a" * 64, 60.0) == []


def test_a_wrong_output_names_its_request_and_the_fault_armed() -> None:
    (v,) = request_violations(replace(OK, cached_tokens=2048), "b" * 64, 60.0)
    assert v == Violation(
        "wrong_output",
        f"request 7 (prefix 1): output {'a' * 16} is not the canonical {'b' * 16} "
        "(cached 2048 tokens)",
        7,
        3,
    )


def test_late_missing_and_failed_answers_are_violations() -> None:
    late = request_violations(replace(OK, answer_s=61.0), "a" * 64, 60.0)
    assert [(v.kind, v.detail) for v in late] == [
        ("deadline", "request 7 (prefix 1): answered after 61.0 s, deadline 60 s")
    ]
    hung = request_violations(replace(OK, answer_s=None, output_sha256=""), "a" * 64, 60.0)
    assert [(v.kind, v.detail) for v in hung] == [
        ("deadline", "request 7 (prefix 1): no answer, deadline 60 s")
    ]
    err = replace(OK, output_sha256="", error="StackFailed: HTTP 500")
    assert [(v.kind, v.request, v.fault) for v in request_violations(err, "a" * 64, 60.0)] == [
        ("error", 7, 3)
    ]


def test_every_sample_above_the_bound_is_one_violation() -> None:
    samples = [(1.0, 1048576), (2.0, 1048577), (3.0, 2097152)]
    got = pool_violations(samples, 1048576, lambda t: 4 if t >= 2.0 else None)
    assert [v.to_json() for v in got] == [
        {"kind": "pool_bound", "detail": "restore pool peak 1048577 B at 2.0 s > bound 1048576 B",
         "request": None, "fault": 4},
        {"kind": "pool_bound", "detail": "restore pool peak 2097152 B at 3.0 s > bound 1048576 B",
         "request": None, "fault": 4},
    ]  # fmt: skip


def test_anything_left_after_the_quiesce_is_named() -> None:
    clean = {"markers": 0, "budget_in_use_chunks": 0, "pool_level_bytes_by_rank": {0: 0},
             "tracked_requests": 0}  # fmt: skip
    assert quiesce_violations(clean) == []
    left = {**clean, "markers": 1, "pool_level_bytes_by_rank": {0: 262144, 1: 0}}
    assert [v.detail for v in quiesce_violations(left)] == [
        "force-local markers: 1",
        "restore pool bytes: 262144",
    ]
    assert [v.detail for v in quiesce_violations({**clean, "tracked_requests": None})] == [
        "tracked requests: unread"
    ]


def test_the_last_line() -> None:
    assert (
        summary_line([], 14, 120) == "violations: 0; faults injected: 14; requests completed: 120"
    )


def test_a_failed_restore_whose_blocks_vllm_used_is_fail_open() -> None:
    exposed = replace(OK, failed_restore="TIMEOUT", cached_tokens=2047)
    (v,) = request_violations(exposed, "a" * 64, 60.0)
    assert (v.kind, v.request, v.fault) == ("fail_open", 7, 3)
    assert v.detail == (
        "request 7 (prefix 1): its restore failed (TIMEOUT) yet vLLM used 2047 cached tokens "
        "(blocks never invalidated)"
    )
    assert request_violations(replace(exposed, cached_tokens=0), "a" * 64, 60.0) == []
