"""What a staging policy could still take off a cell's waits: the time some request had
arrived and its flash read had not begun while no flash read ran ("flash idle while
waiting"). Every arm reads the same bytes through the same throttle, so a policy can start
a read earlier only into that time: in the baseline arm it bounds what advance staging can
gain there, beyond reordering reads that overlap. Intervals are integer ns (the spans') or
float seconds (the simulation's)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from bsrctl.trace.timeline import CLIENT_REQUEST, Span, by_request
from fig6.cells import Cells

RETRIEVE, STAGE = "bsr.stock_retrieve", "tempokv.stage"

Interval = tuple[float, float]


def merged(intervals: Iterable[Interval]) -> list[Interval]:
    """The union as disjoint intervals in order; empty and reversed ones are dropped."""
    out: list[Interval] = []
    for a, b in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def length(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in merged(intervals))


def idle_while_waiting(waiting: Iterable[Interval], reading: Iterable[Interval]) -> float:
    """|∪waiting − ∪reading|: some request waits for its read and none runs."""
    w, r = merged(waiting), merged(reading)
    both, j = 0.0, 0
    for a, b in w:
        while j < len(r) and r[j][1] <= a:
            j += 1
        k = j
        while k < len(r) and r[k][0] < b:
            both += min(b, r[k][1]) - max(a, r[k][0])
            k += 1
    return length(w) - both


@dataclass(frozen=True)
class Headroom:
    """One cell: ``span_s`` from its first arrival to its last read's end, ``reading_s`` the
    union of its flash reads, ``idle_wait_s`` flash idle while a request waited, ``engine_s``
    the median time from a request's retrieve end to its last token (the engine's work once
    its KV is in: what a staging lead can overlap)."""

    span_s: float
    reading_s: float
    idle_wait_s: float
    engine_s: float

    @property
    def reading_share(self) -> float:
        return self.reading_s / self.span_s if self.span_s > 0 else 0.0


def cell_headroom(
    spans: Sequence[Span], request_ids: Sequence[str], stage_pids: frozenset[int]
) -> Headroom | None:
    """A cell's requests (the client's ids) wait from arrival to their first retrieve. Flash
    is read by the retrieves (LMCache-DAX's fault every page in) and by the stagings of the
    processes in ``stage_pids`` (TempoKV's; a staging span names no request) that overlap
    the cell. None when no request of it has both spans (a lost export)."""
    stages = [s for s in spans if s.name == STAGE]
    return _cell(by_request(spans), stages, request_ids, stage_pids)


def arm_headroom(
    spans: Sequence[Span],
    cells: Cells,
    rates: Sequence[float],
    arms: Sequence[str],
    pids: dict[int, str],
) -> dict[str, dict[float, list[Headroom]]]:
    """Per arm and rate, each repeat's cell (``pids``: every PID an arm launched, so its
    stagings are its own); the spans are grouped by request once for all cells."""
    mine, stages = by_request(spans), [s for s in spans if s.name == STAGE]
    out: dict[str, dict[float, list[Headroom]]] = {}
    for arm in arms:
        own = frozenset(p for p, a in pids.items() if a == arm)
        for rate in rates:
            got = [_cell(mine, stages, c[arm][rate].request_ids, own) for c in cells]
            out.setdefault(arm, {})[rate] = [h for h in got if h is not None]
    return out


def _cell(
    mine: Mapping[str, Sequence[Span]],
    stages: Sequence[Span],
    request_ids: Sequence[str],
    stage_pids: frozenset[int],
) -> Headroom | None:
    waiting: list[Interval] = []
    reading: list[Interval] = []
    engine: list[int] = []
    for rid in request_ids:
        ss = mine.get(rid, [])
        sent = [s for s in ss if s.name == CLIENT_REQUEST]
        ret = [s for s in ss if s.name == RETRIEVE]
        if not sent or not ret:
            continue
        waiting.append((min(s.start_ns for s in sent), min(s.start_ns for s in ret)))
        reading += [(s.start_ns, s.end_ns) for s in ret]
        engine.append(max(s.end_ns for s in sent) - max(s.end_ns for s in ret))
    if not waiting:
        return None
    t0, t1 = min(a for a, _ in waiting), max(b for _, b in reading)
    reading += [(max(s.start_ns, t0), min(s.end_ns, t1)) for s in stages
                if s.pid in stage_pids]  # fmt: skip
    return Headroom(
        (t1 - t0) / 1e9,
        length(reading) / 1e9,
        idle_while_waiting(waiting, reading) / 1e9,
        statistics.median(engine) / 1e9,
    )


def headroom_lines(got: dict[str, dict[float, list[Headroom]]]) -> list[str]:
    """Per arm and rate, medians over the repeats."""
    out = []
    for arm, by_rate in got.items():
        for rate, cells in by_rate.items():
            if not cells:
                continue
            med = {k: statistics.median(getattr(c, k) for c in cells)
                   for k in ("span_s", "reading_s", "idle_wait_s", "reading_share",
                             "engine_s")}  # fmt: skip
            out.append(
                f"headroom {arm} @{rate:g} rps: flash read {100 * med['reading_share']:.1f} % "
                f"of the cell ({med['reading_s']:.2f} of {med['span_s']:.2f} s); flash idle "
                f"while a request waited {med['idle_wait_s']:.3f} s; engine after the KV is in "
                f"{1000 * med['engine_s']:.0f} ms per request (medians of {len(cells)})"
            )
    return out
