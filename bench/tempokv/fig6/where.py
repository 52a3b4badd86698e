"""Where Figure 6's time goes, from the run's own spans (``timeline.json``'s): per arm the
mean of each phase on its requests' critical paths, and per request of one cell its
retrieval timeline: when its retrieve started after it arrived, how long it was held for
committed staging (TempoKV's ``tempokv.hold``) and how long the retrieve itself took (on
the flash tier, LMCache-DAX's retrieve faults every page in from flash)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bsrctl.tempokv.experiments.pooled import quantile
from bsrctl.trace.timeline import (
    CLIENT_REQUEST,
    CLIENT_TTFT,
    Span,
    by_request,
    critical_path,
    phase_totals,
)

RETRIEVE, HOLD = "bsr.stock_retrieve", "tempokv.hold"


def arm_pids(run_dir: Path) -> dict[int, str]:
    """Every PID an arm's deployments launched (and their recorded children) -> the arm,
    from each ``r<k>-<arm>/stack/state.json``."""
    out: dict[int, str] = {}
    for d in sorted(run_dir.glob("r*-*")):
        state = d / "stack" / "state.json"
        if not state.is_file():
            continue
        arm = d.name.split("-", 1)[1]
        for part in json.loads(state.read_text()).get("launched", []):
            for pid in (part["pid"], *part.get("children", [])):
                out[pid] = arm
    return out


def where_ttft_went(
    spans: Sequence[Any], pids: dict[int, str]
) -> dict[str, tuple[int, float, dict[str, float]]]:
    """Per arm: (requests, mean TTFT ms, mean ms per phase) over the cells' streamed requests'
    critical paths (``trace.timeline``); a request is its servers' arm."""
    paths: dict[str, list[Any]] = {}
    for rid, mine in by_request(spans).items():
        arms = {pids[sp.pid] for sp in mine if sp.pid in pids}
        if len(arms) != 1 or not any(sp.name == CLIENT_TTFT for sp in mine):
            continue  # a seeding request (not streamed), or no server span of one arm
        path = critical_path(spans, rid)
        if path is not None:
            paths.setdefault(arms.pop(), []).append(path)
    return {
        arm: (len(ps), sum(p.ttft_ms for p in ps) / len(ps),
              {k: v / len(ps) for k, v in phase_totals(ps).items()})
        for arm, ps in sorted(paths.items())
    }  # fmt: skip


def ttft_lines(got: dict[str, tuple[int, float, dict[str, float]]], top: int = 6) -> list[str]:
    out = []
    for arm, (n, mean, phases) in got.items():
        parts = ", ".join(f"{k} {v:.0f}" for k, v in list(phases.items())[:top])
        out.append(f"where TTFT went, {arm}: {n} requests, mean {mean:.0f} ms: {parts} ms")
    return out


@dataclass(frozen=True)
class Row:
    """One request of a cell: seconds from the cell's first arrival (``arrival_s``), then
    from its own arrival: its first retrieve's start, the lookup held for staging, the
    retrieve's time, the first token. ``flash_wait_s``: hold + retrieve, what its retrieval
    waited on flash (staging it needed, or the faults of an on-demand retrieve)."""

    request: str
    arrival_s: float
    retrieve_start_s: float | None
    hold_s: float
    retrieve_s: float
    ttft_s: float | None

    @property
    def flash_wait_s(self) -> float:
        return self.hold_s + self.retrieve_s


def rows_of(spans: Sequence[Span], request_ids: Sequence[str]) -> list[Row]:
    """The cell's requests (the client's ids, arrival order) as rows; a request with no
    client span (lost export) is left out."""
    mine = by_request(spans)
    sent: dict[str, int] = {}
    for rid in request_ids:
        got = [s.start_ns for s in mine.get(rid, []) if s.name == CLIENT_REQUEST]
        if got:
            sent[rid] = min(got)
    if not sent:
        return []
    t0 = min(sent.values())
    out = []
    for rid in request_ids:
        if rid not in sent:
            continue
        ss, at = mine[rid], sent[rid]
        ret = [s for s in ss if s.name == RETRIEVE]
        ttft = [s.end_ns for s in ss if s.name == CLIENT_TTFT]
        out.append(Row(
            rid, (at - t0) / 1e9,
            (min(s.start_ns for s in ret) - at) / 1e9 if ret else None,
            sum(s.dur_ns for s in ss if s.name == HOLD) / 1e9,
            sum(s.dur_ns for s in ret) / 1e9,
            (min(ttft) - at) / 1e9 if ttft else None,
        ))  # fmt: skip
    return out


def _stat(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    return f"median {statistics.median(xs):.3f} p95 {quantile(xs, 0.95):.3f} max {max(xs):.3f}"


def timeline_lines(arm: str, rate: float, rows: Sequence[Row]) -> list[str]:
    """The summary of one arm's cell, then a line per request."""
    starts = [r.retrieve_start_s for r in rows if r.retrieve_start_s is not None]
    out = [
        f"timeline {arm} @{rate:g} rps ({len(rows)} requests): retrieve start after arrival "
        f"{_stat(starts)} s; held for staging {_stat([r.hold_s for r in rows])} s; "
        f"retrieve {_stat([r.retrieve_s for r in rows])} s; waited on flash "
        f"{_stat([r.flash_wait_s for r in rows])} s; TTFT "
        f"{_stat([r.ttft_s for r in rows if r.ttft_s is not None])} s",
        "| # | arrival s | retrieve start − arrival s | held s | retrieve s | waited on flash s "
        "| TTFT s |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows):
        start = "—" if r.retrieve_start_s is None else f"{r.retrieve_start_s:.3f}"
        ttft = "—" if r.ttft_s is None else f"{r.ttft_s:.3f}"
        out.append(f"| {i} | {r.arrival_s:.2f} | {start} | {r.hold_s:.3f} | {r.retrieve_s:.3f} "
                   f"| {r.flash_wait_s:.3f} | {ttft} |")  # fmt: skip
    return out
