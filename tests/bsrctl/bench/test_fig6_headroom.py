"""Figure 6's headroom: flash idle while a request waited for its read, as interval
arithmetic (exact, and against a brute count on a grid) and from a cell's spans."""

from __future__ import annotations

from fig6.headroom import (
    Headroom,
    cell_headroom,
    headroom_lines,
    idle_while_waiting,
    length,
    merged,
)
from hypothesis import given
from hypothesis import strategies as st

from bsrctl.trace.timeline import Span, spans_of


def test_intervals_merge_and_measure() -> None:
    assert merged([(5, 7), (0, 2), (1, 3), (3, 4), (9, 9), (8, 6)]) == [(0, 4), (5, 7)]
    assert length([(0, 2), (1, 3), (5, 7)]) == 5
    # waits 0-10 and 12-14; reads 2-4, 3-6 and 9-13: idle 0-2, 6-9 and 13-14
    assert idle_while_waiting([(0, 10), (12, 14)], [(2, 4), (3, 6), (9, 13)]) == 6
    assert idle_while_waiting([(0, 10)], []) == 10
    assert idle_while_waiting([], [(0, 10)]) == 0
    assert idle_while_waiting([(0, 5)], [(0, 10)]) == 0


_iv = st.tuples(st.integers(0, 40), st.integers(0, 40)).map(lambda t: (min(t), max(t)))


@given(st.lists(_iv, max_size=8), st.lists(_iv, max_size=8))
def test_idle_while_waiting_is_the_grid_count(waiting, reading) -> None:
    def covered(t: int, ivs) -> bool:
        return any(a <= t < b for a, b in ivs)

    brute = sum(1 for t in range(40) if covered(t, waiting) and not covered(t, reading))
    got = idle_while_waiting(waiting, reading)
    assert got == brute
    assert length(waiting) - length(reading) <= got <= length(waiting)


def _rec(name: str, a_ms: int, b_ms: int, rid: str | None = None, pid: int = 1) -> dict:
    attrs = {"request_id": f"cmpl-{rid}-0"} if rid else {"op": 0}
    return {"name": name, "service": "x", "start_ns": a_ms * 10**6, "end_ns": b_ms * 10**6,
            "pid": pid, "attributes": attrs}  # fmt: skip


A, B, C = ("bsrq-" + x * 16 for x in "abc")


def _spans() -> list[Span]:
    return spans_of([
        # a: arrives at 1.0 s, its retrieve faults 1.1-1.5 s
        _rec("client.request", 1000, 3000, A), _rec("bsr.stock_retrieve", 1100, 1500, A),
        # b: arrives at 1.2 s, waits for a slot, retrieve 1.7-2.0 s
        _rec("client.request", 1200, 3000, B), _rec("bsr.stock_retrieve", 1700, 2000, B),
        # a staging of the TempoKV server (pid 7) at 1.5-1.6 s, and another process's
        _rec("tempokv.stage", 1500, 1600, pid=7), _rec("tempokv.stage", 1600, 1700, pid=8),
        # another cell's staging, after this one ended
        _rec("tempokv.stage", 5000, 6000, pid=7),
    ])  # fmt: skip


def test_a_cells_headroom_from_its_spans() -> None:
    spans = _spans()
    # waits 1.0-1.1 (a) and 1.2-1.7 (b); reads 1.1-1.5, 1.7-2.0: idle 1.0-1.1 and 1.5-1.7
    got = cell_headroom(spans, [A, B, C], frozenset())  # c: its spans were lost
    assert got is not None
    assert (round(got.span_s, 9), round(got.reading_s, 9), round(got.idle_wait_s, 9)) == (
        1.0, 0.7, 0.3)  # fmt: skip
    # a's last token at 3.0 s, 1.5 s after its retrieve; b's 1.0 s after its retrieve
    assert round(got.engine_s, 9) == 1.25
    assert round(got.reading_share, 9) == 0.7
    # the arm's own staging at 1.5-1.6 s fills a tenth; another process's, or a staging
    # outside the cell, fills nothing
    got = cell_headroom(spans, [A, B], frozenset({7}))
    assert got is not None
    assert (round(got.reading_s, 9), round(got.idle_wait_s, 9)) == (0.8, 0.2)
    assert cell_headroom(spans, [C], frozenset()) is None


def test_headroom_lines_are_medians_per_arm_and_rate() -> None:
    cells = [Headroom(8.0, 6.0, 0.1, 0.12), Headroom(8.0, 6.4, 0.3, 0.1),
             Headroom(10.0, 6.0, 0.2, 0.09)]  # fmt: skip
    got = headroom_lines({"lmcache-dax": {4.0: cells, 2.0: []}})
    assert got == [
        "headroom lmcache-dax @4 rps: flash read 75.0 % of the cell (6.00 of 8.00 s); flash "
        "idle while a request waited 0.200 s; engine after the KV is in 100 ms per request "
        "(medians of 3)"
    ]
