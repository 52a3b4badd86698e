"""Which restore outcomes belong to the request sent between two ``bsr.status`` reads: the
records whose (request id, rank) the first read did not hold, whatever the counters say."""

from __future__ import annotations

from bsrctl.stack.contracts.bsr_client import outcomes_since
from bsrkv.lmcache_ext.bsr.protocol import RestoreOutcomeSummary


def rec(rid: str, rank: int, ok: bool = True) -> RestoreOutcomeSummary:
    return RestoreOutcomeSummary(
        request_id=rid,
        rank=rank,
        mode="bsr",
        ok=ok,
        start_token=0,
        end_token=256,
        restore_s=0.01,
        failure="NONE" if ok else "MISSING_KEY",
        detail="" if ok else "window 0: key missing",
        cached_chunks=1 if ok else 0,
        windows_done=1 if ok else 0,
        bytes_restored=262_144 if ok else 0,
        peak_staged_bytes_by_rank={rank: 262_144},
    )


def test_the_new_requests_outcomes_one_per_rank_in_server_order() -> None:
    before = [rec("a", 0), rec("a", 1)]
    after = [*before, rec("b", 1, ok=False), rec("b", 0)]
    assert outcomes_since(before, after) == [rec("b", 1, ok=False), rec("b", 0)]


def test_a_refused_retrieve_leaves_no_record_and_takes_no_earlier_one() -> None:
    # `retrieves` moved by 2 (one refused before any restore, no record): a counter delta
    # would have taken a's outcome as well
    before = [rec("a", 0)]
    after = [rec("a", 0), rec("b", 0)]
    assert outcomes_since(before, after) == [rec("b", 0)]


def test_records_that_rolled_out_of_the_servers_window_do_not_matter() -> None:
    before = [rec(f"r{i}", 0) for i in range(64)]
    after = [*before[2:], rec("x", 0), rec("y", 0)]
    assert outcomes_since(before, after) == [rec("x", 0), rec("y", 0)]


def test_nothing_new_and_nothing_before() -> None:
    assert outcomes_since([rec("a", 0)], [rec("a", 0)]) == []
    assert outcomes_since([], []) == []
    assert outcomes_since([], [rec("a", 0), rec("a", 1)]) == [rec("a", 0), rec("a", 1)]
