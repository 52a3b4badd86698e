"""Check logic over recorded values: a closed, correct, explained cell PASSes; each way of
breaking the protocol turns exactly the check that should see it into FAIL."""

from __future__ import annotations

from dataclasses import replace

from bsrctl.evidence.verdict import Point, Verdict, check
from bsrctl.experiments.failmatrix.checks import Observation, serving_checks, table
from bsrctl.report.failmatrix import CHECK_ORDER, render

RID = "cmpl-1-0-a"
FAILED = {
    "request_id": RID,
    "ok": False,
    "failure": "TIMEOUT",
    "detail": "window 1 (chunks 4..8) not complete within 8.0s",
    "windows_done": 1,
    "bytes_restored": 1048576,
}


def recompute_obs(**kw) -> Observation:
    """As recorded by the window-timeout cell on the real stack."""
    base = Observation(
        expect="recompute",
        full_prefix_tokens=3840,
        cached_tokens=0,
        request_error="",
        request_finished=True,
        output_sha256="a" * 64,
        canonical_sha256="a" * 64,
        failed_outcomes=[FAILED],
        ok_outcomes=[],
        recovered_delta=1,
        lower_tier_reads=0,
        lower_tier_prefix_tokens=0,
        marker_events=[
            {"request_id": RID, "event": "set", "t": 1.0},
            {"request_id": RID, "event": "cleared_admitted", "t": 1.2},
        ],
        markers_active_after=0,
        lookups_delta={"lookups": 1, "lookups_probe_only": 1, "lookups_forced_local": 0},
        requests_sent=1,
        server_restarted=False,
        health_ok=True,
        health_detail="follow-up answered",
        request_s=11.2,
        cell_s=20.0,
        bound_s=120.0,
        leaked_pids=[],
        parts_alive={"vllm": True, "lmcache": True},
    )
    return replace(base, **kw)


def verdicts(o: Observation) -> dict[str, Verdict]:
    return {c.name: c.verdict for c in serving_checks(o)}


def failing(o: Observation) -> set[str]:
    return {n for n, v in verdicts(o).items() if v != Verdict.PASS}


def test_closed_correct_explained_cell_passes() -> None:
    assert failing(recompute_obs()) == set()
    only_some = {  # the checks of one fault each
        "corruption_caught_before_install",
        "one_failed_restore",
        "stopped_at_first_slow_window",
        "hits_after_new_store",  # the follow-ons of failmatrix.scenarios
        "bsr_restores_same_prefix",
        "later_requests_canonical",
        "all_answered",  # concurrent_restores' own
        "every_prefix_restored",
        "pool_bound",
        "extensions_healthy",  # the server's guards over the whole cell: added by run_cell
    }
    assert list(verdicts(recompute_obs())) == [n for n in CHECK_ORDER if n not in only_some]


def test_partial_prefix_fails_all_or_nothing() -> None:
    assert "cached_prefix_all_or_nothing" in failing(recompute_obs(cached_tokens=1024))


def test_skipped_invalidation_fails() -> None:
    # the module's restore failed, yet vLLM logged no recovery and exposed the full prefix
    o = recompute_obs(cached_tokens=3840, recovered_delta=0)
    assert {"no_valid_block_after_failure", "cached_prefix_all_or_nothing"} <= failing(o)


def test_non_canonical_output_fails_and_no_output_is_unknown() -> None:
    assert verdicts(recompute_obs(output_sha256="b" * 64))["canonical_output"] == Verdict.FAIL
    o = recompute_obs(output_sha256="", cached_tokens=None, request_error="StackFailed: x")
    assert verdicts(o)["canonical_output"] == Verdict.UNKNOWN


def test_missing_marker_and_repeated_lookup_fail_force_local() -> None:
    assert "force_local" in failing(recompute_obs(marker_events=[]))
    more = {"lookups": 2, "lookups_probe_only": 2, "lookups_forced_local": 0}
    assert "force_local" in failing(recompute_obs(lookups_delta=more))
    assert "force_local" in failing(recompute_obs(markers_active_after=1))
    never_cleared = [{"request_id": RID, "event": "set", "t": 1.0}]
    assert "force_local" in failing(recompute_obs(marker_events=never_cleared))


def test_forced_lookups_are_not_repeats() -> None:
    d = {"lookups": 2, "lookups_probe_only": 1, "lookups_forced_local": 1}
    assert failing(recompute_obs(lookups_delta=d)) == set()


def test_hang_leak_and_unhealthy_fail() -> None:
    assert "bounded_time" in failing(recompute_obs(request_finished=False, request_s=None))
    assert "bounded_time" in failing(recompute_obs(cell_s=121.0))
    assert "processes_accounted" in failing(recompute_obs(leaked_pids=[4242]))
    assert "processes_accounted" in failing(recompute_obs(parts_alive={"vllm": False}))
    assert "post_request_health" in failing(recompute_obs(health_ok=False))


def test_lower_tier_needs_full_prefix_from_that_tier() -> None:
    o = recompute_obs(
        expect="lower_tier", cached_tokens=3840, failed_outcomes=[], lower_tier_reads=15,
        lower_tier_prefix_tokens=3840,
        recovered_delta=0, marker_events=[],
    )  # fmt: skip
    assert failing(o) == set()
    assert "cached_prefix_all_or_nothing" in failing(replace(o, cached_tokens=3584))
    assert "cached_prefix_all_or_nothing" in failing(replace(o, lower_tier_reads=0))
    # setup verified the full prefix on the lower tier: serving only 8 chunks is a FAIL,
    # whatever the tier holds at request time
    short = replace(o, lower_tier_prefix_tokens=2048, cached_tokens=2048, lower_tier_reads=8)
    assert "cached_prefix_all_or_nothing" in failing(short)


def test_closed_accepts_full_or_zero_or_an_explicit_error_never_partial() -> None:
    ok_full = recompute_obs(expect="closed", cached_tokens=3840, failed_outcomes=[],
                            recovered_delta=0, marker_events=[])  # fmt: skip
    assert failing(ok_full) == set()
    assert "cached_prefix_all_or_nothing" in failing(replace(ok_full, cached_tokens=256))
    err = recompute_obs(expect="closed", cached_tokens=None, request_error="StackFailed: 500")
    assert verdicts(err)["cached_prefix_all_or_nothing"] == Verdict.PASS
    hung = replace(err, request_finished=False)
    assert verdicts(hung)["cached_prefix_all_or_nothing"] == Verdict.FAIL
    assert (
        verdicts(recompute_obs(cached_tokens=None, request_error="x"))[
            "cached_prefix_all_or_nothing"
        ]
        == Verdict.FAIL
    )  # recompute cells must answer


def test_killed_server_cell_judges_markers_on_the_restarted_server() -> None:
    o = recompute_obs(expect="closed", server_restarted=True, failed_outcomes=[],
                      recovered_delta=1, marker_events=[])  # fmt: skip
    assert failing(o) == set()
    assert "force_local" in failing(replace(o, markers_active_after=None))


def test_corruption_must_be_caught_before_install() -> None:
    missing = {**FAILED, "failure": "MISSING_KEY", "windows_done": 2}
    dmg = {"counter": "checksum_mismatch", "counter_delta": 1, "window": 2, "file": "x.data"}
    o = recompute_obs(failed_outcomes=[missing], damage=dmg)
    assert failing(o) == set()
    assert "corruption_caught_before_install" in failing(
        replace(o, damage={**dmg, "counter_delta": 0})
    )
    late = {**missing, "windows_done": 3}  # window k installed: bytes got in
    assert "corruption_caught_before_install" in failing(replace(o, failed_outcomes=[late]))


def test_table_renders_cells_by_checks_with_reasons() -> None:
    good = Point("good", {"fault": "window_timeout", "at": "during_window", "window": 1,
                          "expect": "recompute"},
                 {"time_to_fallback_s": 11.234, "cached_tokens": 0},
                 tuple(serving_checks(recompute_obs())))  # fmt: skip
    bad = Point("bad", {"fault": "object_corrupted", "at": "before_request", "expect": "recompute"},
                {"time_to_fallback_s": None, "cached_tokens": 1024},
                tuple(serving_checks(recompute_obs(cached_tokens=1024))))  # fmt: skip
    doc = {
        "run_id": "br-failmatrix-x", "verdict": "FAIL", "complete": True, "started_at": "s",
        "finished_at": "f", "salt": "s", "points": [good.to_json(), bad.to_json()],
        "summary": {"skipped_cells": ["c"]},
    }  # fmt: skip
    md = render(doc)
    assert "| good | window_timeout |  | during_window k=1 | recompute | PASS | 11.23 | 0 |" in md
    assert "| bad | object_corrupted |  | before_request | recompute | FAIL |  | 1024 |" in md
    # the public report a cell covers is its own column
    cov = {**good.to_json(), "id": "cov", "measures": {**good.measures, "covers": "vLLM #55297"}}
    assert "| cov | window_timeout | vLLM #55297 | during_window k=1 |" in render(
        {**doc, "points": [cov]}
    )
    assert "- bad / cached_prefix_all_or_nothing: FAIL: cached 1024 (full 3840); partial" in md
    assert "Cells not run on this stack: c" in md
    # a check the table does not know yet is a column, never dropped
    odd = Point("odd", good.params, good.measures, (*good.checks, check("new_check", True, "x")))
    md = render({**doc, "points": [odd.to_json()]})
    head = next(line for line in md.splitlines() if line.startswith("| cell |"))
    assert head.endswith("| bounded_time | processes_accounted | new_check |")
    row = next(line for line in md.splitlines() if line.startswith("| odd |"))
    assert row.endswith("| PASS | PASS | PASS |")
    assert table(doc["points"])["bad"]["cached_prefix_all_or_nothing"] == "FAIL"


def test_a_load_that_always_fails_ends_after_one_failed_restore() -> None:
    missing = {**FAILED, "failure": "MISSING_KEY", "windows_done": 0}
    o = recompute_obs(fault="load_fails_always", window=0, failed_outcomes=[missing])
    checks = {c.name: c for c in serving_checks(o)}
    assert checks["one_failed_restore"].verdict == Verdict.PASS
    assert checks["one_failed_restore"].detail == (
        "failed restores ['MISSING_KEY after 0 window(s)'], committed 0"
    )
    again = recompute_obs(fault="load_fails_always", failed_outcomes=[missing, missing])
    assert verdicts(again)["one_failed_restore"] == Verdict.FAIL  # retried: a loop
    assert (
        verdicts(recompute_obs(fault="load_fails_always", failed_outcomes=[]))["one_failed_restore"]
        == Verdict.FAIL
    )
    assert "one_failed_restore" not in verdicts(recompute_obs())  # other faults: no such check


def test_a_slow_tier_stops_the_restore_at_its_first_slow_window() -> None:
    o = recompute_obs(fault="slow_tier", window=1)  # TIMEOUT after 1 window
    assert verdicts(o)["stopped_at_first_slow_window"] == Verdict.PASS
    waited = {**FAILED, "windows_done": 2}  # window 1 waited on and installed: not closed at k
    assert verdicts(replace(o, failed_outcomes=[waited]))["stopped_at_first_slow_window"] == (
        Verdict.FAIL
    )
    missing = {**FAILED, "failure": "MISSING_KEY"}
    assert verdicts(replace(o, failed_outcomes=[missing]))["stopped_at_first_slow_window"] == (
        Verdict.FAIL
    )
