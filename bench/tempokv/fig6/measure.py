"""One cell measured from the client's results: p95 TTFT, output tok/s, canonical outputs,
goodput, the stock retrieves' times, the flash tier's counters; and its progress line."""

from __future__ import annotations

import math
from typing import Any

from bsrctl.tempokv.experiments.serving import _p95
from bsrctl.tempokv.serving_workload import goodput
from fig6.cells import Cell

SLOW_RETRIEVE_S = 0.1  # a retrieve this long is counted slow (the two modes: ms vs 0.24+ s)


def measure(
    res: list[Any], canonical: list[tuple[int, ...]], slo: float | None, controller: str,
    retrieves: tuple[float, ...], tier: dict[str, Any] | None,
) -> Cell:  # fmt: skip
    done = [r for r in res if r is not None]
    ttfts = [r.first_token_s - r.sent_s for r in done]
    span = max(r.done_s for r in done) - min(r.sent_s for r in done) if done else 0.0
    toks = sum(len(r.output_token_ids) for r in done)
    same = sum(
        r is not None and r.output_token_ids == c for r, c in zip(res, canonical, strict=True)
    )
    good = math.nan
    if slo is not None:
        all_ttfts = [None if r is None else r.first_token_s - r.sent_s for r in res]
        good = goodput(all_ttfts, slo, span).share
    ids = tuple(getattr(r, "request_id", "") for r in res if r is not None)
    return Cell(_p95(ttfts), toks / span if span > 0 else math.nan, same, len(res), controller,
                good, retrieves, ids, tier)  # fmt: skip


def cell_line(rep: int, arm: str, rate: float, cell: Cell, slo: bool) -> str:
    slow = [x for x in cell.retrieves_s if x > SLOW_RETRIEVE_S]
    rs = cell.retrieves_s
    flash_read = (
        f" | flash read {cell.tier['flash_read_bytes'] / 2**20:.1f} MiB" if cell.tier else ""
    )
    if cell.tier and "host" in cell.tier:
        h = cell.tier["host"]
        flash_read += f" | host CPU busy {100 * h['cpu_busy']:.0f} %, load {h['loadavg_1m']:.1f}"
    return (
        f"repeat {rep} {arm:11} rate {rate:g} rps: p95 TTFT {cell.p95_s:.3f}s "
        f"{cell.tok_s:.1f} tok/s {cell.canonical}/{cell.requests} canonical"
        + (f" goodput {cell.goodput:.2f}" if slo else "")
        + f" | retrieves {len(rs)} ({sum(rs):.2f} s), {len(slow)} over {SLOW_RETRIEVE_S} s"
        + (f" ({min(slow):.2f}-{max(slow):.2f} s)" if slow else "")
        + flash_read
        + (f" | {cell.controller}" if cell.controller else "")
    )
